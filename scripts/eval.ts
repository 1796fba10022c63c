/** Evaluate checkpoints on held-out GSM8K-format questions or a task file, with the --tools tools:
 *    npx tsx scripts/eval.ts --model_path Qwen/Qwen2.5-0.5B --adapter outputs/grpo/final --baseline Qwen/Qwen2.5-0.5B
 *    npx tsx scripts/eval.ts --preset tiny        # base vs SFT vs RL of the offline tiny pipeline
 *  Writes eval.json, samples-<model>.jsonl and report.html into --output_dir. */
import { runMain } from "../src/cli.ts";
import { parseEvalArgs, runEval } from "../src/run/eval-run.ts";

await runMain(async () => {
  await runEval(await parseEvalArgs(process.argv));
});
