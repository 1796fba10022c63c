/** Shared checks of the two sampling paths (rollout/sampler.ts): the candidate path (statistics on the
 *  device) draws the tokens of the host path's rank walk (`walk: "rank"`; the host sampler's default
 *  walks ids, so its tokens differ) for the same seed, and reads back what it says it reads. Run
 *  on wasm by test/rollout/sampler.test.ts and on webgpu by test/kernels/webgpu/sampler.test.ts. */
import { expect, vi } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { CANDIDATES, sampleTokens, type SampleOptions, type SampleResult, type SamplingParams } from "../../../src/rollout/sampler.ts";
import { Rng } from "../../../src/util/rng.ts";

/** Rows of every kind the candidate path must decide or hand back: peaked (the draw lands among the
 *  candidates), model-like spreads, flat (every draw falls back), a tie at the max (greedy falls
 *  back) and a tie straddling the K-th candidate. Seeded, so a failure replays. */
export function structuredLogits(B: number, V: number, seed = 3): Float32Array {
  const rng = new Rng(seed);
  const out = new Float32Array(B * V);
  for (let b = 0; b < B; b++) {
    const row = out.subarray(b * V, (b + 1) * V);
    const kind = b % 6;
    for (let j = 0; j < V; j++)
      row[j] = kind === 2 ? 0 : kind === 4 ? rng.normal() - 6 : rng.normal() * (kind === 1 ? 3 : kind === 5 ? 1.5 : 1);
    if (kind === 0) row[rng.int(0, V - 1)] = 12; // peaked
    if (kind === 3) {
      row[7] = 9;
      row[V - 3] = 9;
    } // two equal maxima: the lower id wins greedy
    if (kind === 4) for (let j = 0; j < CANDIDATES + 6; j++) row[(j * 37) % V] = j < CANDIDATES - 4 ? 8 - j / 10 : 1.25; // ranks 61–70 tied, across rank K
  }
  return out;
}

export const PARAM_SETS: SamplingParams[] = [
  { temperature: 0 },
  { temperature: 1 },
  { temperature: 0.7 },
  { temperature: 1, topK: 5 },
  { temperature: 0.8, topK: 100 }, // more than CANDIDATES: K grows to topK + 1
  { temperature: 1, topP: 0.9 },
  { temperature: 1.2, topK: 40, topP: 0.8 },
  { temperature: 1, topK: 1 },
];

/** `steps` successive draws from one stream, as a decode loop makes them. */
export async function drawSteps(
  logits: tf.Tensor2D,
  params: SamplingParams,
  opts: SampleOptions,
  steps = 3,
  seed = 17,
): Promise<SampleResult[]> {
  const rng = new Rng(seed);
  const out: SampleResult[] = [];
  for (let s = 0; s < steps; s++) out.push(await sampleTokens(logits, params, rng, opts));
  return out;
}

/** What the device path is compared with: the host path walking ranks, from the whole rows. */
export const RANK_REFERENCE: SampleOptions = { onDevice: false, walk: "rank" };

/** Same tokens; log-probs equal to float32 rounding of the normaliser (the device sums in float32). */
export function expectSameDraws(device: SampleResult[], host: SampleResult[], label: string): void {
  device.forEach((d, s) => {
    expect(d.tokens, `${label} step ${s} tokens`).toEqual(host[s].tokens);
    d.logprobs.forEach((v, b) => expect(Math.abs(v - host[s].logprobs[b]), `${label} step ${s} row ${b} logprob`).toBeLessThan(1e-5));
  });
}

/** Every `data()` read made while f runs, by element count: what crosses from the backend. */
export async function countReads<T>(f: () => Promise<T>): Promise<{ value: T; sizes: number[] }> {
  const sizes: number[] = [];
  const orig = tf.Tensor.prototype.data;
  const spy = vi.spyOn(tf.Tensor.prototype, "data").mockImplementation(function (this: tf.Tensor) {
    sizes.push(this.size);
    return orig.call(this) as ReturnType<typeof orig>;
  });
  try {
    return { value: await f(), sizes };
  } finally {
    spy.mockRestore();
  }
}

/** The candidate path's reads: one of B·(2 + 2K) floats when every row is decided by its
 *  candidates (peaked rows), plus one of n·V when n rows need their whole row (flat rows). */
export async function expectCandidateReads(B: number, V: number): Promise<void> {
  const peaked = new Float32Array(B * V).map((_, i) => (i % V === ((i / V) | 0) * 13 ? 30 : Math.sin(i)));
  const logits = tf.tensor2d(peaked, [B, V]);
  const K = CANDIDATES;
  for (const params of [{ temperature: 0 }, { temperature: 1 }, { temperature: 0.9, topP: 0.95 }, { temperature: 1, topK: 20 }]) {
    const { value, sizes } = await countReads(() => sampleTokens(logits, params, new Rng(1), { onDevice: true }));
    const k = params.temperature === 0 ? 2 : K;
    expect(sizes, JSON.stringify(params)).toEqual([B * (2 + 2 * k)]);
    expect(value.readFloats).toBe(B * (2 + 2 * k));
    expect(value.tokens).toEqual(Array.from({ length: B }, (_, b) => (b * 13) % V));
  }
  // Two flat rows among peaked ones: they, and only they, are read whole, in one more read.
  const mixed = tf.tidy(() => tf.concat([logits, tf.zeros([2, V])], 0)) as tf.Tensor2D;
  const { value, sizes } = await countReads(() => sampleTokens(mixed, { temperature: 1 }, new Rng(1), { onDevice: true }));
  expect(sizes).toEqual([(B + 2) * (2 + 2 * K), 2 * V]);
  expect(value.readFloats).toBe((B + 2) * (2 + 2 * K) + 2 * V);
  // The host path reads the logits once, whole (a nucleus draw: wasm draws whole-vocabulary rows on its heap).
  const host = await countReads(() => sampleTokens(mixed, { temperature: 1, topP: 0.95 }, new Rng(1), { onDevice: false }));
  expect(host.sizes).toEqual([(B + 2) * V]);
  tf.dispose([logits, mixed]);
}
