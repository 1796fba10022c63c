import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { rmsNorm, rmsNormGradInto, rmsNormInto, rmsNormOps } from "../../src/kernels/rmsnorm.ts";
import { Rng } from "../../src/util/rng.ts";

const randn = (n: number, seed: number, scale = 1) => {
  const r = new Rng(seed);
  return Float32Array.from({ length: n }, () => scale * r.normal());
};
const maxDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => Array.from(a).reduce((m, v, i) => Math.max(m, Math.abs(v - b[i])), 0);

describe("rmsNorm kernels", () => {
  // loss = Σ y·c for fixed random c: its gradients are the backward pass with dy = c.
  const N = 5,
    H = 24,
    eps = 1e-6;
  const xs = randn(N * H, 1, 3),
    ws = randn(H, 2),
    cs = randn(N * H, 3);
  const run = (f: typeof rmsNorm) =>
    tf.tidy(() => {
      const x = tf.tensor2d(xs, [N, H]),
        w = tf.tensor1d(ws),
        c = tf.tensor2d(cs, [N, H]);
      const { value, grads } = tf.valueAndGrads(
        (xx: tf.Tensor, ww: tf.Tensor) => tf.sum(tf.mul(f(xx as tf.Tensor2D, ww as tf.Tensor1D, eps), c)) as tf.Scalar,
      )([x, w]);
      return [f(x, w, eps), value, ...grads].map((t) => t.dataSync().slice());
    });

  it("match the tfjs-op form in value and in both gradients, on cpu and wasm, one kernel each way", async () => {
    await initBackend("wasm");
    const ref = run(rmsNormOps);
    for (const backend of ["cpu", "wasm"]) {
      await tf.setBackend(backend);
      const got = run(rmsNorm);
      ["y", "loss", "dx", "dw"].forEach((name, i) =>
        expect(maxDiff(got[i], ref[i]), `${backend} ${name}`).toBeLessThan(2e-5 * Math.max(1, ...Array.from(ref[i], Math.abs))),
      );
      const x = tf.tensor2d(xs, [N, H]),
        w = tf.tensor1d(ws);
      const before = tf.memory().numTensors;
      const prof = await tf.profile(() => {
        const { value, grads } = tf.valueAndGrads(
          (xx: tf.Tensor, ww: tf.Tensor) => tf.sum(rmsNorm(xx as tf.Tensor2D, ww as tf.Tensor1D, eps)) as tf.Scalar,
        )([x, w]);
        tf.dispose([value, ...grads]);
      });
      const names = prof.kernels.map((k) => k.name);
      expect(
        names.filter((n) => n.startsWith("MarlRmsNorm")),
        backend,
      ).toEqual(["MarlRmsNorm", "MarlRmsNormGrad"]);
      expect(
        names.filter((n) => ["Square", "Mean", "Rsqrt"].includes(n)),
        backend,
      ).toEqual([]);
      expect(tf.memory().numTensors).toBe(before);
      tf.dispose([x, w]);
    }
    await tf.setBackend("wasm");
  });

  it("on wasm, any number of rows runs on the heap module's vector kernels (rows split over threads, dw summed by blocks of 64) within float32 rounding of the float64 JS kernels", async () => {
    await initBackend("wasm");
    const rows = 300,
      W = 256; // 76,800 elements: split over the helper threads; 5 blocks of dw
    const x = randn(rows * W, 4, 2),
      w = randn(W, 5),
      c = randn(rows * W, 6);
    const before = tf.memory().numTensors;
    let got: Float32Array[] = [];
    const prof = await tf.profile(() => {
      got = tf.tidy(() => {
        const xt = tf.tensor2d(x, [rows, W]),
          wt = tf.tensor1d(w),
          ct = tf.tensor2d(c, [rows, W]);
        const { grads } = tf.valueAndGrads(
          (xx: tf.Tensor, ww: tf.Tensor) => tf.sum(tf.mul(rmsNorm(xx as tf.Tensor2D, ww as tf.Tensor1D, eps), ct)) as tf.Scalar,
        )([xt, wt]);
        return [rmsNorm(xt, wt, eps), ...grads].map((t) => t.dataSync().slice() as Float32Array);
      });
    });
    expect(prof.kernels.map((k) => k.name).filter((n) => n.startsWith("MarlRmsNorm"))).toEqual([
      "MarlRmsNorm",
      "MarlRmsNormGrad",
      "MarlRmsNorm",
    ]);
    expect(tf.memory().numTensors).toBe(before);
    const y = new Float32Array(rows * W),
      dx = new Float32Array(rows * W),
      dw = new Float32Array(W);
    rmsNormInto(y, x, w, W, eps);
    rmsNormGradInto(dx, dw, x, w, c, W, eps);
    const scale = (a: Float32Array) => Math.max(...Array.from(a, Math.abs));
    expect(maxDiff(got[0], y) / scale(y)).toBeLessThan(1e-6);
    expect(maxDiff(got[1], dx) / scale(dx)).toBeLessThan(1e-6);
    expect(maxDiff(got[2], dw) / scale(dw)).toBeLessThan(1e-6);
  });

  it("gradients agree with central finite differences (float64 on the host)", async () => {
    await initBackend("wasm");
    const got = run(rmsNorm);
    const loss = (x: Float64Array, w: Float64Array) => {
      let s = 0;
      for (let i = 0; i < N; i++) {
        let ss = 0;
        for (let j = 0; j < H; j++) ss += x[i * H + j] ** 2;
        const r = 1 / Math.sqrt(ss / H + eps);
        for (let j = 0; j < H; j++) s += x[i * H + j] * r * w[j] * cs[i * H + j];
      }
      return s;
    };
    const x = Float64Array.from(xs),
      w = Float64Array.from(ws),
      h = 1e-5;
    const fd = (v: Float64Array, k: number) => {
      const o = v[k];
      v[k] = o + h;
      const up = loss(x, w);
      v[k] = o - h;
      const dn = loss(x, w);
      v[k] = o;
      return (up - dn) / (2 * h);
    };
    for (const k of [0, 7, 23, 50, 119]) expect(got[2][k], `dx[${k}]`).toBeCloseTo(fd(x, k), 3);
    for (const k of [0, 5, 23]) expect(got[3][k], `dw[${k}]`).toBeCloseTo(fd(w, k), 3);
  });
});
