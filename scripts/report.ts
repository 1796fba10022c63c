/** Write report.html again for one or more run folders (SFT, GRPO or eval) from their logs:
 *    npx tsx scripts/report.ts outputs/tiny/sft outputs/tiny/grpo outputs/tiny/eval */
import { Command } from "commander";
import { runMain } from "../src/run/cli.ts";
import { parseWithPreset } from "../src/run/options.ts";
import { rewriteRunReport } from "../src/run/report-run.ts";

const program = new Command()
  .name("report")
  .description("Write report.html again from a run folder's metrics.jsonl, trajectories.jsonl, eval.json and samples-*.jsonl")
  .argument("<run_dir...>", "folders written by train-sft, train-gsm8k-agent or eval")
  .exitOverride()
  .configureOutput({ outputError: () => {} });

await runMain(async () => {
  parseWithPreset(program, process.argv, {}); // commander errors → one-line usage error, --help exits 0
  for (const dir of program.args) process.stdout.write(`${await rewriteRunReport(dir)}\n`);
});
