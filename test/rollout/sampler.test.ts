import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { heapHelpersReady, splitJobCount } from "../../src/kernels/wasm/heap.ts";
import { wasmThreads } from "../../src/kernels/wasm/threads.ts";
import { sampleRow, sampleTokens, topIndices, type SampleOptions } from "../../src/rollout/sampler.ts";
import { Rng } from "../../src/util/rng.ts";
import { drawSteps, expectCandidateReads, expectSameDraws, PARAM_SETS, RANK_REFERENCE, structuredLogits } from "./helpers/sampler-suite.ts";

beforeAll(async () => {
  await initBackend("wasm");
});

function logSoftmax(row: number[], T = 1): number[] {
  const s = row.map((x) => x / T);
  const m = Math.max(...s);
  const lse = m + Math.log(s.reduce((a, x) => a + Math.exp(x - m), 0));
  return s.map((x) => x - lse);
}

/** Draw `n` samples from one logits row (as a batch of identical rows) and count tokens. */
async function frequencies(row: number[], n: number, params: Parameters<typeof sampleTokens>[1], seed: number, opts: SampleOptions) {
  const rng = new Rng(seed);
  const B = 500;
  const logits = tf.tensor2d(Array.from({ length: B }, () => row));
  const counts = new Array(row.length).fill(0);
  const logprobOf = new Map<number, number>();
  for (let i = 0; i < n / B; i++) {
    const r = await sampleTokens(logits, params, rng, opts);
    r.tokens.forEach((t, b) => {
      counts[t]++;
      logprobOf.set(t, r.logprobs[b]);
    });
  }
  logits.dispose();
  return { freq: counts.map((c) => c / n), logprobOf };
}

// Every path: the host's (whole logits read) walking ids (its default) or ranks, and the candidates'
// (statistics on the backend, rank walk).
const PATHS: [string, SampleOptions][] = [
  ["host, id walk", { onDevice: false }],
  ["host, rank walk", RANK_REFERENCE],
  ["candidates", { onDevice: true }],
];
describe("greedy on wasm", () => {
  it("is the heap draw kernel's argmax: sampleRow's tokens (lowest id among equal largest logits), nothing read", async () => {
    const B = 6,
      V = 151936;
    const data = structuredLogits(B, V, 4); // row 3 holds two equal maxima
    data[2 * V + 9] = NaN;
    const logits = tf.tensor2d(data, [B, V]);
    const r = await sampleTokens(logits, { temperature: 0 }, new Rng(0));
    expect(r.readFloats).toBe(0);
    expect(r.tokens).toEqual(
      Array.from({ length: B }, (_, b) => sampleRow(data.subarray(b * V, (b + 1) * V), { temperature: 0 }, 0).token),
    );
    expect(r.tokens[3]).toBe(7); // the lower of the two maxima (ids 7 and V − 3)
    logits.dispose();
  });
});

