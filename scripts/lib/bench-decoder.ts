/** The decode workload on webgpu, both decoders side by side: tfjs' forward op by op (the local
 *  engine's) and the compiled decoder (src/kernels/webgpu/decode/), at the same shape, each drawing
 *  greedily and reading every token back as rollouts do. Per decode step: dispatches (and per
 *  layer), host µs writing and encoding, and in queue.submit (the GPU's work and the read's wait left out),
 *  GPU buffers and bind groups created after warm-up, submits, bytes read back; and sampled tokens/s.
 *  Counts come from the GPUDevice itself (its createBuffer, createBindGroup and queue.submit
 *  wrapped while a loop runs), so both decoders are counted alike. */
import * as tf from "@tensorflow/tfjs";
import { CompiledBatch } from "../../src/kernels/webgpu/decode/batch.ts";
import { Decoder } from "../../src/kernels/webgpu/decode/decoder.ts";
import { webgpuTraffic } from "../../src/kernels/webgpu/device.ts";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { Rng } from "../../src/util/rng.ts";

/** One decoder's figures per decode step. */
export interface DecodeStepFigures {
  decoder: "tfjs" | "compiled";
  steps: number;
  seconds: number;
  tokensPerS: number;
  dispatchesPerStep: number;
  dispatchesPerLayer: number;
  /** Host µs per step writing, encoding (tfjs: its program runs, submits included). */
  hostUsPerStep: number;
  /** Host µs per step in queue.submit (compiled only: a software adapter's driver records the
   *  command buffer there, so it is part CPU "GPU" work). */
  submitUsPerStep?: number;
  /** Compiled only: host µs writing and encoding a decode step's pass while the GPU is idle (a
   *  software adapter runs the previous pass on the same cores, which the in-loop figure includes). */
  hostUsIdle?: number;
  buffersPerStep: number;
  bindGroupsPerStep: number;
  submitsPerStep: number;
  readbackBytesPerStep: number;
}

/** Counts createBuffer, createBindGroup and submit calls on the device while f runs. */
async function counted<T>(f: () => Promise<T>): Promise<{ value: T; buffers: number; bindGroups: number; submits: number }> {
  const device = (tf.backend() as unknown as { device: GPUDevice }).device;
  const n = { buffers: 0, bindGroups: 0, submits: 0 };
  const [cb, cg, sq] = [device.createBuffer, device.createBindGroup, device.queue.submit];
  device.createBuffer = (d) => (n.buffers++, cb.call(device, d));
  device.createBindGroup = (d) => (n.bindGroups++, cg.call(device, d));
  device.queue.submit = (c) => (n.submits++, sq.call(device.queue, c));
  try {
    return { value: await f(), ...n };
  } finally {
    Object.assign(device, { createBuffer: cb, createBindGroup: cg });
    device.queue.submit = sq;
  }
}

/** tfjs' decode loop (the decode workload's own), counted: `steps` decode steps after a prefill and
 *  one warm-up step. */
export async function tfjsDecodeFigures(model: Qwen2ForCausalLM, ids: number[][], steps: number): Promise<DecodeStepFigures> {
  const B = ids.length;
  const { logits, cache } = model.prefill(
    ids,
    ids.map((r) => r.map(() => 1)),
  );
  const read = async (lg: tf.Tensor2D) => {
    const t = tf.tidy(() => tf.argMax(lg, 1));
    const next = Array.from(await t.data());
    tf.dispose([lg, t]);
    return next;
  };
  let next = await read(logits);
  next = await read(model.decodeStep(next, cache)); // warm-up: the cache's room grows, shaders compile
  const t0 = webgpuTraffic(),
    s0 = performance.now();
  const c = await counted(async () => {
    for (let s = 0; s < steps; s++) next = await read(model.decodeStep(next, cache));
  });
  const seconds = (performance.now() - s0) / 1000,
    t1 = webgpuTraffic();
  cache.dispose();
  const dispatches = (t1.dispatches - t0.dispatches) / steps;
  return {
    decoder: "tfjs",
    steps,
    seconds,
    tokensPerS: (B * steps) / seconds,
    dispatchesPerStep: dispatches,
    dispatchesPerLayer: dispatches / model.config.numHiddenLayers,
    hostUsPerStep: ((t1.hostMs - t0.hostMs) * 1000) / steps,
    buffersPerStep: c.buffers / steps,
    bindGroupsPerStep: c.bindGroups / steps,
    submitsPerStep: c.submits / steps,
    readbackBytesPerStep: (t1.readbackBytes - t0.readbackBytes) / steps,
  };
}

