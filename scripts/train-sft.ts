/** SFT warmup on tool-calling conversations made from GSM8K's calculator annotations.
 *  npx tsx scripts/train-sft.ts --preset tiny        (offline, minutes on a CPU)
 *  npx tsx scripts/train-sft.ts --model_path Qwen/Qwen2.5-0.5B --dataset gsm8k */
import { superviseSelf } from "../src/run/shutdown.ts";

// The trainer runs in a child process this one supervises, so Ctrl-C is answered at once even while
// a kernel keeps the trainer busy (src/run/shutdown.ts). Only the child loads the training code.
await superviseSelf();
const { runMain } = await import("../src/run/cli.ts");
const { parseSftArgs } = await import("../src/run/sft-flags.ts");
const { runSft } = await import("../src/run/sft-run.ts");

await runMain(async () => {
  const r = await runSft(parseSftArgs(process.argv));
  process.stdout.write(`sft done: ${r.steps} steps, final loss ${r.finalLoss.toFixed(4)}, ${r.seconds.toFixed(0)} s → ${r.finalDir}\n`);
});
