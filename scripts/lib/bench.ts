/** Named benchmark workloads over a CausalLM and the configs they run on. scripts/bench.ts runs them;
 *  another workload (say, a rollout benchmark) lives in its own file and calls registerWorkload().
 *  Each run returns measurements; speed is measured here, never asserted in tests. */
import * as tf from "@tensorflow/tfjs";
import { wasmThreads } from "../../src/kernels/wasm/threads.ts";
import { wasmSimd, type WasmSimd } from "../../src/kernels/wasm/heap-build.ts";
import { webgpuTraffic } from "../../src/kernels/webgpu/device.ts";
import { sampleTokens } from "../../src/rollout/sampler.ts";
import { Rng } from "../../src/util/rng.ts";
import { AdamW } from "../../src/trainer/optimizer.ts";
import { createModel, paramCount } from "../../src/model/load.ts";
import { LoraAdapter } from "../../src/model/lora.ts";
import { backendProfile } from "../../src/kernels/profile.ts";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { compiledDecodeFigures, decodeTable, tfjsDecodeFigures, type DecodeStepFigures } from "./bench-decoder.ts";
import { LORA_TARGETS, type Quantize, type Qwen2Config } from "../../src/model/types.ts";

export interface Measurement {
  workload: string;
  backend: string;
  threads: number;
  /** The heap module's build on wasm: "relaxed" (fused multiply-add) or "simd128"; absent on other backends. */
  wasm_simd?: WasmSimd;
  /** The Node version that ran it (V8's code generation differs between versions). */
  node: string;
  config: string;
  quantize: Quantize;
  batch: number;
  tokens: number;
  seconds: number;
  tokens_per_s: number;
  peak_heap_bytes?: number;
  /** Seconds of every timed run when there were several (`seconds` is their median). */
  runs?: number[];
  /** Seconds of the run's parts, by name (a workload that times phases apart, e.g. grpo_step). */
  parts?: Record<string, number>;
  note?: string;
  /** decode on webgpu: the decoder's structure per step (bench-decoder.ts). */
  decoder?: DecodeStepFigures;
}
export interface BenchContext {
  configName: string;
  /** The config as reported: its name, or e.g. "0.5b-4l" when run with fewer layers than its own. */
  label: string;
  config: Qwen2Config;
  quantize: Quantize;
  /** Timed runs per workload (after a warm-up on the small config); the median is reported. */
  repeat: number;
  /** A model with random weights; LoRA r16/alpha32 on all 7 modules when `lora` is set. Cached per kind. */
  model(lora: boolean): Promise<Qwen2ForCausalLM>;
  measure(
    m: Omit<Measurement, "backend" | "threads" | "wasm_simd" | "node" | "config" | "quantize" | "tokens_per_s" | "peak_heap_bytes">,
  ): Measurement;
}
export interface Workload {
  name: string;
  description: string;
  run(ctx: BenchContext): Promise<Measurement[]>;
}

const qwen = (o: Partial<Qwen2Config>): Qwen2Config => ({
  modelType: "qwen2",
  vocabSize: 512,
  hiddenSize: 256,
  intermediateSize: 688,
  numHiddenLayers: 4,
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  headDim: 64,
  ropeTheta: 1e6,
  rmsNormEps: 1e-6,
  tieWordEmbeddings: true,
  maxPositionEmbeddings: 32768,
  ...o,
});
export const BENCH_CONFIGS: Record<string, Qwen2Config> = {
  small: qwen({}),
  "0.5b": qwen({
    vocabSize: 151936,
    hiddenSize: 896,
    intermediateSize: 4864,
    numHiddenLayers: 24,
    numAttentionHeads: 14,
    numKeyValueHeads: 2,
    headDim: 64,
  }),
};

/** Qwen2.5's larger shapes (their Hugging Face config.json), for `gpu-check --config`: which model
 *  trains on which GPU. Not bench configs: a CPU runs none of them in reasonable time. */
