/** The attention heads' WGSL programs: a decode step's q/k/v heads with RoPE (written into the KV
 *  cache's slot where it has room), a prefill or training step's heads and their gradient, RoPE,
 *  a KV cache slot write, and LoRA's fused-module block-diagonal B; a shared prefix's heads are in
 *  shared-heads.ts. Registers itself (families.ts); the op files (heads.ts, rope-swiglu.ts, slot-write.ts,
 *  block-diag.ts) hold the names and the gradients. */
import type * as tf from "@tensorflow/tfjs";
import * as tfjs from "@tensorflow/tfjs";
import { BLOCK_DIAG } from "../block-diag.ts";
import { DECODE_HEADS, SEQ_HEADS, SEQ_HEADS_GRAD, setWebgpuHeadsInto } from "../heads.ts";
import { registerKernel } from "../kernels.ts";
import { ROPE } from "../rope-swiglu.ts";
import { setWebgpuSlotWriter } from "../slot-write.ts";
import { f32, RowProgram, run, runMulti, writeInto, threadIndex, type WebgpuModule } from "./program.ts";
import { webgpuFamily } from "./families.ts";

const K = { rope: ROPE, seqHeads: SEQ_HEADS, seqHeadsGrad: SEQ_HEADS_GRAD, decodeHeads: DECODE_HEADS };

/** Where element `index` of a KV cache's new position goes in the cache tensor (slot-write.ts'
 *  layouts): keys [..., W] take it at (index·W + pos) (D 1), values [..., W, D] their row index / D at
 *  position pos, column index mod D; W (the output's shape uniform of that axis) and pos (a uniform)
 *  are read at run time, so one shader serves every step and width. */
const slotAt = (rank: number, rows: boolean, D: number) =>
  `(index / ${D} * uniforms.outShape[${rows ? rank - 2 : rank - 1}] + uniforms.pos) * ${D} + index % ${D}`;

/** One decode step's heads from qkv [B, (nH + 2·nKv)·hd]: part "q" (rope · scale, [B, nH, hd]), "k"
 *  (rope, [B, nKv, hd]) or "v" (a copy, [B, nKv, hd]); cos, sin [B, hd] with rotate-half's sign in sin. */
function headsProgram(
  u: WebgpuModule["webgpu_util"],
  part: "q" | "k" | "v",
  B: number,
  nH: number,
  nKv: number,
  hd: number,
  scale: number,
  /** k or v written straight into a KV cache's slot: the cache tensor's shape ([B, nKv, hd, W] keys,
   *  [B, nKv, W, hd] values), the position a uniform `pos` (slot-write.ts' layouts). */
  slot?: number[],
) {
  const heads = part === "q" ? nH : nKv,
    first = part === "q" ? 0 : part === "k" ? nH : nH + nKv,
    width = (nH + 2 * nKv) * hd,
    half = hd / 2;
  const value =
    part === "v"
      ? "qkv[src]"
      : `(qkv[src] * cosT[b * ${hd} + j] + qkv[src - j + select(j - ${half}, j + ${half}, j < ${half})] * sinT[b * ${hd} + j])` +
        (part === "q" ? ` * ${f32(Math.fround(scale))}` : "");
  const n = B * heads * hd;
  const at = !slot ? "index" : slotAt(slot.length, part === "v", part === "v" ? hd : 1);
  const p = new RowProgram(
    u,
    `heads_${part}${slot ? "_slot" : ""}`,
    ["qkv", "cosT", "sinT"],
    slot ?? [B, heads, hd],
    slot ? { rows: Math.ceil(n / 64), wg: 64 } : "flat",
    `
    fn main(index: i32) {
      if (index < ${n}) {
        let b = index / ${heads * hd};
        let hj = index - b * ${heads * hd};
        let h = hj / ${hd};
        let j = hj - h * ${hd};
        let src = b * ${width} + (${first} + h) * ${hd} + j;
        result[${at}] = ${value};
      }
    }`,
  );
  if (slot) p.uniforms = "pos : i32,";
  return p;
}