describe.each(PATHS)("sampleTokens (%s)", (_, opts) => {
  const row = [0.5, 2.0, -1.0, 1.2, 0.0];

  it("temperature 0 is argmax with the lowest id on ties", async () => {
    const logits = tf.tensor2d([
      [1, 3, 3, 0],
      [5, 1, 1, 5],
      [-2, -1, -3, -1.5],
    ]);
    const r = await sampleTokens(logits, { temperature: 0 }, new Rng(0), opts);
    expect(r.tokens).toEqual([1, 0, 1]);
    expect(r.logprobs).toEqual([0, 0, 0]);
    logits.dispose();
  });

  it("top-k 1 and a tiny top-p both give the argmax with sampling log-prob 0", async () => {
    const logits = tf.tensor2d([row, [3, 1, 4, 1, 5]]);
    for (const params of [
      { temperature: 0.7, topK: 1 },
      { temperature: 1.3, topP: 1e-6 },
    ]) {
      const r = await sampleTokens(logits, params, new Rng(5), opts);
      expect(r.tokens).toEqual([1, 4]);
      r.logprobs.forEach((v) => expect(v).toBeCloseTo(0, 6));
    }
    logits.dispose();
  });

  it("empirical frequencies match softmax(logits / T) and logprobs are its logs", async () => {
    const T = 0.7;
    const p = logSoftmax(row, T).map(Math.exp);
    const { freq, logprobOf } = await frequencies(row, 20000, { temperature: T }, 1, opts);
    freq.forEach((f, i) => expect(Math.abs(f - p[i])).toBeLessThan(0.012));
    for (const [t, lp] of logprobOf) expect(lp).toBeCloseTo(Math.log(p[t]), 5);
  });

  it("top-k and top-p sample from the renormalised truncated distribution", async () => {
    const p = logSoftmax(row).map(Math.exp); // order by prob: 1, 3, 0, 4, 2
    // top-k 3 keeps {1, 3, 0}
    const k3 = [1, 3, 0];
    const zk = k3.reduce((a, i) => a + p[i], 0);
    const a = await frequencies(row, 20000, { temperature: 1, topK: 3 }, 2, opts);
    a.freq.forEach((f, i) => expect(Math.abs(f - (k3.includes(i) ? p[i] / zk : 0))).toBeLessThan(0.012));
    for (const [t, lp] of a.logprobOf) expect(lp).toBeCloseTo(Math.log(p[t] / zk), 5);
    // top-p 0.85: p1≈0.54, +p3≈0.24 → 0.78 < 0.85, +p0≈0.12 → 0.90: keeps {1, 3, 0}
    const nuc = [1, 3, 0];
    expect(p[1] + p[3]).toBeLessThan(0.85);
    expect(p[1] + p[3] + p[0]).toBeGreaterThan(0.85);
    const b = await frequencies(row, 20000, { temperature: 1, topP: 0.85 }, 3, opts);
    b.freq.forEach((f, i) => expect(Math.abs(f - (nuc.includes(i) ? p[i] / zk : 0))).toBeLessThan(0.012));
    // top-k 3, then top-p 0.85 of the top-3 mass (Hugging Face's order): 0.78 ≥ 0.85·0.90 → {1, 3}
    expect(p[1] + p[3]).toBeGreaterThan(0.85 * zk);
    const c = await frequencies(row, 10000, { temperature: 1, topK: 3, topP: 0.85 }, 4, opts);
    const z2 = p[1] + p[3];
    c.freq.forEach((f, i) => expect(Math.abs(f - ([1, 3].includes(i) ? p[i] / z2 : 0))).toBeLessThan(0.015));
    for (const [t, lp] of c.logprobOf) expect(lp).toBeCloseTo(Math.log(p[t] / z2), 5);
  });

  it("widens the top-p candidate set when the nucleus is larger than the first guess", async () => {
    const V = 1000;
    const logits = tf.zeros([4, V]) as tf.Tensor2D; // flat: the 0.9 nucleus holds ~900 tokens
    const r = await sampleTokens(logits, { temperature: 1, topP: 0.9 }, new Rng(9), opts);
    for (let b = 0; b < 4; b++) {
      expect(r.tokens[b]).toBeLessThan(902); // ties sort lower ids first, so the nucleus is ids 0..~900
      expect(Math.abs(r.logprobs[b] + Math.log(900))).toBeLessThan(3e-3);
    }
    logits.dispose();
  });

  it("breaks ties by the lower id in top-k candidates and at the nucleus boundary", async () => {
    expect(topIndices(new Float32Array([1, 3, 3, 0, 3, 2]), 2)).toEqual([1, 2]);
    expect(topIndices(new Float32Array([1, 3, 3, 0, 3, 2]), 4)).toEqual([1, 2, 4, 5]);
    expect(topIndices(new Float32Array([0, 0, 0]), 3)).toEqual([0, 1, 2]);
    // p ∝ e^2, e, e, e, 1: top-p just above p0 needs exactly one of the tied tokens, the lowest id.
    const row = [2, 1, 1, 1, 0];
    const p = logSoftmax(row).map(Math.exp);
    const { freq, logprobOf } = await frequencies(row, 5000, { temperature: 1, topP: p[0] + 0.5 * p[1] }, 1, opts);
    expect(freq[0] + freq[1]).toBe(1);
    expect(Math.abs(freq[0] - p[0] / (p[0] + p[1]))).toBeLessThan(0.02);
    expect(logprobOf.get(1)).toBeCloseTo(Math.log(p[1] / (p[0] + p[1])), 5);
  });

  it("is reproducible from a seed and leaks no tensors", async () => {
    const logits = tf.tensor2d(Array.from({ length: 8 }, (_, b) => row.map((x) => x * (1 + b / 8))));
    const before = tf.memory().numTensors;
    const draw = async (seed: number, params: Parameters<typeof sampleTokens>[1]) => {
      const rng = new Rng(seed);
      const out: number[] = [];
      for (let i = 0; i < 3; i++) out.push(...(await sampleTokens(logits, params, rng, opts)).tokens);
      return out;
    };
    for (const params of [{ temperature: 1 }, { temperature: 0.8, topK: 3 }, { temperature: 1, topP: 0.9 }, { temperature: 0 }]) {
      expect(await draw(11, params)).toEqual(await draw(11, params));
    }
    expect(await draw(11, { temperature: 1 })).not.toEqual(await draw(12, { temperature: 1 }));
    expect(tf.memory().numTensors).toBe(before);
    logits.dispose();
  });

  it("rejects bad parameters with the value and what is accepted", async () => {
    const logits = tf.tensor2d([row]);
    await expect(sampleTokens(logits, { temperature: -1 }, new Rng(0), opts)).rejects.toThrow(/temperature -1 .*>= 0/);
    await expect(sampleTokens(logits, { temperature: 1, topP: 0 }, new Rng(0), opts)).rejects.toThrow(/topP 0 .*\(0, 1\]/);
    await expect(sampleTokens(logits, { temperature: 1, topK: 1.5 }, new Rng(0), opts)).rejects.toThrow(/topK 1.5/);
    logits.dispose();
  });
});