export const SIZE_CONFIGS: Record<string, Qwen2Config> = {
  "1.5b": qwen({
    vocabSize: 151936,
    hiddenSize: 1536,
    intermediateSize: 8960,
    numHiddenLayers: 28,
    numAttentionHeads: 12,
    numKeyValueHeads: 2,
    headDim: 128,
  }),
  "3b": qwen({
    vocabSize: 151936,
    hiddenSize: 2048,
    intermediateSize: 11008,
    numHiddenLayers: 36,
    numAttentionHeads: 16,
    numKeyValueHeads: 2,
    headDim: 128,
  }),
  "7b": qwen({
    vocabSize: 152064,
    hiddenSize: 3584,
    intermediateSize: 18944,
    numHiddenLayers: 28,
    numAttentionHeads: 28,
    numKeyValueHeads: 4,
    headDim: 128,
    tieWordEmbeddings: false,
  }),
};

export const WORKLOADS: Workload[] = [];
export function registerWorkload(w: Workload): void {
  if (WORKLOADS.some((x) => x.name === w.name)) throw new Error(`benchmark workload "${w.name}" is registered twice`);
  WORKLOADS.push(w);
}

/** Bytes of the wasm heap (it only grows, so this is the peak so far); undefined on other backends. */
export function heapBytes(): number | undefined {
  const b = tf.backend() as unknown as { wasm?: { HEAPU8?: Uint8Array } };
  return b.wasm?.HEAPU8?.byteLength;
}

/** Deterministic token ids [batch][len] in 1..vocab−1. */
export function tokenBatch(batch: number, len: number, vocab: number, seed = 1): number[][] {
  let s = seed;
  return Array.from({ length: batch }, () =>
    Array.from({ length: len }, () => 1 + ((s = (s * 1103515245 + 12345) % 2147483648) % (vocab - 1))),
  );
}

const now = () => performance.now() / 1000;

/** Runs `once` n times; per key, the median seconds and (when n > 1) every run. */
async function timed<K extends string>(
  n: number,
  once: () => Promise<Record<K, number>>,
): Promise<Record<K, { seconds: number; runs?: number[] }>> {
  const all: Record<string, number>[] = [];
  for (let i = 0; i < n; i++) all.push(await once());
  return Object.fromEntries(
    Object.keys(all[0]).map((k) => {
      const runs = all.map((r) => r[k]),
        sorted = [...runs].sort((a, b) => a - b);
      return [k, { seconds: sorted[Math.floor(sorted.length / 2)], runs: n > 1 ? runs.map((x) => Math.round(x * 1e4) / 1e4) : undefined }];
    }),
  ) as Record<K, { seconds: number; runs?: number[] }>;
}

/** Usable wasm heap: 4 GiB minus room for fragmentation. An out-of-memory abort kills the wasm module,
 *  so batches are sized from an estimate up front instead of by trial. */
const HEAP_BUDGET = 3.4 * 2 ** 30;

/** Largest batch ≤ want (halving) whose estimated bytes fit beside the model and `fixedBytes` of
 *  batch-independent scratch; note says when smaller. */
function fitBatch(model: Qwen2ForCausalLM, want: number, bytesPerRow: number, fixedBytes = 0): { batch: number; note?: string } {
  const free = HEAP_BUDGET - model.baseBytes() - fixedBytes;
  let b = want;
  while (b > 1 && b * bytesPerRow > free) b = Math.floor(b / 2);
  return {
    batch: b,
    note:
      b < want
        ? `batch ${want} does not fit the 4 GiB wasm heap (≈${(bytesPerRow / 2 ** 20).toFixed(0)} MB per row beside ${(model.baseBytes() / 2 ** 30).toFixed(2)} GiB of weights); ran ${b}`
        : undefined,
  };
}

