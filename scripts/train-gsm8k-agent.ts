/** GRPO for the calculator agent: grouped multi-turn rollouts with real tool calls, rewards,
 *  group-relative advantages, LoRA updates on a quantized frozen base.
 *  npx tsx scripts/train-gsm8k-agent.ts --preset tiny           (starts from the tiny SFT output)
 *  npx tsx scripts/train-gsm8k-agent.ts --model_path outputs/Qwen2.5-0.5B/sft/final --dataset gsm8k */
import { superviseSelf } from "../src/shutdown.ts";

// The trainer runs in a child process this one supervises, so Ctrl-C is answered at once even while
// a kernel keeps the trainer busy (src/shutdown.ts). Only the child loads the training code.
await superviseSelf();
const { shutdownCalculator } = await import("../src/agents/calculator.ts");
const { runMain } = await import("../src/cli.ts");
const { TINY_GRPO } = await import("../src/presets/tiny.ts");
const { parseFlags } = await import("../src/run/flags.ts");
const { GRPO_FLAGS, grpoCommand } = await import("../src/run/grpo-flags.ts");
const { runGrpo } = await import("../src/run/grpo-run.ts");

await runMain(async () => {
  const { o } = parseFlags(grpoCommand(), GRPO_FLAGS, process.argv, { tiny: TINY_GRPO });
  try {
    const r = await runGrpo(o);
    process.stdout.write(`grpo done: ${r.steps} steps, ${r.seconds.toFixed(0)} s → ${r.finalDir}\n`);
  } finally {
    await shutdownCalculator();
  }
});
