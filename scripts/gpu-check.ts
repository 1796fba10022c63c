/** npm run gpu-check — what this machine's GPU does with the trainer, in one run of a few minutes: the
 *  WebGPU adapter and its limits, the golden parity subset on webgpu (vitest, CI=true), the small
 *  bench, and one GRPO step of the 0.5B's shape (random weights, NF4 base, LoRA r16 on all modules,
 *  4 questions × 8 rollouts × 256 new tokens after prompts of 220 tokens; advantages ±1, as random
 *  weights earn no reward), rollouts (on the compiled decoder, as runs on webgpu take them, and on
 *  tfjs' op-by-op path beside it) and update timed apart, then greedy decode steps of both decoders
 *  at the step's batch, 2× and 8× it (what more rollouts per step cost); the adapter's features and
 *  limits; one JSON record in --out.
 *  The update's micro-batches are sized by `--micro_batch_size auto`; the record has the update by part
 *  (forward, recomputation, backward, optimizer), the micro-batch chosen and the device memory's peak.
 *  `--config 1.5b | 3b | 7b` (Qwen2.5's shapes) runs only the step's update, on random completions of
 *  its length: which model trains on which GPU, and how fast.
 *  A software adapter measures nothing a GPU would: it is refused unless given
 *  `--allow-software --config small` (CI runs that form, with a short step, so the script cannot rot).
 *  Leaves out: the real tokenizer and GSM8K prompts (synthetic token ids of the same lengths). */
import { Command } from "commander";
import { spawnSync } from "node:child_process";
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { initBackend } from "../src/kernels/backend.ts";
import { registerWebgpu, resetWebgpuPeak, webgpuMemory } from "../src/kernels/webgpu/device.ts";
import { createModel } from "../src/model/load.ts";
import { LORA_TARGETS } from "../src/model/types.ts";
import { runMain } from "../src/run/cli.ts";
import type { GrpoSeconds } from "../src/trainer/grpo.ts";
import { UsageError } from "../src/util/errors.ts";
import { writeFileAtomic } from "../src/util/fs.ts";
import { benchContext, BENCH_CONFIGS, SIZE_CONFIGS, tokenBatch, WORKLOADS, type Measurement } from "./lib/bench.ts";
import { formatBreakdown } from "./lib/breakdown.ts";
import { decodeScaling, GRPO_SHAPES, grpoShape } from "./lib/grpo-shape.ts";
import { compiledDecodeScaling } from "./lib/bench-decoder.ts";
import { Decoder } from "../src/kernels/webgpu/decode/decoder.ts";

const defaults = { config: "0.5b", out: "outputs/gpu-check.json", allowSoftware: false, llama: true };
const opts = new Command("gpu-check")
  .description("Adapter, parity subset, small bench and one GRPO step on the webgpu backend; one JSON record")
  .option(
    "--config <name>",
    "shape of the GRPO step: 0.5b | small, or 1.5b | 3b | 7b (Qwen2.5's shapes: the update alone, its time and peak memory)",
    defaults.config,
  )
  .option("--out <file>", "where the JSON record is written", defaults.out)
  .option("--allow-software", "run on a software adapter (only with --config small: checks the script, measures nothing)", false)
  .option("--no-llama", "skip the step's rollouts on llama.cpp (--rollout_engine llama) at its batch and 8× it")
  .parse()
  .opts<typeof defaults>();

/** The parity subset: the golden suite and the held-out Qwen2 variant against PyTorch, on webgpu. */
const PARITY = ["test/kernels/webgpu/parity.test.ts", "test/kernels/webgpu/variant.test.ts"];
const now = () => performance.now() / 1000;