registerWorkload({
  name: "forward",
  description: "no-grad forward, 8×256 tokens, full-vocab logits",
  async run(ctx) {
    const model = await ctx.model(false);
    const V = ctx.config.vocabSize;
    const once = async (b: number) => {
      const ids = tokenBatch(b, 256, V);
      const t0 = now();
      const logits = model.forward(ids);
      await logits.data(); // wasm runs eagerly; the read makes the timing honest on async backends too
      logits.dispose();
      return now() - t0;
    };
    // full logits, a transposed copy and the hidden states of one layer per row
    const { batch, note } = fitBatch(model, 8, 256 * (2.2 * V * 4 + 40 * ctx.config.intermediateSize));
    if (ctx.configName === "small") await once(batch); // warm-up
    const { t } = await timed(ctx.repeat, async () => ({ t: await once(batch) }));
    return [ctx.measure({ workload: "forward", batch, tokens: batch * 256, ...t, note })];
  },
});

registerWorkload({
  name: "fwd_bwd",
  description: "mean next-token cross-entropy on 8×256 tokens, gradients of LoRA r16/alpha32 on all 7 modules",
  async run(ctx) {
    const model = await ctx.model(true);
    const once = async (b: number) => {
      const ids = tokenBatch(b, 256, ctx.config.vocabSize);
      const mask = ids.map((r) => r.map(() => 1));
      const t0 = now();
      const { value, grads } = tf.variableGrads(
        () => tf.neg(tf.mean(tf.slice(model.tokenLogprobs(ids, mask, { training: true }).logprobs, [0, 1], [-1, -1]))) as tf.Scalar,
        model.trainableVariables(),
      );
      await value.data();
      await Promise.all(Object.values(grads).map((g) => g.data())); // the gradients done too, on async backends
      tf.dispose([value, grads]);
      return now() - t0;
    };
    // With activation checkpointing the tape keeps each layer's input (and the backward pass a few
    // gradients of that size per layer); one layer at a time is recomputed, its activations (~12
    // [T, intermediate], ~3 [heads, T, T]) and their gradients alive together (measured on 0.5B:
    // ~250 MB per 256-token row, as the wasm backend copies every tensor the tape saves). The vocab
    // head's backward needs ~7 [chunk rows, vocab] of scratch whatever the batch.
    const c = ctx.config;
    const layer = 12 * c.intermediateSize + 3 * c.numAttentionHeads * 256 + 30 * c.hiddenSize;
    const perRow = 256 * 4 * (2 * layer + 4 * c.numHiddenLayers * c.hiddenSize);
    const { batch, note } = fitBatch(model, 8, perRow, 8 * 16 * 2 ** 20);
    if (ctx.configName === "small") await once(batch);
    const { t } = await timed(ctx.repeat, async () => ({ t: await once(batch) }));
    return [ctx.measure({ workload: "fwd_bwd", batch, tokens: batch * 256, ...t, note })];
  },
});

/** The decode workload's shape per config: small as docs/kernels.md's table; 0.5b at a GRPO step's batch
 *  and prompt length (4 × 8 rollouts after ~220 tokens), with fewer new tokens so a run takes minutes. */
const DECODE_SHAPES: Record<string, { batch: number; promptLen: number; newTokens: number }> = {
  small: { batch: 8, promptLen: 128, newTokens: 64 },
  "0.5b": { batch: 32, promptLen: 220, newTokens: 32 },
};

