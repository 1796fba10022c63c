/** The attention heads of the fused projection qkv [rows, (nH + 2·nKv)·hd]: q, k and v split apart,
 *  q and k rotated (RoPE, rotate-half) and q scaled, each in the layout attention reads. One kernel
 *  each way in place of the layer's op path (two SplitV, RoPE, the scale, then transposes or
 *  reshapes): decodeHeads for a decode step (one position per row, no gradient), seqHeads for any
 *  number of positions (prefill, training). On wasm and cpu the values are the op path's bit for bit
 *  (each is rounded to float32 where the op path rounds it): on wasm past RoPE's 64 K elements, where
 *  the op path rounds in float32, the heap module's vector kernel (heap-heads-code.ts, rows split
 *  over the helper threads; the small bench config's [2048, 512] on one thread: 1.2 ms forward, 3.8
 *  with the backward, where the op path took 4.4 and 13.3), else one JS pass over the tensors'
 *  memory. On webgpu WGSL programs (webgpu/heads.ts). Other backends keep the op path. */
import * as tf from "@tensorflow/tfjs";
import { heapOffset, once, registerKernel, type Backend, type CustomGradFn } from "./kernels.ts";
import { heapSeqHeads } from "./wasm/heap-ops.ts";
import { ropeKernelRuns, webgpuKernel } from "./rope-swiglu.ts";
import { inPlaceWritable } from "./slot-write.ts";
import { backendProfile } from "./profile.ts";

/** q [B, nH, T, hd] = rope(q)·scale, kT [B, nKv, hd, T] = rope(k) and v [B, nKv, T, hd] from qkv
 *  [B·T, (nH + 2·nKv)·hd]; cos, sin [B·T·hd]. With `roundOnce` each rotated value is rounded to
 *  float32 once (the ROPE kernel's sum in float64), else each product and the sum are (ropeOps'
 *  Multiply, Multiply, Add); then the scale as a float32 multiply. At T = 1 the layouts are a decode
 *  step's: q [B·nKv, nH / nKv, hd], kT [B, nKv, hd, 1], v [B, nKv, 1, hd] in memory. */
export function seqHeadsInto(
  q: Float32Array,
  kT: Float32Array,
  v: Float32Array,
  qkv: Float32Array,
  cos: Float32Array,
  sin: Float32Array,
  T: number,
  nH: number,
  nKv: number,
  hd: number,
  scale: number,
  roundOnce: boolean,
): void {
  const half = hd / 2,
    width = (nH + 2 * nKv) * hd,
    s = Math.fround(scale);
  for (let n = 0; n < cos.length / hd; n++) {
    const b = Math.floor(n / T),
      t = n - b * T,
      row = n * width,
      c = n * hd;
    for (let h = 0; h < nH + nKv; h++) {
      const o = row + h * hd,
        isQ = h < nH,
        out = isQ ? q : kT,
        sh = isQ ? s : 1; // k unscaled: r · 1 is r
      // out[d + j·step]: q's row (b, h, t) or kT's column (b, h − nH, ·, t)
      const d = isQ ? ((b * nH + h) * T + t) * hd : (b * nKv + h - nH) * hd * T + t,
        step = isQ ? 1 : T;
      // the rounding chosen per head, not per value (a decode step's heads took 30% longer), nor by a
      // closure (two of them at one call site cost 3x)
      if (roundOnce)
        for (let j = 0; j < hd; j++)
          out[d + j * step] = Math.fround(qkv[o + j] * cos[c + j] + qkv[o + (j < half ? j + half : j - half)] * sin[c + j]) * sh;
      else
        for (let j = 0; j < hd; j++)
          out[d + j * step] =
            Math.fround(Math.fround(qkv[o + j] * cos[c + j]) + Math.fround(qkv[o + (j < half ? j + half : j - half)] * sin[c + j])) * sh;
    }
    for (let h = 0; h < nKv; h++)
      v.set(qkv.subarray(row + (nH + nKv + h) * hd, row + (nH + nKv + h + 1) * hd), ((b * nKv + h) * T + t) * hd);
  }
}

