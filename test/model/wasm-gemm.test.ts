/** The wasm BatchMatMul kernel (src/model/wasm-gemm.ts): plain and batched products against a float64
 *  reference and tfjs' own kernel, on every remainder of rows (4 per block) and columns (8 per panel),
 *  K of 1, empty products, broadcast batches; transposed products still reach tfjs' kernel; no tensor
 *  is left behind. The threaded split is covered by wasm-threads.test.ts (1 and 2 threads bit-equal). */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/backend.ts";
import { useWasmGemm } from "../../src/model/wasm-gemm.ts";
import { Rng } from "../../src/util/rng.ts";

const randn = (n: number, seed: number) => { const r = new Rng(seed); return Float32Array.from({ length: n }, () => r.normal()); };

/** C[s] = A[s or 0] · B[s or 0] in float64. */
function reference(a: Float32Array, b: Float32Array, batchA: number, batchB: number, M: number, K: number, N: number): Float64Array {
  const batch = Math.max(batchA, batchB), out = new Float64Array(batch * M * N);
  for (let s = 0; s < batch; s++) {
    const oa = (batchA === 1 ? 0 : s) * M * K, ob = (batchB === 1 ? 0 : s) * K * N;
    for (let i = 0; i < M; i++)
      for (let j = 0; j < N; j++) {
        let t = 0;
        for (let k = 0; k < K; k++) t += a[oa + i * K + k] * b[ob + k * N + j];
        out[(s * M + i) * N + j] = t;
      }
  }
  return out;
}

describe("wasm matmul kernel", () => {
  beforeAll(async () => {
    await initBackend("wasm");
  });
  afterAll(() => useWasmGemm(true));

  it("matches a float64 reference on every row and column remainder, K = 1, and batches", () => {
    const cases: [number[], number[]][] = [];
    for (const M of [1, 2, 3, 4, 5, 7, 9]) for (const N of [1, 5, 8, 13, 16, 27]) cases.push([[M, 11], [11, N]]);
    cases.push([[6, 1], [1, 19]], [[33, 64], [64, 40]], [[3, 5, 24], [3, 24, 17]], [[2, 7, 9], [1, 9, 16]], [[1, 6, 9], [4, 9, 8]], [[4, 2, 3, 8], [4, 2, 8, 9]], [[5, 300], [300, 24]]);
    const before = tf.memory().numTensors;
    cases.forEach(([sa, sb], n) => {
      const a = randn(sa.reduce((p, d) => p * d, 1), 2 * n + 1), b = randn(sb.reduce((p, d) => p * d, 1), 2 * n + 2);
      const M = sa[sa.length - 2], K = sa[sa.length - 1], N = sb[sb.length - 1];
      const batchA = sa.slice(0, -2).reduce((p, d) => p * d, 1), batchB = sb.slice(0, -2).reduce((p, d) => p * d, 1);
      const ref = reference(a, b, batchA, batchB, M, K, N);
      const { shape, got } = tf.tidy(() => {
        const c = tf.matMul(tf.tensor(a, sa), tf.tensor(b, sb));
        return { shape: c.shape, got: c.dataSync() };
      });
      expect(shape, `${sa} · ${sb}`).toEqual([...(batchA >= batchB ? sa : sb).slice(0, -2), M, N]);
      const worst = Array.from(got).reduce((m, x, i) => Math.max(m, Math.abs(x - ref[i]) / Math.sqrt(K)), 0);
      expect(worst, `${sa} · ${sb}`).toBeLessThan(1e-5);
    });
    expect(tf.memory().numTensors).toBe(before);
  });

  it("agrees with tfjs' own kernel on the bench's shapes, and an empty product is empty", () => {
    for (const [M, K, N] of [[64, 256, 1376], [8, 688, 256], [37, 256, 512]]) {
      const a = tf.tensor2d(randn(M * K, M), [M, K]), b = tf.tensor2d(randn(K * N, N), [K, N]);
      const ours = tf.matMul(a, b).dataSync();
      useWasmGemm(false);
      const theirs = tf.matMul(a, b).dataSync();
      useWasmGemm(true);
      const worst = Array.from(ours).reduce((m, x, i) => Math.max(m, Math.abs(x - theirs[i])), 0);
      expect(worst, `${M}×${K}×${N}`).toBeLessThan(1e-5 * Math.sqrt(K));
      tf.dispose([a, b]);
    }
    const e = tf.matMul(tf.zeros([0, 4]), tf.zeros([4, 3]));
    expect(e.shape).toEqual([0, 3]);
    const z = tf.matMul(tf.zeros([2, 0]), tf.zeros([0, 3]));
    expect(Array.from(z.dataSync())).toEqual([0, 0, 0, 0, 0, 0]);
  });

  it("leaves transposed products to tfjs' kernel, with the same results", () => {
    const a = tf.tensor2d(randn(6 * 5, 7), [6, 5]), b = tf.tensor2d(randn(9 * 5, 8), [9, 5]);
    const viaT = tf.matMul(a, b, false, true).dataSync();
    const plain = tf.matMul(a, tf.transpose(b)).dataSync();
    const worst = Array.from(viaT).reduce((m, x, i) => Math.max(m, Math.abs(x - plain[i])), 0);
    expect(worst).toBeLessThan(1e-5);
  });

  it("keeps tensor counts flat over repeated products", () => {
    const a = tf.tensor2d(randn(20 * 30, 9), [20, 30]), b = tf.tensor2d(randn(30 * 44, 10), [30, 44]);
    tf.tidy(() => { tf.matMul(a, b); });
    const before = tf.memory().numTensors;
    for (let i = 0; i < 5; i++) tf.tidy(() => { tf.matMul(tf.matMul(a, b), tf.transpose(b)); });
    expect(tf.memory().numTensors).toBe(before);
    tf.dispose([a, b]);
  });
});