describe("the candidate path draws the host rank walk's tokens (wasm)", () => {
  it("same seed, same tokens, log-probs to float32 rounding, for every kind of row and option", async () => {
    const B = 12,
      V = 3000;
    const logits = tf.tensor2d(structuredLogits(B, V), [B, V]);
    const before = tf.memory().numTensors;
    for (const params of PARAM_SETS) {
      const device = await drawSteps(logits, params, { onDevice: true });
      expectSameDraws(device, await drawSteps(logits, params, RANK_REFERENCE), JSON.stringify(params));
      // The flat rows fall back to their whole row; the peaked ones are decided by their candidates.
      expect(device[0].readFloats).toBeGreaterThan(2 * V);
      expect(device[0].readFloats).toBeLessThan(B * V);
    }
    expect(tf.memory().numTensors).toBe(before);
    logits.dispose();
  });

  it("a non-finite row is a NonFiniteError on both paths", async () => {
    const logits = tf.tensor2d([
      [1, 2, 3],
      [NaN, NaN, NaN],
    ]);
    for (const onDevice of [false, true])
      await expect(sampleTokens(logits, { temperature: 1 }, new Rng(0), { onDevice })).rejects.toThrow(/largest logit of a sampled row/);
    logits.dispose();
  });

  it("reads B·(2 + 2K) floats per step, plus the whole row only for rows the candidates cannot decide", async () => {
    await expectCandidateReads(4, 5000);
  });
});