/** seqHeadsInto's gradient: dqkv [B·T, (nH + 2·nKv)·hd] from dq, dkT and dv in their layouts. The op
 *  path's backward: the scale's Multiply (dq·scale, rounded), then RoPE's adjoint dx_j = dy_j·cos_j +
 *  dy_j'·sin_j', j' = (j + hd/2) mod hd, rounded as the forward is (`roundOnce`). */
export function seqHeadsGradInto(
  dqkv: Float32Array,
  dq: Float32Array,
  dkT: Float32Array,
  dv: Float32Array,
  cos: Float32Array,
  sin: Float32Array,
  T: number,
  nH: number,
  nKv: number,
  hd: number,
  scale: number,
  roundOnce: boolean,
): void {
  const half = hd / 2,
    width = (nH + 2 * nKv) * hd,
    s = Math.fround(scale);
  for (let n = 0; n < cos.length / hd; n++) {
    const b = Math.floor(n / T),
      t = n - b * T,
      row = n * width,
      c = n * hd;
    for (let h = 0; h < nH + nKv; h++) {
      const o = row + h * hd,
        isQ = h < nH,
        dy = isQ ? dq : dkT;
      const d = isQ ? ((b * nH + h) * T + t) * hd : (b * nKv + h - nH) * hd * T + t,
        step = isQ ? 1 : T;
      for (let j = 0; j < hd; j++) {
        const jr = j < half ? j + half : j - half;
        const x = (isQ ? Math.fround(dy[d + j] * s) : dy[d + j * step]) * cos[c + j],
          y = (isQ ? Math.fround(dy[d + jr] * s) : dy[d + jr * step]) * sin[c + jr];
        dqkv[o + j] = roundOnce ? x + y : Math.fround(x) + Math.fround(y);
      }
    }
    for (let h = 0; h < nKv; h++)
      dqkv.set(dv.subarray(((b * nKv + h) * T + t) * hd, ((b * nKv + h) * T + t + 1) * hd), row + (nH + nKv + h) * hd);
  }
}

export const SEQ_HEADS = "MarlSeqHeads",
  SEQ_HEADS_GRAD = "MarlSeqHeadsGrad",
  DECODE_HEADS = "MarlDecodeHeads";

export interface HeadsAttrs {
  B: number;
  T: number;
  nH: number;
  nKv: number;
  hd: number;
  scale: number;
}
/** Whether the op path's RoPE would round each value once at this size (its JS kernel) or thrice (ops). */
const roundsOnce = ({ B, T, nH, nKv, hd }: HeadsAttrs) => ropeKernelRuns(B * T * (nH + nKv) * hd);

/** wasm runs the heap module's vector kernel (heap-heads-code.ts, rows split over the helper threads)
 *  where RoPE rounds as ops do (float32 lanes) and hd is a multiple of 8; the JS loop covers the rest. */
const heapKernel = (backendName: string, a: HeadsAttrs) => backendName === "wasm" && !roundsOnce(a) && a.hd % 8 === 0;