await runMain(async () => {
  const t0 = now();
  if (!(opts.config in GRPO_SHAPES))
    throw new UsageError(`--config must be one of ${Object.keys(GRPO_SHAPES).join(", ")}, got "${opts.config}"`);
  const sizeOnly = opts.config in SIZE_CONFIGS;
  const probe = await registerWebgpu(false);
  if (!probe.ok) throw new UsageError(`gpu-check: ${probe.reason}`);
  const { info } = probe;
  if (info.fallback && !(opts.allowSoftware && opts.config === "small"))
    throw new UsageError(
      `gpu-check: only a software adapter (${info.description}); it measures nothing a GPU would. To check the script itself: npm run gpu-check -- --allow-software --config small`,
    );
  await initBackend("webgpu");
  console.log(`adapter: ${info.description}${info.fallback ? " (software)" : ""}`);
  console.log(`limits: ${JSON.stringify(info.limits)}`);
  console.log(
    `features: ${info.features.join(", ") || "none"} (shader-f16 ${info.features.includes("shader-f16") ? "yes" : "no"}, subgroups ${info.features.includes("subgroups") ? "yes" : "no"})`,
  );

  if (sizeOnly) {
    await sizeCheck(info);
    return;
  }
  // 1. parity: a child vitest on the same adapter (Dawn's options and the adapter's env pass through)
  const tp = now();
  const vt = spawnSync("npx", ["vitest", "run", ...PARITY], { env: { ...process.env, CI: "true" }, encoding: "utf8", stdio: "pipe" });
  const parity = { files: PARITY, passed: vt.status === 0, seconds: round(now() - tp) };
  console.log(`parity subset: ${parity.passed ? "passed" : "FAILED"} in ${parity.seconds} s`);
  if (!parity.passed) process.stderr.write(`${(vt.stdout ?? "").slice(-4000)}${(vt.stderr ?? "").slice(-2000)}\n`);

  // 2. the small bench
  const bench: Measurement[] = [];
  const ctx = benchContext("small", "none", info.fallback ? 1 : 3);
  for (const w of WORKLOADS.filter((x) => ["forward", "fwd_bwd", "decode"].includes(x.name))) bench.push(...(await w.run(ctx)));
  ctx.dispose();
  for (const m of bench) console.log(`bench small ${m.workload}: ${m.tokens_per_s} tokens/s`);

  // 3. one GRPO step of the config's shape
  resetWebgpuPeak();
  const model = await createModel(BENCH_CONFIGS[opts.config], {
    seed: 0,
    quantize: "nf4",
    lora: { r: 16, alpha: 32, dropout: 0, targetModules: [...LORA_TARGETS] },
  });
  // the rollouts on the compiled decoder (the engine runs use on webgpu), then the update; tfjs' path's
  // rollouts beside it. The memory peak is tfjs' buffers' plus the decoder's own (KV cache, scratch).
  const decoder = new Decoder(model);
  const grpo = {
    config: opts.config,
    decoder: "compiled",
    ...(await grpoShape(model, GRPO_SHAPES[opts.config], { compiled: decoder })),
    peakDeviceBytes: webgpuMemory().peakBytes + decoder.bytes,
    decoderBytes: decoder.bytes,
  };
  const grpoTfjs = { config: opts.config, decoder: "tfjs", ...(await grpoShape(model, GRPO_SHAPES[opts.config], { update: false })) };
  // 4. decode steps at the step's batch, 2× and 8× it, on both decoders
  const shape = GRPO_SHAPES[opts.config];
  const rows = shape.questions * shape.samples;
  const batches = [rows, 2 * rows, 8 * rows],
    steps = opts.config === "small" ? 3 : 8;
  const scaling = await decodeScaling(model, shape, batches, steps);
  const compiledScaling = await compiledDecodeScaling(decoder, batches, steps, (n) =>
    tokenBatch(n, shape.promptLen, model.config.vocabSize, 5),
  );
  decoder.dispose();
  // 5. the step's rollouts on llama.cpp (its CUDA, Vulkan or Metal build where node-llama-cpp finds
  // one; on a software adapter its CPU build), f16 weights, the adapter swapped in: batch 32 and 256
  const llama = [];
  if (opts.llama)
    for (const samples of [1, 8].map((k) => k * GRPO_SHAPES[opts.config].samples)) {
      const shape = { ...GRPO_SHAPES[opts.config], samples };
      const r = await grpoShape(model, shape, {
        llama: { weights: "f16", adapter: "lora", gpu: info.fallback ? false : "auto" },
        update: false,
      });
      llama.push({ rows: r.rows, rolloutSeconds: r.rolloutSeconds, sampledTokensPerS: r.sampledTokensPerS, ...r.llama });
      console.log(
        `llama.cpp ${opts.config} batch ${r.rows}: rollouts ${r.rolloutSeconds} s, ${r.sampledTokensPerS} sampled tokens/s (${JSON.stringify(r.llama)})`,
      );
    }
  model.dispose();
  console.log(
    `grpo ${opts.config} (compiled decoder): step ${round(grpo.rolloutSeconds + grpo.updateSeconds)} s; rollouts ${formatBreakdown(
      grpo.rolloutSeconds,
      [
        ["prefill and the first draw", grpo.prefillSeconds],
        ["decode", grpo.decodeSeconds],
      ],
    )} (${grpo.sampledTokensPerS} sampled tokens/s at batch ${grpo.rows}; the host's writing, encoding and submits ${grpo.stepCallSeconds} s, overlapping the GPU's work); update ${updateBreakdown(grpo)} (micro-batches ${JSON.stringify(grpo.microBatch)}); device memory peak ${gib(grpo.peakDeviceBytes)} GiB (${gib(grpo.decoderBytes)} GiB of it the decoder's KV cache and scratch)`,
  );
  console.log(
    `grpo ${opts.config} (tfjs path): rollouts ${formatBreakdown(grpoTfjs.rolloutSeconds, [
      ["prefill and the first draw", grpoTfjs.prefillSeconds],
      ["decode", grpoTfjs.decodeSeconds],
    ])} (${grpoTfjs.sampledTokensPerS} sampled tokens/s); decode ${formatBreakdown(grpoTfjs.decodeSeconds, [
      ["the host encoding the steps", grpoTfjs.stepCallSeconds],
      ["the draws (each waits for its step on the GPU)", grpoTfjs.sampleSeconds],
    ])}`,
  );
  for (const [name, list] of [
    ["tfjs", scaling],
    ["compiled", compiledScaling],
  ] as const)
    for (const d of list) console.log(`decode ${opts.config} ${name} batch ${d.rows}: ${d.msPerStep} ms a step, ${d.tokensPerS} tokens/s`);

  const record = {
    adapter: info.description,
    software: info.fallback,
    limits: info.limits,
    parity,
    bench,
    features: info.features,
    grpo,
    grpoTfjs,
    decodeScaling: scaling,
    compiledDecodeScaling: compiledScaling,
    llama,
    seconds: round(now() - t0),
  };
  await fs.mkdir(path.dirname(opts.out), { recursive: true });
  await writeFileAtomic(opts.out, JSON.stringify(record, null, 2) + "\n");
  console.log(`wrote ${opts.out} (${record.seconds} s in all)`);
  if (!parity.passed) throw new Error("gpu-check: the parity subset failed on this adapter (output above)");
});

