/** Evaluate checkpoints on held-out GSM8K-format questions or a task file, with the --tools tools, or
 *  on the episodes of an AgentGym environment server (--env):
 *    npx tsx scripts/eval.ts --model_path Qwen/Qwen2.5-0.5B --adapter outputs/grpo/final --baseline Qwen/Qwen2.5-0.5B
 *    npx tsx scripts/eval.ts --preset tiny        # base vs SFT vs RL of the offline tiny pipeline
 *    npx tsx scripts/eval.ts --model_path outputs/tiny/guess/final --quantize nf4 --env http://127.0.0.1:36001
 *  Writes eval.json, samples-<model>.jsonl and report.html into --output_dir. */
import { runMain } from "../src/run/cli.ts";
import { parseEvalArgs, runEval } from "../src/run/eval-run.ts";

await runMain(async () => {
  await runEval(await parseEvalArgs(process.argv));
});
