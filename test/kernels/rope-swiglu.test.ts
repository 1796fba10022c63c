/** RoPE and SwiGLU kernels (src/kernels/rope-swiglu.ts): value and gradients against the tfjs-op forms on
 *  cpu and wasm, one kernel each way below the size limit, the op path above it, SwiGLU's gradient
 *  against central finite differences, flat tensor counts. */
import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { ropeTables } from "../../src/model/attention.ts";
import { rope, ropeOps, swiglu, swigluOps } from "../../src/kernels/rope-swiglu.ts";
import { Rng } from "../../src/util/rng.ts";

const randn = (n: number, seed: number, scale = 1) => {
  const r = new Rng(seed);
  return Float32Array.from({ length: n }, () => scale * r.normal());
};
const maxDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => Array.from(a).reduce((m, v, i) => Math.max(m, Math.abs(v - b[i])), 0);
const maxAbs = (a: ArrayLike<number>) => Math.max(1, ...Array.from(a, Math.abs));

// RoPE: x [B, T, heads, hd] with real tables; SwiGLU: gu [N, 2I]. loss = Σ y·c for a fixed random c.
const B = 2,
  T = 3,
  heads = 5,
  hd = 8,
  N = 4,
  I = 6;
const invFreq = Float32Array.from({ length: hd / 2 }, (_, i) => 1 / 10000 ** ((2 * i) / hd));
const tables = ropeTables([0, 1, 2, 7, 8, 9], invFreq);
const xs = randn(B * T * heads * hd, 1),
  cr = randn(B * T * heads * hd, 2),
  gus = randn(N * 2 * I, 3, 2),
  cs = randn(N * I, 4);

function ropeRun(f: typeof rope, rows = B) {
  return tf.tidy(() => {
    const x = tf.tensor4d(rows === B ? xs : Float32Array.from({ length: rows * T * heads * hd }, (_, i) => xs[i % xs.length]), [
      rows,
      T,
      heads,
      hd,
    ]);
    const tab = (a: Float32Array) =>
      tf.tensor4d(
        Float32Array.from({ length: rows * T * hd }, (_, i) => a[i % a.length]),
        [rows, T, 1, hd],
      );
    const cos = tab(tables.cos),
      sin = tab(tables.sin),
      c = tf.tensor4d(
        Float32Array.from({ length: x.size }, (_, i) => cr[i % cr.length]),
        x.shape,
      );
    const { value, grads } = tf.valueAndGrads((xx: tf.Tensor) => tf.sum(tf.mul(f(xx as tf.Tensor4D, cos, sin), c)) as tf.Scalar)([x]);
    return [f(x, cos, sin), value, grads[0]].map((t) => t.dataSync().slice());
  });
}
function swigluRun(f: typeof swiglu) {
  return tf.tidy(() => {
    const gu = tf.tensor2d(gus, [N, 2 * I]),
      c = tf.tensor2d(cs, [N, I]);
    const { value, grads } = tf.valueAndGrads((g: tf.Tensor) => tf.sum(tf.mul(f(g as tf.Tensor2D), c)) as tf.Scalar)([gu]);
    return [f(gu), value, grads[0]].map((t) => t.dataSync().slice());
  });
}