/** RoPE (rotate-half) of x [rows, heads, hd] by cos, sin [rows, hd]; with `transpose` its adjoint (the
 *  gradient): out_j = x_j·cos_j + x_j'·sin_j' in place of x_j'·sin_j, j' = (j + hd/2) mod hd. */
function ropeProgram(u: WebgpuModule["webgpu_util"], rows: number, heads: number, hd: number, transpose: boolean) {
  const half = hd / 2;
  return new RowProgram(
    u,
    `rope_${transpose ? "t" : "n"}`,
    ["x", "cosT", "sinT"],
    [rows, heads, hd],
    "flat",
    `
    fn main(index: i32) {
      if (index < ${rows * heads * hd}) {
        let r = index / ${heads * hd};
        let j = index % ${hd};
        let jr = select(j - ${half}, j + ${half}, j < ${half});
        result[index] = x[index] * cosT[r * ${hd} + j] + x[index - j + jr] * sinT[r * ${hd} + ${transpose ? "jr" : "j"}];
      }
    }`,
  );
}

/** Thread g's element of qkv [rows, width]: its row n, head slot hs (q heads, then k, then v), column
 *  j in the head, and the head's first element src. */
export const qkvElement = (width: number, hd: number) => `let n = g / ${width};
        let col = g - n * ${width};
        let hs = col / ${hd};
        let j = col - hs * ${hd};
        let src = n * ${width} + hs * ${hd};`;

/** Any T (prefill, training): the heads of qkv [B·T, (nH + 2·nKv)·hd] in one dispatch, one thread per
 *  element of qkv: q (rope · scale, [B, nH, T, hd]) as the result, kT (rope, [B, nKv, hd, T]) and v
 *  ([B, nKv, T, hd]) as the outputs written beside it (program.ts runMulti); cos, sin [B·T, hd]. In
 *  place of two splits, RoPE, the scale and three transposes. */
function seqHeadsProgram(u: WebgpuModule["webgpu_util"], B: number, T: number, nH: number, nKv: number, hd: number, scale: number) {
  const width = (nH + 2 * nKv) * hd,
    half = hd / 2,
    total = B * T * width;
  const roped = (s: string) =>
    `(qkv[src + j] * cosT[n * ${hd} + j] + qkv[src + select(j - ${half}, j + ${half}, j < ${half})] * sinT[n * ${hd} + j])${s}`;
  const p = new RowProgram(
    u,
    "seq_heads",
    ["qkv", "cosT", "sinT", "kT", "v"],
    [B, nH, T, hd],
    { rows: Math.ceil(total / 64), wg: 64 },
    `
    fn main(index: i32) {
      let g = ${threadIndex(64)};
      if (g < ${total}) {
        ${qkvElement(width, hd)}
        let b = n / ${T};
        let t = n - b * ${T};
        if (hs < ${nH}) {
          result[((b * ${nH} + hs) * ${T} + t) * ${hd} + j] = ${roped(` * ${f32(Math.fround(scale))}`)};
        } else if (hs < ${nH + nKv}) {
          kT[((b * ${nKv} + hs - ${nH}) * ${hd} + j) * ${T} + t] = ${roped("")};
        } else {
          v[((b * ${nKv} + hs - ${nH + nKv}) * ${T} + t) * ${hd} + j] = qkv[src + j];
        }
      }
    }`,
  );
  p.writes = ["kT", "v"];
  return p;
}

/** The gradient of seqHeadsProgram's three parts with respect to qkv [B·T, (nH + 2·nKv)·hd]: RoPE's
 *  adjoint (x_j gets dy_j·cos_j + dy_j'·sin_j', j' = (j + hd/2) mod hd) and the scale, read from dq,
 *  dkT and dv in their layouts. */
