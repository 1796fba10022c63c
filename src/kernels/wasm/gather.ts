/** The wasm backend's GatherV2 for float32 and int32 tensors (batchDims 0): slices copied over heap
 *  views, a row at a time (copyWithin) or, for slices of a few elements, one element at a time.
 *  tfjs' kernel computed every element's source index in a general loop: an embedding lookup of
 *  2,048 tokens × 256 took 23 ms (~45 ns per element), as long as a quarter of the small bench model's
 *  layers, and a decode step's 8-token lookup ~0.1 ms. Values are moved as bits (no float is touched).
 *  Other dtypes and batchDims go to tfjs' kernel. Out-of-range indices fail as tfjs' do. */
import * as tf from "@tensorflow/tfjs";
import { replaceKernel, type Backend } from "../kernels.ts";

/** Slice lengths (elements) from which a slice is copied with copyWithin instead of element by element. */
const ROW_COPY = 16;

/** out[o, n, :] = x[o, ids[n], :] for x [outer, dim, inner] at xOff and out [outer, ids.length, inner]
 *  at outOff, both in `heap` (int32 view: the bits of float32 values are moved unchanged). */
export function gatherInto(
  heap: Int32Array,
  outOff: number,
  xOff: number,
  ids: Int32Array,
  outer: number,
  dim: number,
  inner: number,
): void {
  const N = ids.length;
  for (let o = 0; o < outer; o++) {
    const src = xOff + o * dim * inner;
    let dst = outOff + o * N * inner;
    for (let n = 0; n < N; n++) {
      const s = src + ids[n] * inner;
      if (inner >= ROW_COPY) (heap.copyWithin(dst, s, s + inner), (dst += inner));
      else for (let j = 0; j < inner; j++) heap[dst++] = heap[s + j];
    }
  }
}

let enabled = true;

/** Turn the kernel off (tfjs' own) or on again: for A/B benchmarks. */
export function useWasmGather(on: boolean): void {
  enabled = on;
}

export function registerWasmGather(): void {
  replaceKernel("GatherV2", "wasm", (fallback) => (args) => {
    const { x, indices } = args.inputs as { x: tf.TensorInfo; indices: tf.TensorInfo };
    const { axis, batchDims } = args.attrs as { axis: number; batchDims: number };
    if (!enabled || (x.dtype !== "float32" && x.dtype !== "int32") || batchDims || indices.dtype !== "int32") return fallback(args);
    const backend = args.backend as Backend;
    const ax = tf.util.parseAxisParam(axis, x.shape)[0];
    const dim = x.shape[ax];
    const ids = backend.readSync(indices.dataId) as Int32Array; // a copy off the heap, which may move below
    for (const i of ids) tf.util.assert(i <= dim - 1 && i >= 0, () => `GatherV2: the index value ${i} is not in [0, ${dim - 1}]`);
    const outer = x.shape.slice(0, ax).reduce((p, d) => p * d, 1);
    const inner = x.shape.slice(ax + 1).reduce((p, d) => p * d, 1);
    const out = backend.makeOutput([...x.shape.slice(0, ax), ...indices.shape, ...x.shape.slice(ax + 1)], x.dtype) as tf.TensorInfo;
    if (outer * ids.length * inner === 0) return out;
    const heap = new Int32Array(backend.wasm.HEAPU8.buffer);
    const at = (t: tf.TensorInfo) => (backend.dataIdMap.get(t.dataId).memoryOffset as number) / 4;
    gatherInto(heap, at(out), at(x), ids, outer, dim, inner);
    return out;
  });
}