registerWorkload({
  name: "decode",
  description:
    "greedy decoding with KV cache: small batch 8 after a 128-token prompt, 64 new tokens; 0.5b batch 32 (a GRPO step's) after 220 tokens, 32 new tokens; prefill timed separately; a quantized base is unpacked first, as rollouts do (timed apart)",
  async run(ctx) {
    const { batch: B, promptLen, newTokens } = DECODE_SHAPES[ctx.configName] ?? DECODE_SHAPES.small;
    const model = await ctx.model(false);
    const tUnpack = now();
    const unpacked = model.unpackBase?.() ?? (() => {});
    let packed = false;
    const release = () => void (packed || ((packed = true), unpacked()));
    const unpackSeconds = now() - tUnpack;
    const once = async (b: number) => {
      const ids = tokenBatch(b, promptLen, ctx.config.vocabSize, 7);
      const t0 = now();
      const { logits, cache } = model.prefill(
        ids,
        ids.map((r) => r.map(() => 1)),
      );
      let tok = tf.tidy(() => tf.argMax(logits, 1));
      let next = Array.from(await tok.data());
      tf.dispose([logits, tok]);
      const t1 = now();
      for (let s = 1; s < newTokens; s++) {
        const lg = model.decodeStep(next, cache);
        tok = tf.tidy(() => tf.argMax(lg, 1));
        next = Array.from(await tok.data()); // the rollout loop reads every token back to the host
        tf.dispose([lg, tok]);
      }
      const t2 = now();
      cache.dispose();
      return { prefill: t1 - t0, decode: t2 - t1 };
    };
    try {
      if (ctx.configName === "small") await once(B);
      const r = await timed(ctx.repeat, () => once(B));
      const note = model.quantize === "none" ? undefined : `base unpacked for generation in ${unpackSeconds.toFixed(2)} s`;
      const out = [
        ctx.measure({ workload: "prefill", batch: B, tokens: B * promptLen, ...r.prefill, note }),
        // newTokens − 1 decode steps after the token that prefill produced: newTokens per row in all
        ctx.measure({ workload: "decode", batch: B, tokens: B * (newTokens - 1), ...r.decode, note }),
      ];
      if (tf.getBackend() !== "webgpu") return out;
      // on webgpu, the compiled decoder beside tfjs' path at the same shape, each step's structure counted
      const ids = tokenBatch(B, promptLen, ctx.config.vocabSize, 7);
      const figs = [await tfjsDecodeFigures(model, ids, newTokens - 1)];
      release();
      figs.push(await compiledDecodeFigures(model, ids, newTokens - 1));
      figs.push({ ...(await compiledDecodeFigures(await ctx.model(true), ids, newTokens - 1, true)), decoder: "compiled" });
      process.stderr.write(
        decodeTable(`${ctx.label} (${ctx.quantize}; compiled rows: without, then with LoRA r16 on all modules)`, B, figs),
      );
      for (const [f, lora] of [
        [figs[1], false],
        [figs[2], true],
      ] as const)
        out.push({
          ...ctx.measure({
            workload: lora ? "decode_compiled_lora" : "decode_compiled",
            batch: B,
            tokens: B * f.steps,
            seconds: f.seconds,
          }),
          decoder: f,
        } as Measurement);
      out[1] = { ...out[1], decoder: figs[0] } as Measurement;
      return out;
    } finally {
      release();
    }
  },
});

/** Runs f under tf.profile and returns the kernels that took the most time, "ms ×count name shapes"
 *  per kernel and shapes, and the same per kind of kernel (shapes summed: where the many small
 *  element-wise kernels show). Kernel times of custom-gradient ops ("unnamed scope") include the
 *  kernels inside them, so columns do not add up exactly. */
export async function profileTop<T>(f: () => Promise<T>, top = 12): Promise<{ value: T; kernels: string[]; kinds: string[] }> {
  let value: T | undefined;
  const info = await tf.profile(async () => {
    value = await f();
    return [];
  });
  const agg = new Map<string, { ms: number; n: number }>(),
    byKind = new Map<string, { ms: number; n: number }>();
  for (const k of info.kernels) {
    const ms = await k.kernelTimeMs;
    for (const [m, key] of [
      [agg, `${k.name} ${JSON.stringify(k.inputShapes)}`],
      [byKind, k.name],
    ] as const) {
      const a = m.get(key) ?? { ms: 0, n: 0 };
      a.ms += typeof ms === "number" ? ms : 0;
      a.n++;
      m.set(key, a);
    }
  }
  const list = (m: Map<string, { ms: number; n: number }>, n: number) =>
    [...m]
      .sort((a, b) => b[1].ms - a[1].ms)
      .slice(0, n)
      .map(([k, v]) => `${v.ms.toFixed(0)} ms ×${v.n} ${k}`);
  return { value: value as T, kernels: list(agg, top), kinds: list(byKind, 2 * top) };
}