const register = once(() => {
  registerKernel(SEQ_HEADS, (io, backendName) => ({ inputs, backend, attrs }) => {
    const { qkv, cos, sin } = inputs as { qkv: tf.TensorInfo; cos: tf.TensorInfo; sin: tf.TensorInfo };
    const a = attrs as unknown as HeadsAttrs,
      { B, T, nH, nKv, hd } = a;
    const outs = [io.output(backend, [B, nH, T, hd]), io.output(backend, [B, nKv, hd, T]), io.output(backend, [B, nKv, T, hd])];
    if (heapKernel(backendName, a)) {
      const p = [qkv, cos, sin, ...outs].map((x) => heapOffset(backend, x));
      heapSeqHeads(backend, false, p, B * T, T, nH, nKv, hd, a.scale);
      return outs;
    }
    const [q, kT, v] = outs.map((x) => io.view(backend, x)); // views after every allocation: the wasm heap may move
    seqHeadsInto(q, kT, v, io.view(backend, qkv), io.view(backend, cos), io.view(backend, sin), T, nH, nKv, hd, a.scale, roundsOnce(a));
    return outs;
  });
  registerKernel(SEQ_HEADS_GRAD, (io, backendName) => ({ inputs, backend, attrs }) => {
    const { dq, dkT, dv, cos, sin } = inputs as Record<string, tf.TensorInfo>;
    const a = attrs as unknown as HeadsAttrs,
      { B, T, nH, nKv, hd } = a;
    const out = io.output(backend, [B * T, (nH + 2 * nKv) * hd]);
    if (heapKernel(backendName, a)) {
      const p = [dq, dkT, dv, cos, sin, out].map((x) => heapOffset(backend, x));
      heapSeqHeads(backend, true, p, B * T, T, nH, nKv, hd, a.scale);
      return out;
    }
    const views = [out, dq, dkT, dv, cos, sin].map((x) => io.view(backend, x));
    seqHeadsGradInto(views[0], views[1], views[2], views[3], views[4], views[5], T, nH, nKv, hd, a.scale, roundsOnce(a));
    return out;
  });
  // A decode step is seqHeads at T = 1 (below the size limit, so rounded once as the ROPE kernel does).
  registerKernel(DECODE_HEADS, (io) => ({ inputs, backend, attrs }) => {
    const { qkv, cos, sin } = inputs as { qkv: tf.TensorInfo; cos: tf.TensorInfo; sin: tf.TensorInfo };
    const { nH, nKv, hd, scale } = attrs as { nH: number; nKv: number; hd: number; scale: number };
    const B = qkv.shape[0];
    const outs = [io.output(backend, [B * nKv, nH / nKv, hd]), io.output(backend, [B, nKv, hd, 1]), io.output(backend, [B, nKv, 1, hd])];
    const [q, k, v] = outs.map((x) => io.view(backend, x));
    seqHeadsInto(q, k, v, io.view(backend, qkv), io.view(backend, cos), io.view(backend, sin), 1, nH, nKv, hd, scale, true);
    return outs;
  });
});

/** The wasm/cpu kernel `name` runs here (registered for this backend, float32). */
const cpuKernel = (qkv: tf.Tensor, name: string) => {
  register();
  return qkv.dtype === "float32" && tf.getKernel(name, tf.getBackend()) !== undefined;
};

/** One position per row (a decode step; no gradient): the fused projection qkv [B, (nH + 2·nKv)·hd]
 *  split into heads, q and k rotated by cos, sin [B, 1, 1, hd] and q scaled, in the layouts attention
 *  reads: q [B·nKv, g, hd] (the g = nH/nKv query heads of a kv head as rows), kᵀ [B, nKv, hd, 1],
 *  v [B, nKv, 1, hd]. One kernel on wasm/cpu up to the JS kernels' size (a decode step's rows; the
 *  layer then takes seqHeads), where the layer's op path is ten (two SplitV, RoPE, the scale and six
 *  reshapes); null elsewhere. */
export function decodeHeads(
  qkv: tf.Tensor2D,
  cos: tf.Tensor4D,
  sin: tf.Tensor4D,
  nH: number,
  nKv: number,
  hd: number,
  scale: number,
): [tf.Tensor3D, tf.Tensor4D, tf.Tensor4D] | null {
  if (!webgpuKernel(qkv, DECODE_HEADS) && !(ropeKernelRuns(qkv.size) && cpuKernel(qkv, DECODE_HEADS))) return null;
  return tf.engine().runKernel(DECODE_HEADS, { qkv, cos, sin }, { nH, nKv, hd, scale }) as unknown as [
    tf.Tensor3D,
    tf.Tensor4D,
    tf.Tensor4D,
  ];
}

/** Runs a decode step's q head and writes its k and v heads straight into a KV cache's slot `pos`
 *  (webgpu/heads.ts registers it); returns q's TensorInfo in decodeHeads' layout. */
export type HeadsIntoWriter = (
  backend: Backend,
  qkv: tf.TensorInfo,
  cos: tf.TensorInfo,
  sin: tf.TensorInfo,
  attrs: { nH: number; nKv: number; hd: number; scale: number },
  kDst: tf.TensorInfo,
  vDst: tf.TensorInfo,
  pos: number,
) => tf.TensorInfo;
let headsInto: HeadsIntoWriter | null = null;

/** Called once the webgpu programs are registered. */
export function setWebgpuHeadsInto(w: HeadsIntoWriter): void {
  headsInto = w;
}

/** decodeHeads with the new key column and value row written straight into the cache's tensors kDst
 *  [B, nKv, hd, W] and vDst [B, nKv, W, hd] at position pos (both writable in place: slot-write.ts):
 *  returns q; null where the backend has no such writer (webgpu has: three dispatches where
 *  decodeHeads and the two slot writes were five). */