describe("the host sampler's draws for a seed are every earlier version's", () => {
  it("same logits and seed: the token ids main's sampler (before device sampling) gave, in every mode", async () => {
    // Expected ids computed with main's src/rollout/sampler.ts at 75e13f8 (the id-order walk, unchanged
    // since b1dafa2; before device sampling) on these
    // logits: 3 steps of 4 rows from Rng(17). They pin the published seeded runs (docs/performance.md) on
    // wasm/cpu; the rank walk (the device path's) gives other ids in the first three modes.
    const B = 4,
      V = 50;
    const data = new Float32Array(B * V).map((_, i) => {
      const b = (i / V) | 0,
        j = i % V;
      return Math.sin(j * 12.9898 + b * 78.233) * (1 + b) + (j % 7 === b ? 2 : 0);
    });
    const logits = tf.tensor2d(data, [B, V]);
    const cases: [Parameters<typeof sampleTokens>[1], number[]][] = [
      [{ temperature: 1 }, [35, 12, 23, 13, 3, 42, 16, 29, 14, 40, 37, 15]],
      [{ temperature: 0.7 }, [35, 15, 33, 13, 3, 43, 19, 31, 17, 43, 37, 27]],
      [{ temperature: 1, topP: 0.9 }, [35, 13, 23, 13, 2, 43, 9, 30, 14, 41, 37, 15]],
      [{ temperature: 0.8, topK: 5 }, [21, 43, 20, 45, 49, 15, 37, 28, 49, 29, 35, 45]],
      [{ temperature: 1.2, topK: 10, topP: 0.8 }, [7, 43, 35, 45, 49, 27, 20, 13, 49, 12, 49, 43]],
      [{ temperature: 0 }, [49, 43, 37, 45, 49, 43, 37, 45, 49, 43, 37, 45]],
    ];
    for (const [params, want] of cases) {
      const got = (await drawSteps(logits, params, {}, 3, 17)).flatMap((r) => r.tokens); // default: the host path on wasm
      expect(got, JSON.stringify(params)).toEqual(want);
    }
    const rank = (await drawSteps(logits, { temperature: 1 }, RANK_REFERENCE, 3, 17)).flatMap((r) => r.tokens);
    expect(rank).not.toEqual(cases[0][1]); // the two walks are different maps from seeds to tokens
    logits.dispose();
  });
});

describe("whole-vocabulary draws on the wasm heap", () => {
  it("give sampleRow's tokens and log-probs for the same uniforms, rows split over the threads; non-finite rows fail as before", async () => {
    const B = 16,
      V = 5000; // 80 K logits: split over the helper threads where there are any
    const rng = new Rng(3);
    const data = new Float32Array(B * V).map((_, i) => {
      const b = (i / V) | 0,
        j = i % V;
      if (b === 3 && j % 5 === 0) return -Infinity; // masked ids
      if (b === 4 && j === 77) return NaN; // a NaN among finite logits weighs nothing
      return (b % 4) * rng.normal() + (j === (b * 97) % V ? 12 : 0); // flat, spread and peaked rows
    });
    const logits = tf.tensor2d(data, [B, V]);
    await heapHelpersReady(tf.backend());
    for (const T of [1, 0.7, 1.3]) {
      const before = splitJobCount();
      const got = await sampleTokens(logits, { temperature: T }, new Rng(T * 10));
      expect(splitJobCount() - before).toBe(wasmThreads() > 1 ? 1 : 0);
      expect(got.readFloats).toBe(0); // drawn where the logits are
      const us = new Rng(T * 10);
      const want = Array.from({ length: B }, (_, b) => sampleRow(data.subarray(b * V, (b + 1) * V), { temperature: T }, us.next()));
      expect(got.tokens).toEqual(want.map((d) => d.token));
      expect(got.logprobs).toEqual(want.map((d) => d.logprob));
    }
    const bad = tf.tensor2d(
      data.map((x, i) => (i >= 2 * V && i < 3 * V ? NaN : x)),
      [B, V],
    );
    await expect(sampleTokens(bad, { temperature: 1 }, new Rng(1))).rejects.toThrow(/largest logit of a sampled row/);
    tf.dispose([logits, bad]);
  });
});
