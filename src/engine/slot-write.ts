/** Writing one position of a KV cache in place (wasm): a decode step's new key column and value row go
 *  straight into the cache's preallocated slot on the heap, where a Concat would copy every cached
 *  position of every layer each step. Outside tfjs' immutable-tensor model on purpose, so only where
 *  that cannot be seen: the wasm backend, float32, and a target whose data no other tensor shares
 *  (refCount 1: not a reshape, clone or concat-of-one of a tensor still alive). Callers fall back to
 *  a copy everywhere else (inPlaceWritable false). */
import * as tf from "@tensorflow/tfjs";
import type { Backend } from "./kernels.ts";

const wasmBackend = (t: tf.Tensor): Backend | null => {
  if (tf.getBackend() !== "wasm" || t.dtype !== "float32" || t.isDisposed) return null;
  return tf.backend() as Backend;
};

/** Whether tensors like `t` are written in place on this backend (wasm, float32), data shared or not. */
export const slotWrites = (t: tf.Tensor): boolean => wasmBackend(t) !== null;

/** Whether `t` can be written in place: wasm, float32, its data held by it alone. */
export function inPlaceWritable(t: tf.Tensor): boolean {
  const b = wasmBackend(t);
  return b !== null && b.refCount(t.dataId) === 1;
}

/** dst[..., i, pos] = src[..., i, 0] for a dst of shape [...lead, W] and src [...lead, 1] (keys stored
 *  transposed, one new column), or with `rows` dst[..., pos, :] = src[..., 0, :] for dst [...lead, W, D]
 *  and src [...lead, 1, D] (values, one new row). Throws where inPlaceWritable(dst) is false. */
export function writeSlot(dst: tf.Tensor, src: tf.Tensor, pos: number, rows: boolean): void {
  if (!inPlaceWritable(dst)) throw new Error("writeSlot: the target is not writable in place (wasm, float32, unshared data only)");
  const b = wasmBackend(src)!;
  const d = b.typedArrayFromHeap(dst) as Float32Array,
    s = b.typedArrayFromHeap(src) as Float32Array;
  const r = dst.rank;
  if (rows) {
    const W = dst.shape[r - 2],
      D = dst.shape[r - 1];
    if (src.shape[r - 2] !== 1 || src.shape[r - 1] !== D || (s.length / D) * W * D !== d.length || !(pos >= 0 && pos < W))
      throw new Error("writeSlot: shapes do not match");
    for (let i = 0, n = s.length / D; i < n; i++) d.set(s.subarray(i * D, (i + 1) * D), (i * W + pos) * D);
  } else {
    const W = dst.shape[r - 1];
    if (src.shape[r - 1] !== 1 || s.length * W !== d.length || !(pos >= 0 && pos < W)) throw new Error("writeSlot: shapes do not match");
    for (let i = 0; i < s.length; i++) d[i * W + pos] = s[i];
  }
}