export function decodeHeadsInto(
  qkv: tf.Tensor2D,
  cos: tf.Tensor4D,
  sin: tf.Tensor4D,
  nH: number,
  nKv: number,
  hd: number,
  scale: number,
  kDst: tf.Tensor4D,
  vDst: tf.Tensor4D,
  pos: number,
): tf.Tensor3D | null {
  if (!headsInto || tf.getBackend() !== "webgpu" || qkv.dtype !== "float32" || !inPlaceWritable(kDst) || !inPlaceWritable(vDst))
    return null;
  if (!(Number.isInteger(pos) && pos >= 0 && pos < kDst.shape[3] && pos < vDst.shape[2]))
    throw new Error(`decodeHeadsInto: position ${pos} outside the cache's room`);
  const q = headsInto(tf.backend(), qkv, cos, sin, { nH, nKv, hd, scale }, kDst, vDst, pos);
  return tf.engine().makeTensorFromTensorInfo(q) as tf.Tensor3D;
}

/** Any number of positions T (prefill, training), differentiable in qkv: the fused projection qkv
 *  [B·T, (nH + 2·nKv)·hd] split into heads, q and k rotated by cos, sin [B, T, 1, hd] and q scaled, in
 *  the layouts attention reads: q [B, nH, T, hd], kᵀ [B, nKv, hd, T], v [B, nKv, T, hd]. One kernel
 *  each way on wasm/cpu (at every size) and webgpu (one dispatch each way), where
 *  the op path is two splits, RoPE, the scale and three transposes each way; null elsewhere (the
 *  layer then takes its op path). */
export function seqHeads(
  qkv: tf.Tensor2D,
  cos: tf.Tensor4D,
  sin: tf.Tensor4D,
  B: number,
  T: number,
  nH: number,
  nKv: number,
  hd: number,
  scale: number,
): [tf.Tensor4D, tf.Tensor4D, tf.Tensor4D] | null {
  if (!webgpuKernel(qkv, SEQ_HEADS) && !cpuKernel(qkv, SEQ_HEADS)) return null;
  registerSeqHeadsGradient();
  return tf.engine().runKernel(SEQ_HEADS, { qkv, cos, sin }, { B, T, nH, nKv, hd, scale }) as unknown as [
    tf.Tensor4D,
    tf.Tensor4D,
    tf.Tensor4D,
  ];
}

/** The gradient of a heads kernel with respect to qkv, registered with tfjs (a kernel of several
 *  outputs cannot be a customGrad): `grad` takes the outputs' gradients, named `outs`, and the tables
 *  (cos, sin). An output the loss does not reach has no gradient (null): zeros of `shapes` stand in.
 *  The tables' gradients are never asked for: the tape keeps only inputs reached from the variables. */
function registerHeadsGradient(kernelName: string, grad: string, outs: string[], tables: string[], shapes: (attrs: object) => number[][]) {
  tf.registerGradient({
    kernelName,
    inputsToSave: tables,
    gradFunc: (dy, saved, attrs) => {
      const gradients = () => {
        const shape = shapes(attrs);
        return Object.fromEntries(outs.map((o, i) => [o, (dy as (tf.Tensor | null)[])[i] ?? tf.zeros(shape[i])]));
      };
      return {
        qkv: () =>
          tf.engine().runKernel(grad, { ...gradients(), ...Object.fromEntries(tables.map((t, i) => [t, saved[i]])) }, attrs) as tf.Tensor,
        ...Object.fromEntries(tables.map((t, i) => [t, () => tf.zerosLike(saved[i])])),
      };
    },
  });
}

const registerSeqHeadsGradient = once(() =>
  registerHeadsGradient(SEQ_HEADS, SEQ_HEADS_GRAD, ["dq", "dkT", "dv"], ["cos", "sin"], (a) => {
    const { B, T, nH, nKv, hd } = a as HeadsAttrs;
    return [
      [B, nH, T, hd],
      [B, nKv, hd, T],
      [B, nKv, T, hd],
    ];
  }),
);

export const SHARED_HEADS = "MarlSharedHeads",
  SHARED_HEADS_GRAD = "MarlSharedHeadsGrad";

