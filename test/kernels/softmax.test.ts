/** The softmax kernels (src/kernels/softmax.ts) on wasm against tf.softmax and its gradient: attention
 *  shapes with masked scores (exactly 0, as with tfjs), a split over the helper threads, a last axis
 *  that is not a multiple of 4 (tf.softmax), flat tensor counts. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { MASKED } from "../../src/model/attention.ts";
import { softmax } from "../../src/kernels/softmax.ts";
import { Rng } from "../../src/util/rng.ts";

const maxAbsDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => Array.from(a).reduce((m, v, i) => Math.max(m, Math.abs(v - b[i])), 0);

function run(f: (x: tf.Tensor) => tf.Tensor, shape: number[], seed: number) {
  const r = new Rng(seed),
    n = shape.reduce((p, d) => p * d, 1),
    S = shape[shape.length - 1];
  // causal-style masking: in row i, keys after i mod S are masked
  const xs = Float32Array.from({ length: n }, (_, i) => (i % S > Math.floor(i / S) % S ? MASKED : 4 * r.normal()));
  const cs = Float32Array.from({ length: n }, () => r.normal());
  return tf.tidy(() => {
    const x = tf.tensor(xs, shape),
      c = tf.tensor(cs, shape);
    const { grads } = tf.valueAndGrads((xx: tf.Tensor) => tf.sum(tf.mul(f(xx), c)) as tf.Scalar)([x]);
    return {
      y: f(x).dataSync().slice() as Float32Array,
      dx: grads[0].dataSync().slice() as Float32Array,
      masked: xs.map((v) => (v === MASKED ? 1 : 0)),
    };
  });
}

describe("softmax kernels", () => {
  beforeAll(async () => {
    expect(await initBackend("wasm")).toBe("wasm");
  });

  it("match tf.softmax and its gradient within float32 rounding, masked scores exactly 0, one kernel each way", async () => {
    for (const shape of [
      [2, 3, 8],
      [4, 4, 64, 64],
      [1, 2, 3, 100],
    ]) {
      const before = tf.memory().numTensors;
      const prof = await tf.profile(() => {
        run(softmax, shape, 1);
      });
      const names = prof.kernels.map((k) => k.name);
      const S = shape[shape.length - 1];
      if (S % 4 === 0) {
        expect(
          names.filter((n) => n.startsWith("MarlSoftmax")),
          `${shape}`,
        ).toEqual(["MarlSoftmax", "MarlSoftmaxGrad", "MarlSoftmax"]);
        expect(names, `${shape}`).not.toContain("Softmax");
      } else expect(names, `${shape}`).toContain("Softmax");
      expect(tf.memory().numTensors).toBe(before);
      const got = run(softmax, shape, 1),
        ref = run((x) => tf.softmax(x), shape, 1);
      expect(maxAbsDiff(got.y, ref.y), `${shape} y`).toBeLessThan(1e-6);
      expect(maxAbsDiff(got.dx, ref.dx), `${shape} dx`).toBeLessThan(2e-6 * Math.max(1, ...Array.from(ref.dx, Math.abs)));
      expect(
        Array.from(got.y).filter((v, i) => got.masked[i] && v !== 0),
        `${shape} masked`,
      ).toEqual([]);
      // rows sum to 1
      for (let r = 0; r < got.y.length / S; r++) expect(got.y.subarray(r * S, (r + 1) * S).reduce((a, v) => a + v, 0)).toBeCloseTo(1, 5);
    }
  });
});