/** Kernels run by one decode step (batch 8 after a 128-token prefill and one step, base unpacked as
 *  in rollouts; without and with LoRA r16 on all 7 modules)
 *  and by one training step (LoRA gradients of the mean token log-prob, batch 2 × 256): what the
 *  per-kernel overhead of small models scales with. Also the kinds that occur most in each. On
 *  webgpu also the dispatches (a Reshape or Identity is a kernel but no dispatch) and the bytes read
 *  back to the host by a decode step, the rollout sampler's draw included. */
export interface StepCounts {
  decodeStep: number;
  decodeStepLora: number;
  trainStep: number;
  decodeTop: string;
  trainTop: string;
  /** webgpu only: dispatches per decode step (the model's, without and with LoRA), of its draw (the
   *  rollout sampler's, temperature 1), per training step, of the optimizer step (AdamW with
   *  clipping over the LoRA variables), and the programs. */
  dispatches?: {
    decode: number;
    decodeLora: number;
    draw: number;
    train: number;
    /** the training step with the rows' first 3/4 of tokens shared (as a GRPO group's prompt): the
     *  shared-prefix forward (qwen2.ts sharePrefixes) */
    trainShared: number;
    optimizer: number;
    decodeTop: string;
    drawTop: string;
    trainTop: string;
  };
  /** webgpu only: host microseconds per dispatch in the training step (the backend's program runs:
   *  shader key, uploads, bind groups, uniforms, encoding), and of that in recordAndSubmit. */
  hostUsPerDispatch?: { run: number; record: number };
  /** webgpu only: bytes read back by a decode step's draw (the model's step reads nothing): B·2
   *  floats from the whole-vocabulary draw kernel. */
  decodeReadbackBytes?: number;
}

const topOf = (m: Map<string, number>, k = 8) =>
  [...m]
    .sort((a, b) => b[1] - a[1])
    .slice(0, k)
    .map(([name, n]) => `${name} ${n}`)
    .join(", ");