/** The sizes of a shared-prefix forward's heads: P prefix rows, B rows of T own tokens each. */
export interface SharedHeadsAttrs extends HeadsAttrs {
  P: number;
}

/** The heads of a forward whose rows share a prefix (qwen2.ts sharePrefixes), differentiable in qkv
 *  [P + B·T, (nH + 2·nKv)·hd] (the prefix's rows, then each row's own), rotated by the prefix's
 *  cosP, sinP [1, P, 1, hd] and the rows' cosO, sinO [B, T, 1, hd]: the prefix's q [1, nH, P, hd], kᵀ
 *  [1, nKv, hd, P] and v [1, nKv, P, hd] for its own attention, the rows' q [B, nH, T, hd], and the
 *  keys [B, nKv, hd, P + T] and values [B, nKv, P + T, hd] each row attends over (the prefix's, then
 *  its own). One dispatch each way on webgpu, where the op path is two slices, two heads kernels, two
 *  tiles and two concatenations forward, and the tiles' gradients (a slice and an add per row) back;
 *  null elsewhere. */
export function sharedSeqHeads(
  qkv: tf.Tensor2D,
  cosP: tf.Tensor4D,
  sinP: tf.Tensor4D,
  cosO: tf.Tensor4D,
  sinO: tf.Tensor4D,
  a: SharedHeadsAttrs,
): tf.Tensor4D[] | null {
  if (!webgpuKernel(qkv, SHARED_HEADS) || backendProfile().storageBindings < 11) return null; // 5 inputs, 6 outputs
  registerSharedHeadsGradient();
  return tf.engine().runKernel(SHARED_HEADS, { qkv, cosP, sinP, cosO, sinO }, a as never) as unknown as tf.Tensor4D[];
}

const registerSharedHeadsGradient = once(() =>
  registerHeadsGradient(
    SHARED_HEADS,
    SHARED_HEADS_GRAD,
    ["dqP", "dkTP", "dvP", "dqO", "dkeys", "dvals"],
    ["cosP", "sinP", "cosO", "sinO"],
    (a) => {
      const { P, B, T, nH, nKv, hd } = a as SharedHeadsAttrs;
      return [
        [1, nH, P, hd],
        [1, nKv, hd, P],
        [1, nKv, P, hd],
        [B, nH, T, hd],
        [B, nKv, hd, P + T],
        [B, nKv, P + T, hd],
      ];
    },
  ),
);

export const HEADS_OUT = "MarlHeadsOut",
  HEADS_OUT_GRAD = "MarlHeadsOutGrad";

/** Attention outputs of parts of rows (a shared prefix's, then the rows' own), each [Bᵢ·nKv, g·Tᵢ, hd]
 *  as attention's products leave them (heads h = kv·g + i), as the rows of one matrix [Σ Bᵢ·Tᵢ, nH·hd]
 *  (part by part; within a part, row b's Tᵢ positions): one dispatch each way on webgpu (at most two
 *  parts), where the op path is a transpose per part and a concatenation, and back the
 *  concatenation's split and the transposes; null elsewhere. */
export function headsOut(ctxs: tf.Tensor3D[], parts: { B: number; T: number }[], nH: number, hd: number): tf.Tensor2D | null {
  if (ctxs.length > 2 || !ctxs.every((c) => webgpuKernel(c, HEADS_OUT))) return null;
  const attrs = { Bs: parts.map((p) => p.B), Ts: parts.map((p) => p.T), nH, hd };
  const named = (ts: tf.Tensor[]) => Object.fromEntries(ts.map((t, i) => [`c${i}`, t]));
  const f = tf.customGrad(((...args: unknown[]) => {
    args.pop(); // save: nothing to keep (the gradient is a layout change of dy)
    return {
      value: tf.engine().runKernel(HEADS_OUT, named(args as tf.Tensor[]), attrs as never) as tf.Tensor2D,
      gradFunc: (dy: tf.Tensor2D) => {
        const d = tf.engine().runKernel(HEADS_OUT_GRAD, { dy }, attrs as never) as tf.Tensor[];
        return d.map((t, i) => tf.reshape(t, ctxs[i].shape));
      },
    };
  }) as unknown as CustomGradFn);
  return f(...(ctxs as [tf.Tensor])) as tf.Tensor2D;
}