function seqHeadsGradProgram(u: WebgpuModule["webgpu_util"], B: number, T: number, nH: number, nKv: number, hd: number, scale: number) {
  const width = (nH + 2 * nKv) * hd,
    half = hd / 2;
  return new RowProgram(
    u,
    "seq_heads_grad",
    ["dq", "dkT", "dv", "cosT", "sinT"],
    [B * T, width],
    "flat",
    `
    fn main(index: i32) {
      if (index < ${B * T * width}) {
        let n = index / ${width};
        let c = index % ${width};
        let hh = c / ${hd};
        let j = c % ${hd};
        let jr = select(j - ${half}, j + ${half}, j < ${half});
        let b = n / ${T};
        let t = n % ${T};
        var out = 0.0;
        if (hh < ${nH}) {
          let o = ((b * ${nH} + hh) * ${T} + t) * ${hd};
          out = (dq[o + j] * cosT[n * ${hd} + j] + dq[o + jr] * sinT[n * ${hd} + jr]) * ${f32(Math.fround(scale))};
        } else if (hh < ${nH + nKv}) {
          let o = (b * ${nKv} + hh - ${nH}) * ${hd * T} + t;
          out = dkT[o + j * ${T}] * cosT[n * ${hd} + j] + dkT[o + jr * ${T}] * sinT[n * ${hd} + jr];
        } else {
          out = dv[((b * ${nKv} + hh - ${nH + nKv}) * ${T} + t) * ${hd} + j];
        }
        result[index] = out;
      }
    }`,
  );
}

/** The block-diagonal [k·r, Σout] of k matrices [r, out_i] (LoRA's fused-module B): one dispatch in
 *  place of k pads and a concat. */
function blockDiagProgram(u: WebgpuModule["webgpu_util"], r: number, outs: number[]) {
  const total = outs.reduce((a, b) => a + b, 0);
  let off = 0;
  const cases = outs
    .map((o, i) => {
      const c = `if (i == ${i} && c >= ${off} && c < ${off + o}) { v = b${i}[(R - ${i * r}) * ${o} + c - ${off}]; }`;
      off += o;
      return c;
    })
    .join("\n        ");
  return new RowProgram(
    u,
    "block_diag",
    outs.map((_, i) => `b${i}`),
    [outs.length * r, total],
    "flat",
    `
    fn main(index: i32) {
      if (index < ${outs.length * r * total}) {
        let R = index / ${total};
        let c = index % ${total};
        let i = R / ${r};
        var v = 0.0;
        ${cases}
        result[index] = v;
      }
    }`,
  );
}

/** A KV cache's new position written into the cache's own buffer (slot-write.ts): src's n elements
 *  to dst[..., i, pos] (keys, dst [..., W]) or, with `rows`, dst[..., pos, :] (values, dst [..., W, D]). */
function slotProgram(u: WebgpuModule["webgpu_util"], dstShape: number[], n: number, rows: boolean) {
  const r = dstShape.length;
  const p = new RowProgram(
    u,
    rows ? "slot_rows" : "slot_cols",
    ["src"],
    dstShape,
    { rows: Math.ceil(n / 64), wg: 64 },
    `
    fn main(index: i32) {
      if (index < ${n}) { result[${slotAt(r, rows, rows ? dstShape[r - 1] : 1)}] = src[index]; }
    }`,
  );
  p.uniforms = "pos : i32,";
  return p;
}

