/** The log-prob kernels (src/kernels/logprob.ts) on wasm against their tfjs-op forms: log p(target),
 *  entropy and the logits' gradient, across a split over the helper threads, logits with a wide range
 *  and a vocabulary that is not a multiple of 4 (the op path); flat tensor counts. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { dLogits, dLogitsOps, logpEntropy, logpEntropyOps } from "../../src/kernels/logprob.ts";
import { Rng } from "../../src/util/rng.ts";

const maxAbsDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => Array.from(a).reduce((m, v, i) => Math.max(m, Math.abs(v - b[i])), 0);

function inputs(n: number, V: number, seed: number) {
  const r = new Rng(seed);
  // a few rows of large logits (a peaked distribution) beside ordinary ones
  const logits = Float32Array.from({ length: n * V }, (_, i) => r.normal() * (Math.floor(i / V) % 5 === 0 ? 30 : 3));
  const targets = Array.from({ length: n }, (_, i) => (i * 7919) % V);
  const dy = Float32Array.from({ length: 2 * n }, () => r.normal());
  return { logits, targets, dy };
}

function run(n: number, V: number, f: typeof logpEntropy, g: typeof dLogits) {
  const { logits, targets, dy } = inputs(n, V, n + V);
  return tf.tidy(() => {
    const x = tf.tensor2d(logits, [n, V]),
      d = tf.tensor2d(dy, [n, 2]);
    return [f(x, targets).dataSync().slice(), g(x, targets, d).dataSync().slice()];
  });
}

/** float64: per row [log p(target), entropy] and dlogits. */
function reference(n: number, V: number) {
  const { logits, targets, dy } = inputs(n, V, n + V);
  const lp: number[] = [],
    dl: number[] = [],
    scale: number[] = [];
  for (let r = 0; r < n; r++) {
    const row = Array.from(logits.subarray(r * V, (r + 1) * V)),
      m = Math.max(...row);
    const lse = m + Math.log(row.reduce((a, x) => a + Math.exp(x - m), 0)),
      p = row.map((x) => Math.exp(x - lse));
    lp.push(row[targets[r]] - lse, lse - p.reduce((a, q, i) => a + q * row[i], 0));
    for (let j = 0; j < V; j++) dl.push(dy[2 * r] * ((j === targets[r] ? 1 : 0) - p[j]));
    scale.push(Math.max(...row.map(Math.abs)));
  }
  return { lp, dl, scale, dy };
}

describe("log-prob kernels", () => {
  beforeAll(async () => {
    expect(await initBackend("wasm")).toBe("wasm");
  });

  it("agree with float64 to float32 rounding, one kernel each way, rows split over threads", async () => {
    for (const [n, V] of [
      [3, 8],
      [130, 512],
      [7, 10_000],
    ]) {
      const before = tf.memory().numTensors;
      const prof = await tf.profile(() => {
        run(n, V, logpEntropy, dLogits);
      });
      expect(
        prof.kernels.map((k) => k.name),
        `${n}×${V}`,
      ).toEqual(["MarlLogpEntropy", "MarlDLogits"]);
      expect(tf.memory().numTensors).toBe(before);
      const ref = reference(n, V);
      // log p and entropy relative to the row's largest logit, the gradient to dy; the op forms (other
      // backends) sum a row in one float32 accumulator and are off by up to 1.4e-5 at V = 10,000
      const err = ([lp, dl]: Float32Array[]) => [
        Math.max(...Array.from(lp, (x, i) => Math.abs(x - ref.lp[i]) / Math.max(1, ref.scale[i >> 1]))),
        Math.max(...Array.from(dl, (x, i) => Math.abs(x - ref.dl[i]) / Math.max(1e-3, Math.abs(ref.dy[2 * Math.floor(i / V)])))),
      ];
      const [kLp, kDl] = err(run(n, V, logpEntropy, dLogits) as Float32Array[]),
        [oLp, oDl] = err(run(n, V, logpEntropyOps, dLogitsOps) as Float32Array[]);
      expect([kLp < 4e-6, kDl < 4e-7], `kernels ${n}×${V}: ${kLp}, ${kDl}`).toEqual([true, true]);
      expect([oLp < 3e-5, oDl < 4e-7], `ops ${n}×${V}: ${oLp}, ${oDl}`).toEqual([true, true]);
    }
  });

  it("a vocabulary that is not a multiple of 4 takes the op path; a bad target is a clear error", async () => {
    const prof = await tf.profile(() => {
      run(2, 6, logpEntropy, dLogits);
    });
    expect(prof.kernels.map((k) => k.name)).not.toContain("MarlLogpEntropy");
    const x = tf.zeros([2, 8]) as tf.Tensor2D;
    expect(() => logpEntropy(x, [0, 8])).toThrow("log-probs: target 8 is not a token id in [0, 8)");
    expect(() => logpEntropy(x, [0])).toThrow("log-probs: 1 targets for 2 rows of logits");
    x.dispose();
  });
});