describe("RoPE and SwiGLU kernels", () => {
  it("match the tfjs-op forms in value and gradient, on cpu and wasm, one kernel each way", async () => {
    await initBackend("wasm");
    const refs = { rope: ropeRun(ropeOps), swiglu: swigluRun(swigluOps) };
    for (const backend of ["cpu", "wasm"]) {
      await tf.setBackend(backend);
      const got = { rope: ropeRun(rope), swiglu: swigluRun(swiglu) };
      for (const op of ["rope", "swiglu"] as const)
        ["y", "loss", "dx"].forEach((name, i) =>
          expect(maxDiff(got[op][i], refs[op][i]), `${backend} ${op} ${name}`).toBeLessThan(2e-6 * maxAbs(refs[op][i])),
        );
      const before = tf.memory().numTensors;
      const gu = tf.tensor2d(gus, [N, 2 * I]),
        x = tf.tensor4d(xs, [B, T, heads, hd]),
        cos = tf.tensor4d(tables.cos, [B, T, 1, hd]),
        sin = tf.tensor4d(tables.sin, [B, T, 1, hd]);
      const prof = await tf.profile(() => {
        const a = tf.valueAndGrads((g: tf.Tensor) => tf.sum(swiglu(g as tf.Tensor2D)) as tf.Scalar)([gu]);
        const b = tf.valueAndGrads((xx: tf.Tensor) => tf.sum(rope(xx as tf.Tensor4D, cos, sin)) as tf.Scalar)([x]);
        tf.dispose([a.value, ...a.grads, b.value, ...b.grads]);
      });
      const names = prof.kernels.map((k) => k.name);
      expect(
        names.filter((n) => n.startsWith("Marl")),
        backend,
      ).toEqual(["MarlSwiglu", "MarlSwigluGrad", "MarlRope", "MarlRope"]);
      expect(
        names.filter((n) => ["SplitV", "Sigmoid", "Concat"].includes(n)),
        backend,
      ).toEqual([]);
      tf.dispose([gu, x, cos, sin]);
      expect(tf.memory().numTensors).toBe(before);
    }
    await tf.setBackend("wasm");
  });

  it("above the size limit (prefill, training) the op path runs", async () => {
    await initBackend("wasm");
    const rows = 2000; // 2000 × 3 × 5 × 8 = 240 000 elements
    const prof = await tf.profile(() => {
      ropeRun(rope, rows);
    });
    const names = prof.kernels.map((k) => k.name);
    expect(names).not.toContain("MarlRope");
    expect(names).toContain("Concat");
  });

  it("on wasm, SwiGLU with I a multiple of 4 runs on the heap module's vector kernel at any size: value and gradient within float32 rounding of float64, NaN kept, silu's ends", async () => {
    await initBackend("wasm");
    const rows = 150,
      I4 = 344; // 103 200 outputs: above the JS kernel's limit and the thread split's
    const g = Float32Array.from({ length: rows * 2 * I4 }, (_, i) => Math.sin(i * 1.7) * (i % 97 === 0 ? 120 : 9));
    g[5] = NaN;
    g[6] = -0;
    g[7] = 1e-30;
    g[8] = 87.5;
    g[9] = -88.5;
    const c = Float32Array.from({ length: rows * I4 }, (_, i) => Math.cos(i));
    const before = tf.memory().numTensors;
    let y: Float32Array = new Float32Array(),
      d: Float32Array = new Float32Array();
    const prof = await tf.profile(() => {
      [y, d] = tf.tidy(() => {
        const gu = tf.tensor2d(g, [rows, 2 * I4]),
          ct = tf.tensor2d(c, [rows, I4]);
        const { grads } = tf.valueAndGrads((x: tf.Tensor) => tf.sum(tf.mul(swiglu(x as tf.Tensor2D), ct)) as tf.Scalar)([gu]);
        return [swiglu(gu).dataSync().slice() as Float32Array, grads[0].dataSync().slice() as Float32Array];
      });
    });
    expect(tf.memory().numTensors).toBe(before);
    const names = prof.kernels.map((k) => k.name);
    expect(names.filter((n) => n.startsWith("Marl"))).toEqual(["MarlSwiglu", "MarlSwigluGrad", "MarlSwiglu"]);
    expect(names.filter((n) => ["SplitV", "Sigmoid"].includes(n))).toEqual([]);
    const bad: string[] = [];
    for (let n = 0; n < rows; n++)
      for (let j = 0; j < I4; j++) {
        const a = g[n * 2 * I4 + j],
          u = g[n * 2 * I4 + I4 + j],
          w = c[n * I4 + j],
          s = 1 / (1 + Math.exp(-a));
        const got = [y[n * I4 + j], d[n * 2 * I4 + j], d[n * 2 * I4 + I4 + j]];
        if (Number.isNaN(a)) {
          if (!got.every(Number.isNaN)) bad.push(`row ${n}, column ${j}: NaN gate gave ${got}`);
          continue;
        }
        // float32 rounding of each term (the gate's gradient cancels near g ≈ −1.28); below −87 the
        // clamped exp moves values of ~1e-37
        const want = [a * s * u, w * u * s * (1 + a * (1 - s)), w * a * s];
        const tol = [Math.abs(a * s * u), Math.abs(w * u * s) * (1 + Math.abs(a)), Math.abs(w * a * s)].map((t) => 1e-6 * t + 1e-35);
        want.forEach((x, i) => {
          if (!(Math.abs(got[i] - x) <= tol[i])) bad.push(`row ${n}, column ${j}, gate ${a}, output ${i}: ${got[i]} vs ${x}`);
        });
      }
    expect(bad.slice(0, 5)).toEqual([]);
    // A width that is not a multiple of 4 takes the op path at this size.
    const odd = await tf.profile(() => {
      tf.tidy(() => {
        swiglu(tf.zeros([20000, 12]));
      });
    });
    expect(odd.kernels.map((k) => k.name)).toContain("Sigmoid");
  });

  it("SwiGLU's gradient agrees with central finite differences (float64 on the host)", async () => {
    await initBackend("wasm");
    const [, , dgu] = swigluRun(swiglu);
    const loss = (g: Float64Array) => {
      let s = 0;
      for (let n = 0; n < N; n++)
        for (let j = 0; j < I; j++) {
          const a = g[n * 2 * I + j];
          s += (a / (1 + Math.exp(-a))) * g[n * 2 * I + I + j] * cs[n * I + j];
        }
      return s;
    };
    const g = Float64Array.from(gus),
      h = 1e-5;
    for (const k of [0, 3, 5, 6, 11, 13, 30, 47]) {
      const o = g[k];
      g[k] = o + h;
      const up = loss(g);
      g[k] = o - h;
      const dn = loss(g);
      g[k] = o;
      expect(dgu[k], `dgu[${k}]`).toBeCloseTo((up - dn) / (2 * h), 3);
    }
  });
});