export async function kernelCounts(ctx: BenchContext, opts: { promptLen?: number; trainLen?: number } = {}): Promise<StepCounts> {
  const promptLen = opts.promptLen ?? 128,
    trainLen = opts.trainLen ?? 256;
  const gpu = tf.getBackend() === "webgpu";
  const count = async (f: () => Promise<void> | void) => {
    const t0 = webgpuTraffic();
    const info = await tf.profile(async () => {
      await f();
    });
    const t1 = webgpuTraffic();
    const kinds = new Map<string, number>();
    for (const k of info.kernels) kinds.set(k.name, (kinds.get(k.name) ?? 0) + 1);
    const programs = new Map<string, number>();
    for (const [name, n] of t1.byProgram) if (n - (t0.byProgram.get(name) ?? 0) > 0) programs.set(name, n - (t0.byProgram.get(name) ?? 0));
    return {
      n: info.kernels.length,
      top: topOf(kinds),
      dispatches: t1.dispatches - t0.dispatches,
      programs: topOf(programs, 10),
      readback: t1.readbackBytes - t0.readbackBytes,
    };
  };
  const V = ctx.config.vocabSize;
  const decodeCount = async (model: Qwen2ForCausalLM) => {
    const release = model.unpackBase?.() ?? (() => {});
    const ids = tokenBatch(8, promptLen, V, 7);
    const { logits, cache } = model.prefill(
      ids,
      ids.map((r) => r.map(() => 1)),
    );
    logits.dispose();
    // the first step grows the cache's room (wasm, webgpu: a copy of every layer's keys and values);
    // the counted one is the next, as 31 of every 32 steps are
    model
      .decodeStep(
        ids.map((r) => r[1]),
        cache,
      )
      .dispose();
    let lg: tf.Tensor2D | null = null;
    const n = await count(() => {
      lg = model.decodeStep(
        ids.map((r) => r[0]),
        cache,
      );
    });
    // the draw as rollouts make it (its reads are what a decode step sends back to the host)
    const draw = await count(async () => {
      await sampleTokens(lg!, { temperature: 1 }, new Rng(1));
    });
    tf.dispose([lg!]);
    cache.dispose();
    release();
    return { ...n, draw };
  };
  const dec = await decodeCount(await ctx.model(false));
  const model = await ctx.model(true);
  const decLora = await decodeCount(model);
  const tids = tokenBatch(2, trainLen, V),
    mask = tids.map((r) => r.map(() => 1)),
    shared = Math.floor((3 * trainLen) / 4),
    sharedIds = tids.map((r) => [...tids[0].slice(0, shared), ...r.slice(shared)]);
  const trainStep = async (ids = tids) => {
    const { value, grads } = tf.variableGrads(
      () => tf.neg(tf.mean(model.tokenLogprobs(ids, mask, { training: true }).logprobs)) as tf.Scalar,
      model.trainableVariables(),
    );
    await value.data();
    tf.dispose(value);
    return grads;
  };
  // webgpu: a step to compile the programs, then one timed outside tf.profile (which ends the pass
  // and submits a timestamp query after every dispatch)
  let hostUs: { run: number; record: number } | undefined;
  if (gpu) {
    tf.dispose(await trainStep());
    const t0 = webgpuTraffic();
    tf.dispose(await trainStep());
    const t1 = webgpuTraffic(),
      timed = Math.max(1, t1.dispatchesTimed - t0.dispatchesTimed);
    hostUs = { run: (1000 * (t1.hostMs - t0.hostMs)) / timed, record: (1000 * (t1.recordMs - t0.recordMs)) / timed };
  }
  let grads: tf.NamedTensorMap = {};
  if (gpu) tf.dispose(await trainStep(sharedIds)); // compiles the shared-prefix programs
  const trainShared = await count(async () => {
    tf.dispose(await trainStep(sharedIds));
  });
  const train = await count(async () => {
    grads = await trainStep();
  });
  // the optimizer step as training runs it (the second: the first compiles)
  const opt = new AdamW(model.trainableVariables(), { lr: 0 });
  await opt.applyGradients(grads, { maxGradNorm: 1 });
  const optimizer = await count(async () => {
    await opt.applyGradients(grads, { maxGradNorm: 1 });
  });
  opt.dispose();
  tf.dispose(grads);
  return {
    decodeStep: dec.n,
    decodeStepLora: decLora.n,
    trainStep: train.n,
    decodeTop: dec.top,
    trainTop: train.top,
    dispatches: gpu
      ? {
          decode: dec.dispatches,
          decodeLora: decLora.dispatches,
          draw: dec.draw.dispatches,
          train: train.dispatches,
          trainShared: trainShared.dispatches,
          optimizer: optimizer.dispatches,
          decodeTop: dec.programs,
          drawTop: dec.draw.programs,
          trainTop: train.programs,
        }
      : undefined,
    decodeReadbackBytes: gpu ? dec.readback + dec.draw.readback : undefined,
    hostUsPerDispatch: hostUs,
  };
}

/** Dispatches of the optimizer step (AdamW with clipping, the second step: the first compiles) over
 *  the LoRA variables (r 16, every module) of a whole config, without its model: the step groups its
 *  variables, so its count is not linear in the layers. */
async function optimizerDispatches(config: Qwen2Config): Promise<number> {
  const ad = LoraAdapter.init(config, { r: 16, alpha: 32, dropout: 0, targetModules: [...LORA_TARGETS] });
  const vars = ad.variables(),
    grads = Object.fromEntries(vars.map((v) => [v.name, tf.onesLike(v)]));
  const opt = new AdamW(vars, { lr: 0 });
  try {
    await opt.applyGradients(grads, { maxGradNorm: 1 });
    const t0 = webgpuTraffic().dispatches;
    await opt.applyGradients(grads, { maxGradNorm: 1 });
    return webgpuTraffic().dispatches - t0;
  } finally {
    opt.dispose();
    tf.dispose(Object.values(grads));
    ad.dispose();
  }
}

/** kernelCounts of a config without running all its layers: its layers are alike, so the counts of
 *  1- and 2-layer models give the whole one (c1 + (L − 1)·(c2 − c1)), exactly; the optimizer's is
 *  counted over the whole config's variables. For a model too slow to step whole (0.5B on a software
 *  adapter); the program lists are the 2-layer model's. */