/** The compiled decoder's loop, as rollouts drive it (CompiledBatch: a greedy draw on the device,
 *  every token read back and fed), counted the same way. The decoder is made (pipelines compiled,
 *  buffers and bind groups made) before the counted steps, by a first batch. */
export async function compiledDecodeFigures(
  model: Qwen2ForCausalLM,
  ids: number[][],
  steps: number,
  adapters = false,
): Promise<DecodeStepFigures> {
  const B = ids.length;
  const dec = new Decoder(model);
  const greedy = { temperature: 0 },
    rng = new Rng(1);
  const loop = async (n: number) => {
    const batch = new CompiledBatch(dec, ids, { maxNewTokens: steps + 2, adapters });
    const all = batch.rows;
    let drawn = await batch.sample(all, greedy, rng);
    for (let s = 0; s < n; s++) {
      batch.step(drawn.tokens, () => false);
      drawn = await batch.sample(all, greedy, rng);
    }
    batch.dispose();
  };
  await loop(2); // warm-up: pipelines, buffers, bind groups
  // the counted batch's prefill and first draw are not decode steps
  const batch = new CompiledBatch(dec, ids, { maxNewTokens: steps + 2, adapters });
  let drawn = await batch.sample(batch.rows, greedy, rng);
  const st0 = { ...dec.stats },
    s0 = performance.now();
  const c = await counted(async () => {
    for (let s = 0; s < steps; s++) {
      batch.step(drawn.tokens, () => false);
      drawn = await batch.sample(batch.rows, greedy, rng);
    }
  });
  const seconds = (performance.now() - s0) / 1000,
    st = { ...dec.stats };
  const perLayer = dec.dispatchesPerLayer;
  // the same step's pass encoded with the GPU idle, 10 times (median)
  const device = (tf.backend() as unknown as { device: GPUDevice }).device;
  const rows = batch.rows.map((slot) => ({ token: ids[slot][0], slot, pos: ids[slot].length }));
  const idle: number[] = [];
  for (let i = 0; i < 10; i++) {
    await device.queue.onSubmittedWorkDone();
    const e0 = dec.stats.encodeMs;
    const read = dec.submit(
      rows,
      rows.map((_, k) => k),
    );
    idle.push((dec.stats.encodeMs - e0) * 1000);
    await read;
  }
  idle.sort((a, b) => a - b);
  batch.dispose();
  dec.dispose();
  return {
    decoder: "compiled",
    steps,
    seconds,
    tokensPerS: (B * steps) / seconds,
    dispatchesPerStep: (st.dispatches - st0.dispatches) / steps,
    dispatchesPerLayer: perLayer,
    hostUsPerStep: ((st.encodeMs - st0.encodeMs) * 1000) / steps,
    submitUsPerStep: ((st.submitMs - st0.submitMs) * 1000) / steps,
    hostUsIdle: idle[5],
    buffersPerStep: c.buffers / steps,
    bindGroupsPerStep: c.bindGroups / steps,
    submitsPerStep: c.submits / steps,
    readbackBytesPerStep: (st.readbackBytes - st0.readbackBytes) / steps,
  };
}

