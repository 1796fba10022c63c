/** The wasm backend's BatchMatMul (float32): the heap module's product (heap-gemm-code.ts) run on tfjs'
 *  heap, C = op(A) · op(B) over blocks of 4 rows × 8 columns held in vector registers. At 1 thread on
 *  the shapes of the bench's configs it does 50–54 GFLOP/s, against 21–38 for tfjs' XNNPACK product.
 *  - B is read in place for few rows; for more it is first packed, panel by panel (K × 8 floats each,
 *    ≤ 512 KB at a time), into a scratch buffer, so a panel is one run of memory whatever B's row
 *    stride (a 4 KB stride put every row of a panel in the same cache sets: a third of the speed).
 *  - Transposed operands cost nothing extra: a transposed A is read in place with swapped strides, a
 *    transposed B is transposed while it is packed. No copy of a weight outlives the product.
 *  - Batched products (equal batch dims, or a batch of one on either side) run on heap offsets, their
 *    slices shared out over the threads (heapGemm). int32 operands go to tfjs' kernel.
 *  Each output is summed over k in order, whatever the row and column split or the packing, so
 *  results do not depend on the thread count. */
import * as tf from "@tensorflow/tfjs";
import { heapModule, heapGemm } from "./heap.ts";
import { registerKernel, replaceKernel, type Backend } from "../kernels.ts";
import { XWT } from "../matmul.ts";

let enabled = true;

/** Turn the kernel off (tfjs' own product) or on again: for tests and A/B benchmarks. */
export function useWasmGemm(on: boolean): void {
  enabled = on;
}

/** Replace the wasm BatchMatMul with one that takes the plain products, and add matmul.ts' XWT
 *  (x [M, K] · wᵀ for w [N, K], as w · xᵀ stored transposed) (idempotent). */
export function registerWasmGemm(): void {
  registerKernel(
    XWT,
    () => (args) => {
      const { x, w } = args.inputs as { x: tf.TensorInfo; w: tf.TensorInfo };
      const [M, K] = x.shape,
        [N, Kw] = w.shape;
      if (x.shape.length !== 2 || w.shape.length !== 2 || K !== Kw)
        throw new Error(`${XWT}: expected x [M, K] and w [N, K], got [${x.shape}] and [${w.shape}]`);
      const backend = args.backend as Backend;
      const out = backend.makeOutput([M, N], "float32") as tf.TensorInfo;
      if (M * N === 0) return out;
      if (K === 0) {
        backend.typedArrayFromHeap(out).fill(0);
        return out;
      }
      const off = (t: tf.TensorInfo) => backend.dataIdMap.get(t.dataId).memoryOffset as number;
      heapGemm(heapModule(backend), off(w), off(x), off(out), N, K, M, 2 | 8);
      return out;
    },
    ["wasm"],
  );
  replaceKernel("BatchMatMul", "wasm", (fallback) => (args) => {
    const { a, b } = args.inputs as { a: tf.TensorInfo; b: tf.TensorInfo };
    const { transposeA, transposeB } = args.attrs as { transposeA: boolean; transposeB: boolean };
    const ra = a.shape.length,
      rb = b.shape.length;
    const batchA = a.shape.slice(0, -2).reduce((p, d) => p * d, 1),
      batchB = b.shape.slice(0, -2).reduce((p, d) => p * d, 1);
    const sameBatch = ra === rb && a.shape.slice(0, -2).every((d, i) => d === b.shape[i]);
    if (!enabled || a.dtype !== "float32" || b.dtype !== "float32" || !(sameBatch || batchA === 1 || batchB === 1) || ra < 2 || rb < 2)
      return fallback(args);
    const [M, K] = transposeA ? [a.shape[ra - 1], a.shape[ra - 2]] : [a.shape[ra - 2], a.shape[ra - 1]];
    const [Kb, N] = transposeB ? [b.shape[rb - 1], b.shape[rb - 2]] : [b.shape[rb - 2], b.shape[rb - 1]];
    if (Kb !== K) return fallback(args); // tfjs' kernel reports the mismatch
    const backend = args.backend as Backend;
    const batch = Math.max(batchA, batchB);
    const outShape = [...(batchA >= batchB ? a.shape : b.shape).slice(0, -2), M, N];
    const out = backend.makeOutput(outShape, "float32") as tf.TensorInfo;
    if (M * N === 0) return out;
    const e = heapModule(backend);
    const pa = backend.dataIdMap.get(a.dataId).memoryOffset as number;
    const pb = backend.dataIdMap.get(b.dataId).memoryOffset as number;
    const pc = backend.dataIdMap.get(out.dataId).memoryOffset as number;
    if (K === 0) {
      backend.typedArrayFromHeap(out).fill(0);
      return out;
    }
    const t = (transposeA ? 1 : 0) | (transposeB ? 2 : 0);
    heapGemm(e, pa, pb, pc, M, K, N, t, batch, batchA === 1 ? 0 : M * K * 4, batchB === 1 ? 0 : K * N * 4);
    return out;
  });
}
