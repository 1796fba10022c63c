/** SFT warmup on tool-calling conversations made from GSM8K's calculator annotations.
 *  npx tsx scripts/train-sft.ts --preset tiny        (offline, minutes on a CPU)
 *  npx tsx scripts/train-sft.ts --model_path Qwen/Qwen2.5-0.5B --dataset gsm8k */
import { superviseSelf } from "../src/shutdown.ts";

// The trainer runs in a child process this one supervises, so Ctrl-C is answered at once even while
// a kernel keeps the trainer busy (src/shutdown.ts). Only the child loads the training code.
await superviseSelf();
const { shutdownCalculator } = await import("../src/agents/calculator.ts");
const { runMain } = await import("../src/cli.ts");
const { TINY_SFT } = await import("../src/presets/tiny.ts");
const { parseFlags } = await import("../src/run/flags.ts");
const { SFT_FLAGS, sftCommand } = await import("../src/run/sft-flags.ts");
const { runSft } = await import("../src/run/sft-run.ts");

await runMain(async () => {
  const { o } = parseFlags(sftCommand(), SFT_FLAGS, process.argv, { tiny: TINY_SFT });
  try {
    const r = await runSft(o);
    process.stdout.write(`sft done: ${r.steps} steps, final loss ${r.finalLoss.toFixed(4)}, ${r.seconds.toFixed(0)} s → ${r.finalDir}\n`);
  } finally {
    await shutdownCalculator();
  }
});
