/** The wasm BatchMatMul kernel (src/kernels/wasm/gemm.ts): plain and batched products against a float64
 *  reference and tfjs' own kernel, in both builds of the heap module (simd128, and relaxed where the
 *  runtime has it), on every remainder of rows (4 or 6 per block) and columns (8 per panel),
 *  K of 1, empty products, broadcast batches and transposed operands, with B read in place and packed,
 *  and the product stored transposed (XWT); no tensor is left behind, and a tall product split by rows over the threads. The threaded splits'
 *  bits are covered by wasm-threads.test.ts (1 and 2 threads bit-equal). */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { setPackRows, splitProductCount, heapHelpersReady } from "../../src/kernels/wasm/heap.ts";
import { relaxedSimdAvailable, setWasmSimd, wasmSimd, WASM_SIMD_ENV, type WasmSimd } from "../../src/kernels/wasm/heap-build.ts";
import { useWasmGemm } from "../../src/kernels/wasm/gemm.ts";
import { matMulXWT, XWT } from "../../src/kernels/matmul.ts";
import { wasmThreads } from "../../src/kernels/wasm/threads.ts";
import { Rng } from "../../src/util/rng.ts";

const randn = (n: number, seed: number) => {
  const r = new Rng(seed);
  return Float32Array.from({ length: n }, () => r.normal());
};