export async function layerTracedCounts(
  configName: string,
  quantize: Quantize,
  opts: { promptLen?: number; trainLen?: number } = {},
): Promise<StepCounts> {
  const L = BENCH_CONFIGS[configName].numHiddenLayers;
  const at = async (layers: number) => {
    const ctx = benchContext(configName, quantize, 1, 0, { numHiddenLayers: layers });
    try {
      return await kernelCounts(ctx, opts);
    } finally {
      ctx.dispose();
    }
  };
  const c1 = await at(1),
    c2 = await at(2);
  const x = (a: number, b: number) => a + (L - 1) * (b - a);
  return {
    ...c2,
    decodeStep: x(c1.decodeStep, c2.decodeStep),
    decodeStepLora: x(c1.decodeStepLora, c2.decodeStepLora),
    trainStep: x(c1.trainStep, c2.trainStep),
    dispatches:
      c1.dispatches && c2.dispatches
        ? {
            ...c2.dispatches,
            decode: x(c1.dispatches.decode, c2.dispatches.decode),
            decodeLora: x(c1.dispatches.decodeLora, c2.dispatches.decodeLora),
            train: x(c1.dispatches.train, c2.dispatches.train), // the draw's count does not depend on the layers
            trainShared: x(c1.dispatches.trainShared, c2.dispatches.trainShared),
            optimizer: await optimizerDispatches(BENCH_CONFIGS[configName]),
          }
        : undefined,
    decodeReadbackBytes: c2.decodeReadbackBytes, // the draw's reads do not depend on the layers
  };
}

/** Context for one (config, quantize): models are created lazily and reused across workloads. */
export function benchContext(
  configName: string,
  quantize: Quantize,
  repeat = 1,
  seed = 0,
  override: Partial<Qwen2Config> = {},
): BenchContext & { dispose(): void } {
  const config = BENCH_CONFIGS[configName] && { ...BENCH_CONFIGS[configName], ...override };
  if (!config) throw new Error(`unknown bench config "${configName}"; accepted: ${Object.keys(BENCH_CONFIGS).join(", ")}`);
  const models = new Map<boolean, Qwen2ForCausalLM>();
  const base = BENCH_CONFIGS[configName].numHiddenLayers;
  const label = config.numHiddenLayers === base ? configName : `${configName}-${config.numHiddenLayers}l`;
  return {
    configName,
    label,
    config,
    quantize,
    repeat,
    async model(lora) {
      if (!models.has(lora)) {
        // one model at a time: the 0.5B f32 weights alone are 2 GB of a 4 GiB heap
        for (const m of models.values()) m.dispose();
        models.clear();
        // A model cut to fewer layers is laid out as the whole one (weight.ts: frozen f32 weights over
        // the profile's leftLayoutBytes are held [out, in]): a 2-layer 0.5B is 0.66 GB, the whole 2 GB.
        const whole = BENCH_CONFIGS[configName],
          cut = config.numHiddenLayers !== whole.numHiddenLayers,
          over = (params: number) => (cut ? 4 * params > backendProfile().leftLayoutBytes : undefined);
        const m = await createModel(config, {
          seed,
          quantize,
          lora: lora ? { r: 16, alpha: 32, dropout: 0, targetModules: [...LORA_TARGETS] } : undefined,
          frozenLeft: over(paramCount(whole)),
        });
        m.unpackLeft = over(paramCount({ ...whole, vocabSize: 0 })); // the linear layers alone
        models.set(lora, m);
      }
      return models.get(lora)!;
    },
    measure: (m) => ({
      ...m,
      backend: tf.getBackend(),
      threads: wasmThreads(),
      ...(tf.getBackend() === "wasm" ? { wasm_simd: wasmSimd() } : {}),
      node: process.versions.node,
      config: label,
      quantize,
      tokens_per_s: Math.round((m.tokens / m.seconds) * 10) / 10,
      peak_heap_bytes: heapBytes(),
    }),
    dispose() {
      for (const m of models.values()) m.dispose();
      models.clear();
    },
  };
}