/** The update's seconds by part (the passes' parts, summed over micro-batches; on webgpu a part's time
 *  is the time to queue its work, except where a read waits for it). */
function updateBreakdown(g: { updateSeconds: number; update: GrpoSeconds }): string {
  return formatBreakdown(g.updateSeconds, Object.entries(g.update));
}

/** --config 1.5b | 3b | 7b: the model (random weights, NF4 base, LoRA r16) and one step's update on
 *  random completions of the 0.5b step's shape; its time by part, micro-batches and memory peak. */
async function sizeCheck(info: { description: string; fallback: boolean; limits: Record<string, number> }): Promise<void> {
  const t0 = now();
  resetWebgpuPeak();
  const model = await createModel(SIZE_CONFIGS[opts.config], {
    seed: 0,
    quantize: "nf4",
    lora: { r: 16, alpha: 32, dropout: 0, targetModules: [...LORA_TARGETS] },
  });
  const loadSeconds = round(now() - t0);
  const weightsBytes = webgpuMemory().bytes;
  const grpo = { config: opts.config, ...(await grpoShape(model, GRPO_SHAPES[opts.config], { rollouts: false })) };
  const peakDeviceBytes = webgpuMemory().peakBytes;
  model.dispose();
  console.log(
    `update ${opts.config} for ${grpo.rows} rollouts × ${grpo.promptTokens + grpo.newTokens} tokens: ${updateBreakdown(grpo)} (micro-batches ${JSON.stringify(grpo.microBatch)}); device memory: weights ${gib(weightsBytes)} GiB, peak ${gib(peakDeviceBytes)} GiB`,
  );
  const record = {
    adapter: info.description,
    limits: info.limits,
    grpo,
    loadSeconds,
    weightsBytes,
    peakDeviceBytes,
    seconds: round(now() - t0),
  };
  await fs.mkdir(path.dirname(opts.out), { recursive: true });
  await writeFileAtomic(opts.out, JSON.stringify(record, null, 2) + "\n");
  console.log(`wrote ${opts.out} (${record.seconds} s in all)`);
}

function gib(bytes: number): string {
  return (bytes / 2 ** 30).toFixed(2);
}

function round(x: number): number {
  return Math.round(x * 100) / 100;
}
