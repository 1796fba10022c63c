/** SFT warmup on tool-calling conversations made from GSM8K's calculator annotations.
 *  npx tsx scripts/train-sft.ts --preset tiny        (offline, minutes on a CPU)
 *  npx tsx scripts/train-sft.ts --model_path Qwen/Qwen2.5-0.5B --dataset gsm8k */
import { superviseSelf } from "../src/shutdown.ts";

// The trainer runs in a child process this one supervises, so Ctrl-C is answered at once even while
// a kernel keeps the trainer busy (src/shutdown.ts). Only the child loads the training code.
await superviseSelf();
const { parseFloatArg, parseIntArg, parseList, runMain } = await import("../src/cli.ts");
const { INLINE_OPS } = await import("../src/datasets/sft.ts");
const { TINY_SFT, TINY_PROBLEMS } = await import("../src/presets/tiny.ts");
const { defaultOutputDir, loraTargets, parseWithPreset, trainingCommand } = await import("../src/run/options.ts");
const { runSft } = await import("../src/run/sft-run.ts");

const program = trainingCommand("train-sft", "Supervised warmup: teach the tool-calling format from GSM8K's calculator annotations", {
  quantize: "none", lr: 2e-4, scheduler: "cosine", warmupRatio: 0.05,
})
  .option("--dataset <name|path>", "gsm8k (local HF cache or hub), synthetic, or a GSM8K-format .jsonl/.parquet path", "gsm8k")
  .option("--max_samples <n>", "use at most this many training examples (default: all; synthetic: 5000)", parseIntArg("max_samples", 1))
  .option("--num_epochs <n>", "passes over the training conversations", parseIntArg("num_epochs", 1), 1)
  .option("--batch_size <n>", "conversations per micro-batch", parseIntArg("batch_size", 1), 8)
  .option("--gradient_accumulation_steps <n>", "micro-batches per optimizer step", parseIntArg("gradient_accumulation_steps", 1), 1)
  .option("--max_length <n>", "drop conversations longer than this many tokens (counted in the log)", parseIntArg("max_length", 8), 1024)
  .option("--inline_share <p>", "share of calculator steps written as plain text with the result inline (as GSM8K's text reads) instead of a tool call", parseFloatArg("inline_share", 0, 1), 0)
  .option("--inline_ops <ops>", "with --inline_share: only steps whose operators are all in this list, e.g. +,-", parseList("inline_ops", INLINE_OPS))
  .option("--full", "train every weight instead of a LoRA adapter (f32 base only; for small models)", false)
  .option("--eval_samples <n>", "held-out questions for the final evaluation (0: skip)", parseIntArg("eval_samples", 0), 100)
  .option("--eval_max_new_tokens <n>", "token budget per evaluation rollout", parseIntArg("eval_max_new_tokens", 1), 512)
  .option("--max_turns <n>", "assistant turns per evaluation rollout", parseIntArg("max_turns", 1), 8)
  .option("--save_steps <n>", "checkpoint every N steps (0: final model only)", parseIntArg("save_steps", 0), 0)
  .option("--output_dir <dir>", "run folder (default outputs/<model>/sft)")
  .option("--overwrite", "replace a run already in --output_dir", false)
  .option("--resume", "continue (or finish) the run in --output_dir from its latest checkpoint", false);

await runMain(async () => {
  const { o } = parseWithPreset(program, process.argv, { tiny: TINY_SFT });
  const r = await runSft({
    modelPath: o.model_path,
    dataset: o.dataset,
    synthetic: o.preset === "tiny" ? TINY_PROBLEMS : undefined,
    maxSamples: o.max_samples,
    numEpochs: o.num_epochs,
    batchSize: o.batch_size,
    gradientAccumulationSteps: o.gradient_accumulation_steps,
    learningRate: o.learning_rate,
    lrScheduler: o.lr_scheduler,
    warmupRatio: o.warmup_ratio,
    weightDecay: o.weight_decay,
    maxGradNorm: o.max_grad_norm,
    maxLength: o.max_length,
    inlineShare: o.inline_share,
    inlineOps: o.inline_ops,
    loraR: o.lora_r,
    loraAlpha: o.lora_alpha,
    loraDropout: o.lora_dropout,
    loraTargets: loraTargets(o.lora_targets),
    quantize: o.quantize,
    full: o.full,
    toolsInPrompt: o.tools_in_prompt,
    evalSamples: o.eval_samples,
    evalMaxNewTokens: o.eval_max_new_tokens,
    maxTurns: o.max_turns,
    saveSteps: o.save_steps,
    seed: o.seed,
    outputDir: o.output_dir ?? defaultOutputDir(o.model_path, "sft"),
    backend: o.backend,
    threads: o.threads,
    unpackBase: o.unpack_base,
    overwrite: o.overwrite,
    resume: o.resume,
  });
  process.stdout.write(`sft done: ${r.steps} steps, final loss ${r.finalLoss.toFixed(4)}, ${r.seconds.toFixed(0)} s → ${r.finalDir}\n`);
});