/** C[s] = A[s or 0] · B[s or 0] in float64. */
function reference(a: Float32Array, b: Float32Array, batchA: number, batchB: number, M: number, K: number, N: number): Float64Array {
  const batch = Math.max(batchA, batchB),
    out = new Float64Array(batch * M * N);
  for (let s = 0; s < batch; s++) {
    const oa = (batchA === 1 ? 0 : s) * M * K,
      ob = (batchB === 1 ? 0 : s) * K * N;
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
  let defaultBuild: WasmSimd;
  beforeAll(async () => {
    await initBackend("wasm");
    defaultBuild = wasmSimd();
  });
  afterAll(() => {
    useWasmGemm(true);
    setPackRows(32);
    setWasmSimd(defaultBuild);
  });

  it("runs the relaxed-SIMD build where this runtime validates relaxed SIMD (always from Node 22), else simd128", () => {
    if (process.env[WASM_SIMD_ENV]) return; // a build asked for by name (the simd128 pass of .ci/run)
    expect(wasmSimd()).toBe(relaxedSimdAvailable() ? "relaxed" : "simd128");
    if (Number(process.versions.node.split(".")[0]) >= 22) expect(wasmSimd()).toBe("relaxed");
  });

  const builds: WasmSimd[] = ["simd128", ...(relaxedSimdAvailable() ? ["relaxed" as const] : [])];
  it.each(
    builds.flatMap((build) => [
      [build, "in place", Infinity],
      [build, "packed", 1],
    ]) as [WasmSimd, string, number][],
  )(
    "%s build: matches a float64 reference on every row and column remainder, K = 1, batches and transposed operands (B %s)",
    async (build, _, packRows) => {
      setWasmSimd(build); // a new engine: its helper threads start in the background
      await heapHelpersReady(tf.backend());
      setPackRows(packRows);
      const cases: [number[], number[]][] = [];
      for (const M of [1, 2, 3, 4, 5, 6, 7, 9, 11, 13])
        for (const N of [1, 5, 8, 13, 16, 27, 40, 75])
          // 1 or 2 rows of B in place: wide blocks of 32 or 16, then 8-column ones
          cases.push([
            [M, 11],
            [11, N],
          ]);
      cases.push(
        [
          [6, 1],
          [1, 19],
        ],
        [
          [33, 64],
          [64, 40],
        ],
        [
          [3, 5, 24],
          [3, 24, 17],
        ],
        [
          [2, 7, 9],
          [1, 9, 16],
        ],
        [
          [1, 6, 9],
          [4, 9, 8],
        ],
        [
          [4, 2, 3, 8],
          [4, 2, 8, 9],
        ],
        [
          [5, 300],
          [300, 24],
        ],
        [
          [6, 2500],
          [2500, 20],
        ],
        [
          [1030, 1024],
          [1024, 13],
        ],
        [
          [4, 96, 128],
          [4, 128, 96],
        ],
        [
          [3, 100, 130],
          [1, 130, 45],
        ],
      ); // [6, 2500]: K in 3 blocks; [1030, 1024] · [1024, 13]: split by rows over the threads (a decode step's shape);
      // the batches of 4 and 3 (B shared, 5 edge columns): split by whole slices over the threads
      const swapLast = (t: tf.Tensor) =>
        tf.transpose(
          t,
          [...t.shape.keys()].map((i, _, all) => (i < all.length - 2 ? i : 2 * all.length - 3 - i)),
        );
      const before = tf.memory().numTensors,
        { rows: rowSplits, slices: sliceSplits } = splitProductCount();
      cases.forEach(([sa, sb], n) => {
        const a = randn(
            sa.reduce((p, d) => p * d, 1),
            2 * n + 1,
          ),
          b = randn(
            sb.reduce((p, d) => p * d, 1),
            2 * n + 2,
          );
        const M = sa[sa.length - 2],
          K = sa[sa.length - 1],
          N = sb[sb.length - 1];
        const batchA = sa.slice(0, -2).reduce((p, d) => p * d, 1),
          batchB = sb.slice(0, -2).reduce((p, d) => p * d, 1);
        const ref = reference(a, b, batchA, batchB, M, K, N);
        for (const [tA, tB] of [
          [false, false],
          [true, false],
          [false, true],
          [true, true],
        ]) {
          const what = `${tA ? "(" + sa + ")ᵀ" : sa} · ${tB ? "(" + sb + ")ᵀ" : sb}`;
          const { shape, got } = tf.tidy(() => {
            // a transposed operand is handed over stored transposed, with the flag that undoes it
            const ta = tf.tensor(a, sa),
              tb = tf.tensor(b, sb);
            const c = tf.matMul(tA ? tf.clone(swapLast(ta)) : ta, tB ? tf.clone(swapLast(tb)) : tb, tA, tB);
            return { shape: c.shape, got: c.dataSync() };
          });
          expect(shape, what).toEqual([...(batchA >= batchB ? sa : sb).slice(0, -2), M, N]);
          const worst = Array.from(got).reduce((m, x, i) => Math.max(m, Math.abs(x - ref[i]) / Math.sqrt(K)), 0);
          expect(worst, what).toBeLessThan(1e-5);
        }
      });
      expect(tf.memory().numTensors).toBe(before);
      if (wasmThreads() > 1) expect(splitProductCount().rows).toBeGreaterThan(rowSplits);
      if (wasmThreads() > 1) expect(splitProductCount().slices).toBeGreaterThan(sliceSplits);
    },
  );

  it("gives the same bits with B packed as with B read in place, over several packing chunks", () => {
    // K = 3000: 40 columns per 512 KB chunk, so N = 100 is chunks of 40, 40 and 16 plus 4 edge columns;
    // K = 20000 needs a larger buffer than any product before it (one panel is 640 KB); one and two
    // rows (and 7 and 8: 6 + 1, 6 + 2) take wide blocks in place and 8-column ones packed.
    for (const [M, K, N] of [
      [9, 3000, 100],
      [33, 64, 300],
      [4, 20000, 17],
      [1, 128, 8],
      [1, 300, 1000],
      [2, 300, 1000],
      [7, 64, 77],
      [8, 64, 77],
    ]) {
      const a = tf.tensor2d(randn(M * K, K), [M, K]),
        b = tf.tensor2d(randn(K * N, N), [K, N]);
      setPackRows(Infinity);
      const inPlace = tf.matMul(a, b).dataSync();
      setPackRows(1);
      const packed = tf.matMul(a, b).dataSync();
      expect(Array.from(packed), `${M}×${K}×${N}`).toEqual(Array.from(inPlace));
      tf.dispose([a, b]);
    }
    setPackRows(32);
  });

  it("agrees with tfjs' own kernel on the bench's shapes, and an empty product is empty", () => {
    for (const [M, K, N] of [
      [64, 256, 1376],
      [8, 688, 256],
      [37, 256, 512],
    ]) {
      const a = tf.tensor2d(randn(M * K, M), [M, K]),
        b = tf.tensor2d(randn(K * N, N), [K, N]);
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

  it("runs transposed products itself, bit-equal to the plain product of the materialised transpose", () => {
    const a = tf.tensor2d(randn(37 * 300, 7), [37, 300]),
      b = tf.tensor2d(randn(45 * 300, 8), [45, 300]),
      c = tf.tensor2d(randn(37 * 50, 9), [37, 50]);
    const pairs: [tf.Tensor, tf.Tensor][] = [
      [tf.matMul(a, b, false, true), tf.matMul(a, tf.transpose(b))], // [37, 45]
      [tf.matMul(a, c, true, false), tf.matMul(tf.transpose(a), c)], // [300, 50]
      [tf.matMul(c, b.slice([0, 0], [45, 37]), true, true), tf.matMul(tf.transpose(c), tf.transpose(b.slice([0, 0], [45, 37])))], // [50, 45]
    ];
    for (const [viaFlags, plain] of pairs) {
      expect(viaFlags.shape).toEqual(plain.shape);
      expect(Array.from(viaFlags.dataSync())).toEqual(Array.from(plain.dataSync()));
    }
    tf.dispose([a, b, c, ...pairs.flat()]);
  });

  it.each(builds)(
    "%s build: x · wᵀ with the output stored transposed as it is summed (XWT) is bit-equal to (w · xᵀ)ᵀ, near a float64 reference; matMulXWT takes it up to 64 rows",
    async (build) => {
      setWasmSimd(build);
      await heapHelpersReady(tf.backend());
      const before = tf.memory().numTensors,
        { rows: rowSplits } = splitProductCount();
      // x rows (the product's columns): every remainder of 8 and a decode batch; w rows: every remainder
      // of the row blocks, and 1030 (split by rows over the threads); K 2500: three blocks of K, each
      // later one starting from the sums stored (transposed) before it
      const cases: [number, number, number][] = [];
      for (const M of [1, 2, 5, 7, 8, 9, 13, 32]) for (const N of [1, 3, 6, 7, 11, 13, 40]) cases.push([M, 11, N]);
      cases.push([5, 2500, 13], [16, 2500, 13], [9, 2500, 20], [32, 896, 1030], [17, 64, 1030], [64, 40, 75]);
      cases.forEach(([M, K, N], n) => {
        const xs = randn(M * K, 3 * n + 1),
          ws = randn(N * K, 3 * n + 2);
        const what = `[${M}, ${K}] · [${N}, ${K}]ᵀ`;
        const [got, plain] = tf.tidy(() => {
          const x = tf.tensor2d(xs, [M, K]),
            w = tf.tensor2d(ws, [N, K]);
          return [tf.engine().runKernel(XWT, { x, w }) as tf.Tensor, tf.transpose(tf.matMul(w, x, false, true))].map((t) => {
            expect(t.shape, what).toEqual([M, N]);
            return Array.from(t.dataSync());
          });
        });
        expect(got, what).toEqual(plain);
        const worst = got.reduce((m, v, idx) => {
          const i = Math.floor(idx / N),
            j = idx % N;
          let t = 0;
          for (let k = 0; k < K; k++) t += xs[i * K + k] * ws[j * K + k];
          return Math.max(m, Math.abs(v - t) / Math.sqrt(K));
        }, 0);
        expect(worst, what).toBeLessThan(1e-5);
      });
      if (wasmThreads() > 1) expect(splitProductCount().rows).toBeGreaterThan(rowSplits);
      // matMulXWT: the kernel up to 64 rows of x, the transposed-B product above
      const w = tf.tensor2d(randn(40 * 24, 5), [40, 24]);
      for (const [rows, kernel] of [
        [64, XWT],
        [65, "BatchMatMul"],
      ] as const) {
        const x = tf.tensor2d(randn(rows * 24, rows), [rows, 24]);
        const info = await tf.profile(() => {
          tf.dispose(matMulXWT(x, w));
        });
        expect(info.kernelNames, `${rows} rows`).toContain(kernel);
        expect(info.kernelNames, `${rows} rows`).not.toContain("Transpose");
        x.dispose();
      }
      w.dispose();
      expect(tf.memory().numTensors).toBe(before);
    },
  );

  it("keeps tensor counts flat over repeated products", () => {
    const a = tf.tensor2d(randn(20 * 30, 9), [20, 30]),
      b = tf.tensor2d(randn(30 * 44, 10), [30, 44]);
    tf.tidy(() => {
      tf.matMul(a, b);
    });
    const before = tf.memory().numTensors;
    for (let i = 0; i < 5; i++)
      tf.tidy(() => {
        tf.matMul(tf.matMul(a, b), tf.transpose(b));
      });
    expect(tf.memory().numTensors).toBe(before);
    tf.dispose([a, b]);
  });
});