/** The two decoders' figures as a table (stderr). */
export function decodeTable(label: string, B: number, rows: DecodeStepFigures[]): string {
  const f = (x: number, d = 1) => (Number.isInteger(x) ? String(x) : x.toFixed(d));
  const cols: [string, (r: DecodeStepFigures) => string][] = [
    ["dispatches/step", (r) => f(r.dispatchesPerStep)],
    ["/layer", (r) => f(r.dispatchesPerLayer)],
    ["host µs/step", (r) => f(r.hostUsPerStep, 0)],
    ["submit µs/step", (r) => (r.submitUsPerStep === undefined ? "in host" : f(r.submitUsPerStep, 0))],
    ["host µs/step, GPU idle", (r) => (r.hostUsIdle === undefined ? "–" : f(r.hostUsIdle, 0))],
    ["buffers/step", (r) => f(r.buffersPerStep, 2)],
    ["bind groups/step", (r) => f(r.bindGroupsPerStep, 1)],
    ["submits/step", (r) => f(r.submitsPerStep, 2)],
    ["bytes read/step", (r) => f(r.readbackBytesPerStep, 0)],
    ["tokens/s", (r) => f(r.tokensPerS, 1)],
  ];
  const lines = [`${label} decode at batch ${B}: ${["decoder", ...cols.map((c) => c[0])].join(" | ")}`];
  for (const r of rows) lines.push(`  ${[r.decoder, ...cols.map((c) => c[1](r))].join(" | ")}`);
  return lines.join("\n") + "\n";
}

/** A GRPO step's rollouts (grpo-shape.ts) on the compiled decoder: the prompts (a group's rows share
 *  theirs, prefilled once), every row sampling `newTokens` at temperature 1 with its log-prob; the
 *  draws' and passes' time apart. The decoder is the caller's (kept warm across calls). */
export async function compiledShapeRollouts(
  dec: Decoder,
  prompts: number[][],
  newTokens: number,
): Promise<{ generated: number[][]; logprobs: number[][]; prefillSeconds: number; rolloutSeconds: number; hostSeconds: number }> {
  const rng = new Rng(1),
    t = { temperature: 1 };
  const generated: number[][] = prompts.map(() => []),
    logprobs: number[][] = prompts.map(() => []);
  const h0 = dec.stats.encodeMs + dec.stats.submitMs;
  const t0 = performance.now();
  const batch = new CompiledBatch(dec, prompts, { maxNewTokens: newTokens });
  const take = (d: { tokens: number[]; logprobs: number[] }) =>
    d.tokens.forEach((tok, i) => (generated[i].push(tok), logprobs[i].push(d.logprobs[i])));
  let drawn = await batch.sample(batch.rows, t, rng);
  take(drawn);
  const prefillSeconds = (performance.now() - t0) / 1000;
  for (let s = 1; s < newTokens; s++) {
    batch.step(drawn.tokens, () => false);
    drawn = await batch.sample(batch.rows, t, rng);
    take(drawn);
  }
  batch.dispose();
  return {
    generated,
    logprobs,
    prefillSeconds,
    rolloutSeconds: (performance.now() - t0) / 1000,
    hostSeconds: (dec.stats.encodeMs + dec.stats.submitMs - h0) / 1000,
  };
}

/** Greedy decode steps at several batches after `promptLen` tokens on the compiled decoder: the
 *  median ms a step and tokens/s (decodeScaling's figures for tfjs' path). */
export async function compiledDecodeScaling(
  dec: Decoder,
  batches: number[],
  steps: number,
  ids: (rows: number) => number[][],
): Promise<{ rows: number; msPerStep: number; tokensPerS: number }[]> {
  const out: { rows: number; msPerStep: number; tokensPerS: number }[] = [];
  for (const rows of batches) {
    const batch = new CompiledBatch(dec, ids(rows), { maxNewTokens: steps + 2 });
    const g = { temperature: 0 },
      rng = new Rng(0);
    let drawn = await batch.sample(batch.rows, g, rng);
    const times: number[] = [];
    for (let s = 0; s <= steps; s++) {
      const t0 = performance.now();
      batch.step(drawn.tokens, () => false);
      drawn = await batch.sample(batch.rows, g, rng);
      if (s > 0) times.push(performance.now() - t0);
    }
    batch.dispose();
    times.sort((a, b) => a - b);
    const ms = times[times.length >> 1];
    out.push({ rows, msPerStep: Math.round(ms * 100) / 100, tokensPerS: Math.round((rows / ms) * 1000 * 100) / 100 });
  }
  return out;
}
