/** GRPO for the calculator agent: grouped multi-turn rollouts with real tool calls, rewards,
 *  group-relative advantages, LoRA updates on a quantized frozen base.
 *  npx tsx scripts/train-gsm8k-agent.ts --preset tiny           (starts from the tiny SFT output)
 *  npx tsx scripts/train-gsm8k-agent.ts --model_path outputs/Qwen2.5-0.5B/sft/final --dataset gsm8k */
import { superviseSelf } from "../src/run/shutdown.ts";

// The trainer runs in a child process this one supervises, so Ctrl-C is answered at once even while
// a kernel keeps the trainer busy (src/run/shutdown.ts). Only the child loads the training code.
await superviseSelf();
const { runMain } = await import("../src/run/cli.ts");
const { parseGrpoArgs } = await import("../src/run/grpo-flags.ts");
const { runGrpo } = await import("../src/run/grpo-run.ts");

await runMain(async () => {
  const r = await runGrpo(parseGrpoArgs(process.argv));
  process.stdout.write(`grpo done: ${r.steps} steps, ${r.seconds.toFixed(0)} s → ${r.finalDir}\n`);
});
