/** tfjs-backend-wasm's copying kernels, replaced by ones that work on the heap in place: Identity
 *  shares its input, Slice and SplitV copy through heap views or one strided memory.copy, and
 *  UnsortedSegmentSum (which tfjs-backend-wasm lacks: the gradient of gather, needed when embeddings
 *  train in full mode) sums in JS on the heap views. String tensors go to tfjs' kernels. */
import * as tf from "@tensorflow/tfjs";
import { heapBlocks } from "./heap-ops.ts";
import { heapOffset, registerKernel, replaceKernel, type Backend } from "../kernels.ts";

/** UnsortedSegmentSum for wasm, computed in JS on the heap views (only the gather gradient of a
 *  trainable embedding uses it, so simplicity beats speed here). */
export function registerSegmentSum(): void {
  registerKernel(
    "UnsortedSegmentSum",
    () =>
      ({ inputs, backend, attrs }) => {
        const { x, segmentIds } = inputs as { x: tf.TensorInfo; segmentIds: tf.TensorInfo };
        const numSegments = (attrs as { numSegments: number }).numSegments;
        const b = backend as Backend;
        const xv = b.readSync(x.dataId) as Float32Array | Int32Array;
        const ids = b.readSync(segmentIds.dataId) as Int32Array;
        const inner = x.shape.slice(segmentIds.shape.length).reduce((p, d) => p * d, 1);
        const outShape = [numSegments, ...x.shape.slice(segmentIds.shape.length)];
        const out = b.makeOutput(outShape, x.dtype) as tf.TensorInfo;
        const ov = b.typedArrayFromHeap(out) as Float32Array;
        ov.fill(0);
        for (let i = 0; i < ids.length; i++) {
          const s = ids[i];
          if (s < 0 || s >= numSegments) continue; // tf semantics: out-of-range ids are dropped
          const src = i * inner,
            dst = s * inner;
          for (let j = 0; j < inner; j++) ov[dst + j] += xv[src + j];
        }
        return out;
      },
    ["wasm"],
  );
}

/** tfjs-backend-wasm's Identity copies its input. tfjs' engine runs it for every tensor a gradient tape
 *  saves (tf.clone), so a small-config training step made 448 copies (45 ms, and the tape's memory
 *  twice over). Data on the heap is never written after its kernel made it, so the clone shares it
 *  with a reference count, as the wasm Reshape and the cpu backend's Identity do. */
export function registerSharedIdentity(): void {
  replaceKernel("Identity", "wasm", (fallback) => (args) => {
    const x = (args.inputs as { x: tf.TensorInfo }).x;
    if (x.dtype === "string") return fallback(args);
    (args.backend as unknown as { incRef(id: tf.DataId): void }).incRef(x.dataId);
    return { dataId: x.dataId, shape: x.shape, dtype: x.dtype };
  });
}

/** tfjs-backend-wasm's Slice (and SplitV, which calls it) reads its input with readSync, which copies
 *  the whole input out of the heap on every call: slicing 16 pieces off an 8 MB tensor copied 128 MB
 *  (~140 ms). These kernels read the input through a heap view instead (taken after the output is
 *  allocated, since allocation can move the heap). String tensors still go to the original kernels. */
export function registerFastSlice(): void {
  replaceKernel("Slice", "wasm", (fallback) => (args) => {
    const x = (args.inputs as { x: tf.TensorInfo }).x;
    if (x.dtype === "string") return fallback(args);
    const { begin, size } = args.attrs as { begin: number | number[]; size: number | number[] };
    const [b0, s0] = tf.slice_util.parseSliceParams(x as tf.Tensor, begin, size);
    return sliceView(args.backend, x, b0, s0);
  });
  replaceKernel("SplitV", "wasm", (fallback) => (args) => {
    const x = (args.inputs as { x: tf.TensorInfo }).x;
    if (x.dtype === "string") return fallback(args);
    const { numOrSizeSplits, axis } = args.attrs as { numOrSizeSplits: number | number[]; axis: number };
    const ax = tf.util.parseAxisParam(axis, x.shape)[0];
    const sizes = tf.backend_util.prepareSplitSize(x as tf.Tensor, numOrSizeSplits, ax);
    const begin = new Array(x.shape.length).fill(0);
    return sizes.map((n) => {
      const size = x.shape.slice();
      size[ax] = n;
      const out = sliceView(args.backend, x, begin.slice(), size);
      begin[ax] += n;
      return out;
    });
  });
}

function sliceView(backend: unknown, x: tf.TensorInfo, b0: number[], s0: number[]): tf.TensorInfo {
  const be = backend as Backend;
  const out = be.makeOutput(s0, x.dtype) as tf.TensorInfo;
  const rank = x.shape.length;
  if (s0.reduce((p, d) => p * d, 1) === 0) return out;
  if (rank === 0) {
    (be.typedArrayFromHeap(out) as Float32Array).set(be.typedArrayFromHeap(x) as Float32Array);
    return out;
  }
  const xv = be.typedArrayFromHeap(x) as Float32Array;
  const ov = be.typedArrayFromHeap(out) as Float32Array;
  const strides = [...tf.util.computeStrides(x.shape), 1];
  if (tf.slice_util.isSliceContinous(x.shape, b0, s0)) {
    // one block (e.g. rows off the leading axis): a single copy
    const off = tf.slice_util.computeFlatOffset(b0, strides);
    ov.set(xv.subarray(off, off + ov.length));
    return out;
  }
  // Axes after the last partial one (a) are whole, so each run over axes a.. is contiguous.
  let a = rank - 1;
  while (a > 0 && s0[a] === x.shape[a]) a--;
  const run = s0.slice(a).reduce((p, d) => p * d, 1);
  if (a > 0 && x.dtype !== "complex64" && s0.slice(0, a).every((d, i) => d === x.shape[i])) {
    // whole leading axes (a split's pieces, RoPE's halves): rows of `run` at one stride, one strided
    // memory.copy in the heap module (rows split over the helper threads from 1 MB) instead of a
    // typed-array view and a set() per row
    const e = tf.util.bytesPerElement(x.dtype),
      offset = (t: tf.TensorInfo) => heapOffset(be, t);
    const src = offset(x) + e * b0[a] * strides[a];
    heapBlocks(be, [[src, offset(out), e * strides[a - 1], e * run]], ov.length / run, e * run, e * ov.length);
    return out;
  }
  // runs over axes a.., looping over the leading indices
  const lead = s0.slice(0, a),
    idx = new Array(a).fill(0);
  const rows = lead.reduce((p, d) => p * d, 1);
  for (let r = 0, o = 0; r < rows; r++, o += run) {
    let off = b0[a] * strides[a];
    for (let d = 0; d < a; d++) off += (b0[d] + idx[d]) * strides[d];
    ov.set(xv.subarray(off, off + run), o);
    for (let d = a - 1; d >= 0; d--) {
      if (++idx[d] < lead[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}
