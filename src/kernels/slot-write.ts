/** Writing one position of a KV cache in place: a decode step's new key column and value row go
 *  straight into the cache's preallocated slot, where a Concat would copy every cached position of
 *  every layer each step (and, on webgpu, allocate buffers of a new size and run products and
 *  softmaxes of a new width every step). Outside tfjs' immutable-tensor model on purpose, so only
 *  where that cannot be seen: float32, and a target whose data no other tensor shares (refCount 1:
 *  not a reshape, clone or concat-of-one of a tensor still alive), on wasm (a copy on the heap) and
 *  on webgpu (a program whose output is the target's own buffer: webgpu/heads.ts, registered with
 *  setWebgpuSlotWriter). Callers fall back to a copy everywhere else (inPlaceWritable false). */
import * as tf from "@tensorflow/tfjs";
import type { Backend } from "./kernels.ts";

/** Writes src's elements into dst's slot `pos` on the GPU (dst[..., i, pos] or dst[..., pos, :]). */
export type SlotWriter = (backend: Backend, dst: tf.TensorInfo, src: tf.TensorInfo, pos: number, rows: boolean) => void;
let webgpuWriter: SlotWriter | null = null;

/** Called once the webgpu programs are registered. */
export function setWebgpuSlotWriter(w: SlotWriter): void {
  webgpuWriter = w;
}

const slotBackend = (t: tf.Tensor): { name: "wasm" | "webgpu"; b: Backend } | null => {
  if (t.dtype !== "float32" || t.isDisposed) return null;
  const name = tf.getBackend();
  if (name === "wasm" || (name === "webgpu" && webgpuWriter)) return { name, b: tf.backend() as Backend };
  return null;
};

/** Whether tensors like `t` are written in place on this backend (wasm, webgpu; float32), data shared or not. */
export const slotWrites = (t: tf.Tensor): boolean => slotBackend(t) !== null;

/** Whether `t` can be written in place: wasm or webgpu, float32, its data held by it alone. */
export function inPlaceWritable(t: tf.Tensor): boolean {
  const s = slotBackend(t);
  return s !== null && s.b.refCount(t.dataId) === 1;
}

/** dst[..., i, pos] = src[..., i, 0] for a dst of shape [...lead, W] and src [...lead, 1] (keys stored
 *  transposed, one new column), or with `rows` dst[..., pos, :] = src[..., 0, :] for dst [...lead, W, D]
 *  and src [...lead, 1, D] (values, one new row). Throws where inPlaceWritable(dst) is false. */
export function writeSlot(dst: tf.Tensor, src: tf.Tensor, pos: number, rows: boolean): void {
  if (!inPlaceWritable(dst))
    throw new Error("writeSlot: the target is not writable in place (wasm or webgpu, float32, unshared data only)");
  const r = dst.rank;
  const W = rows ? dst.shape[r - 2] : dst.shape[r - 1],
    D = rows ? dst.shape[r - 1] : 1;
  const fits = rows ? src.shape[r - 2] === 1 && src.shape[r - 1] === D : src.shape[r - 1] === 1;
  if (!fits || src.rank !== r || (src.size / D) * W * D !== dst.size || !(Number.isInteger(pos) && pos >= 0 && pos < W))
    throw new Error("writeSlot: shapes do not match");
  const { name, b } = slotBackend(src)!;
  if (name === "webgpu") return webgpuWriter!(b, dst, src, pos, rows);
  const d = b.typedArrayFromHeap(dst) as Float32Array,
    s = b.typedArrayFromHeap(src) as Float32Array;
  if (rows) for (let i = 0, n = s.length / D; i < n; i++) d.set(s.subarray(i * D, (i + 1) * D), (i * W + pos) * D);
  else for (let i = 0; i < s.length; i++) d[i * W + pos] = s[i];
}