/** Register the heads' kernels for the webgpu backend (when the backend starts). */
function registerWebgpuHeads(mod: WebgpuModule): void {
  const u = mod.webgpu_util;
  const on = ["webgpu"];
  const pos_ = (p: number) => [{ type: "int32", data: [p] }];
  setWebgpuHeadsInto((b, qkv, cos, sin, { nH, nKv, hd, scale }, kDst, vDst, pos) => {
    const B = qkv.shape[0];
    const q = run(b, headsProgram(u, "q", B, nH, nKv, hd, scale), [qkv, cos, sin]);
    writeInto(b, headsProgram(u, "k", B, nH, nKv, hd, scale, kDst.shape), [qkv, cos, sin], kDst, pos_(pos));
    writeInto(b, headsProgram(u, "v", B, nH, nKv, hd, scale, vDst.shape), [qkv, cos, sin], vDst, pos_(pos));
    return { ...q, shape: [B * nKv, nH / nKv, hd] }; // decodeHeads' layout of q
  });
  setWebgpuSlotWriter((b, dst, src, pos, rows) =>
    writeInto(b, slotProgram(u, dst.shape, tfjs.util.sizeFromShape(src.shape), rows), [src], dst, pos_(pos)),
  );
  registerKernel(
    K.rope,
    () =>
      ({ inputs, backend, attrs }) => {
        const { x, cos, sin } = inputs as { x: tf.TensorInfo; cos: tf.TensorInfo; sin: tf.TensorInfo };
        const [B, T, heads, hd] = x.shape;
        const out = run(backend, ropeProgram(u, B * T, heads, hd, attrs!.transpose as boolean), [x, cos, sin]);
        return { ...out, shape: x.shape };
      },
    on,
  );
  registerKernel(
    K.seqHeads,
    () =>
      ({ inputs, backend, attrs }) => {
        const { qkv, cos, sin } = inputs as { qkv: tf.TensorInfo; cos: tf.TensorInfo; sin: tf.TensorInfo };
        const { B, T, nH, nKv, hd, scale } = attrs as { B: number; T: number; nH: number; nKv: number; hd: number; scale: number };
        return runMulti(
          backend,
          seqHeadsProgram(u, B, T, nH, nKv, hd, scale),
          [qkv, cos, sin],
          [
            [B, nKv, hd, T],
            [B, nKv, T, hd],
          ],
        );
      },
    on,
  );
  registerKernel(
    K.seqHeadsGrad,
    () =>
      ({ inputs, backend, attrs }) => {
        const { dq, dkT, dv, cos, sin } = inputs as Record<string, tf.TensorInfo>;
        const { B, T, nH, nKv, hd, scale } = attrs as { B: number; T: number; nH: number; nKv: number; hd: number; scale: number };
        return run(backend, seqHeadsGradProgram(u, B, T, nH, nKv, hd, scale), [dq, dkT, dv, cos, sin]);
      },
    on,
  );
  registerKernel(
    BLOCK_DIAG,
    () =>
      ({ inputs, backend, attrs }) => {
        const { r, outs } = attrs as unknown as { r: number; outs: number[] };
        return run(
          backend,
          blockDiagProgram(u, r, outs),
          outs.map((_, i) => (inputs as Record<string, tf.TensorInfo>)[`b${i}`]),
        );
      },
    on,
  );
  tfjs.registerGradient({
    kernelName: BLOCK_DIAG,
    gradFunc: (dy, _saved, attrs) => {
      const { r, outs } = attrs as unknown as { r: number; outs: number[] };
      let off = 0;
      return Object.fromEntries(
        outs.map((o, i) => {
          const at = off;
          off += o;
          return [`b${i}`, () => tfjs.slice(dy as tf.Tensor2D, [i * r, at], [r, o])];
        }),
      );
    },
  });
  registerKernel(
    K.decodeHeads,
    () =>
      ({ inputs, backend, attrs }) => {
        const { qkv, cos, sin } = inputs as { qkv: tf.TensorInfo; cos: tf.TensorInfo; sin: tf.TensorInfo };
        const { nH, nKv, hd, scale } = attrs as { nH: number; nKv: number; hd: number; scale: number };
        const B = qkv.shape[0];
        const [q, k, v] = (["q", "k", "v"] as const).map((part) =>
          run(backend, headsProgram(u, part, B, nH, nKv, hd, scale), [qkv, cos, sin]),
        );
        // the layouts the wasm kernel returns (attention.ts reads these shapes)
        return [
          { ...q, shape: [B * nKv, nH / nKv, hd] },
          { ...k, shape: [B, nKv, hd, 1] },
          { ...v, shape: [B, nKv, 1, hd] },
        ];
      },
    on,
  );
}

webgpuFamily(registerWebgpuHeads);
