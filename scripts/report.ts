/** Write report.html again for one or more run folders (SFT, GRPO or eval) from their logs:
 *    npx tsx scripts/report.ts outputs/tiny/sft outputs/tiny/grpo outputs/tiny/eval */
import { Command } from "commander";
import { runMain, UsageError } from "../src/cli.ts";
import { rewriteRunReport } from "../src/run/report-run.ts";

const program = new Command()
  .name("report")
  .description("Write report.html again from a run folder's metrics.jsonl, trajectories.jsonl, eval.json and samples-*.jsonl")
  .argument("<run_dir...>", "folders written by train-sft, train-gsm8k-agent or eval")
  .exitOverride()
  .configureOutput({ outputError: () => {} });

await runMain(async () => {
  try {
    program.parse(process.argv);
  } catch (err) {
    if ((err as { code?: string }).code === "commander.helpDisplayed") return;
    throw new UsageError((err as Error).message.replace(/^error: /, ""));
  }
  for (const dir of program.args) process.stdout.write(`${await rewriteRunReport(dir)}\n`);
});
