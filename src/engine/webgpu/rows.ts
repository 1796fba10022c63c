/** The row kernels the wasm heap module fused, as WGSL programs on the webgpu backend: RMSNorm and
 *  its gradient, SwiGLU and its gradient, attention's softmax and its gradient, RoPE and its
 *  gradient, a decode step's q/k/v heads with RoPE, a row's log p(target), entropy and logits
 *  gradient over the vocabulary, and a whole-vocabulary draw. Through tfjs ops each was 4–15 dispatches and as many passes over its tensor; here each is one (RMSNorm's
 *  gradient one for dx and two for dw, by parts: rmsnorm.ts; the decode heads three). A row reduction runs one workgroup per row (a tree sum in
 *  workgroup memory, float32); element-wise kernels one thread per output. Sizes are compiled into
 *  the shader (a model has a handful of row widths). Registered by webgpu/device.ts through kernels.ts'
 *  registerKernel; the op files (rmsnorm.ts, rope-swiglu.ts, heads.ts, softmax.ts, logprob.ts) hold the
 *  kernel names, the gradients and the choice of path. Inputs are 2-D views [rows, width] (a
 *  reshape is free); the vocabulary kernels are given chunks of rows no larger than the device's
 *  largest storage binding (profile.ts logitChunkFloats).
 *  Leaves out: float16, and vector (vec4) loads. */
import type * as tf from "@tensorflow/tfjs";
import * as tfjs from "@tensorflow/tfjs";
import { BLOCK_DIAG } from "../block-diag.ts";
import { DRAW_ROWS, drawCall } from "../draw.ts";
import { registerKernel, type Backend } from "../kernels.ts";
import { DLOGITS, LOGP } from "../logprob.ts";
import { RMS_NORM, RMS_NORM_DW, RMS_NORM_DX, RMS_NORM_GRAD } from "../rmsnorm.ts";
import { setWebgpuSlotWriter } from "../slot-write.ts";
import { DECODE_HEADS, SEQ_HEADS, SEQ_HEADS_GRAD, setWebgpuHeadsInto } from "../heads.ts";
import { ROPE, SWIGLU, SWIGLU_GRAD } from "../rope-swiglu.ts";
import { SOFTMAX, SOFTMAX_GRAD } from "../softmax.ts";

export type WebgpuModule = typeof import("@tensorflow/tfjs-backend-webgpu");

const K = {
  rmsNorm: RMS_NORM,
  rmsNormGrad: RMS_NORM_GRAD,
  swiglu: SWIGLU,
  swigluGrad: SWIGLU_GRAD,
  softmax: SOFTMAX,
  softmaxGrad: SOFTMAX_GRAD,
  decodeHeads: DECODE_HEADS,
  rope: ROPE,
  seqHeads: SEQ_HEADS,
  seqHeadsGrad: SEQ_HEADS_GRAD,
  logp: LOGP,
  dLogits: DLOGITS,
};

export const f32 = (x: number) => (Number.isInteger(x) ? `${x}.0` : `${x}`);

/** One program: its inputs, output shape, dispatch and WGSL body (the tfjs header declares the
 *  inputs as arrays named by `inputs`, the output as `result`). */
export class RowProgram {
  variableNames: string[];
  outputShape: number[];
  workgroupSize: [number, number, number];
  dispatchLayout: { x: number[] };
  dispatch: [number, number, number];
  shaderKey: string;
  /** Uniforms of the program's own ("name : type,"), their values passed to runWebGPUProgram. */
  uniforms?: string;
  constructor(
    util: WebgpuModule["webgpu_util"],
    name: string,
    inputs: string[],
    outputShape: number[],
    /** "rows": one workgroup of `wg` per row of `rows`; "flat": one thread per output element. */
    grid: { rows: number; wg: number } | "flat",
    private body: string,
  ) {
    this.variableNames = inputs;
    this.outputShape = outputShape;
    this.dispatchLayout = util.flatDispatchLayout(outputShape);
    if (grid === "flat") {
      this.workgroupSize = [64, 1, 1];
      this.dispatch = util.computeDispatch(this.dispatchLayout, outputShape, this.workgroupSize);
    } else {
      this.workgroupSize = [grid.wg, 1, 1];
      this.dispatch = [grid.rows, 1, 1];
    }
    this.shaderKey = `marl_${name}_${body.length}_${hash(body)}`;
  }
  getUserCode(): string {
    // Every binding statically used: the pipeline's "auto" layout leaves out the unused ones, and
    // tfjs binds all of them (the uniforms included).
    const uses = ["_ = uniforms.NAN;", ...this.variableNames.map((v) => `_ = ${v}[0];`)].join(" ");
    return this.body.replace("fn main(index: i32) {", `fn main(index: i32) {\n      ${uses}`);
  }
}

function hash(s: string): string {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619);
  return (h >>> 0).toString(36);
}

/** Workgroup size for rows of `width`: 256 threads on wide rows, 64 on narrow ones. */
export const wgFor = (width: number) => (width >= 2048 ? 256 : 64);

/** Where element `index` of a KV cache's new position goes in the cache tensor (slot-write.ts'
 *  layouts): keys [..., W] take it at (index·W + pos) (D 1), values [..., W, D] their row index / D at
 *  position pos, column index mod D; W (the output's shape uniform of that axis) and pos (a uniform)
 *  are read at run time, so one shader serves every step and width. */
const slotAt = (rank: number, rows: boolean, D: number) =>
  `(index / ${D} * uniforms.outShape[${rows ? rank - 2 : rank - 1}] + uniforms.pos) * ${D} + index % ${D}`;

/** The row index (workgroups past the last row, from a dispatch tfjs reshaped to 2-D or 3-D, compute
 *  row rows − 1 again and write nothing: barriers need every thread) and tree reductions. */
export const rowPrelude = (wg: number, rows: number | string) => `
  const WG = ${wg}u;
  var<workgroup> red: array<f32, ${wg}>;
  fn rowIndex() -> i32 {
    return i32(workgroupId.z * numWorkgroups.x * numWorkgroups.y + workgroupId.y * numWorkgroups.x + workgroupId.x);
  }
  fn rowOk() -> bool { return rowIndex() < ${rows}; }
  fn row() -> i32 { return min(rowIndex(), ${rows} - 1); }
  fn reduceSum(v: f32) -> f32 {
    red[localIndex] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
      if (localIndex < s) { red[localIndex] = red[localIndex] + red[localIndex + s]; }
      workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
  }
  fn reduceMax(v: f32) -> f32 {
    red[localIndex] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
      if (localIndex < s) { red[localIndex] = max(red[localIndex], red[localIndex + s]); }
      workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
  }
`;

/** y = x · rsqrt(mean(x²) + eps) · w; x [N, H]. */
function rmsNormProgram(u: WebgpuModule["webgpu_util"], N: number, H: number, eps: number) {
  const wg = wgFor(H);
  return new RowProgram(
    u,
    "rmsnorm",
    ["x", "w"],
    [N, H],
    { rows: N, wg },
    `${rowPrelude(wg, N)}
    fn main(index: i32) {
      let o = row() * ${H};
      var ss = 0.0;
      for (var j = i32(localIndex); j < ${H}; j += ${wg}) { let v = x[o + j]; ss += v * v; }
      let r = inverseSqrt(reduceSum(ss) / ${f32(H)} + ${f32(eps)});
      if (rowOk()) { for (var j = i32(localIndex); j < ${H}; j += ${wg}) { result[o + j] = x[o + j] * r * w[j]; } }
    }`,
  );
}

/** r = rsqrt(mean(x²) + eps) per row: [N]. */
function rmsRProgram(u: WebgpuModule["webgpu_util"], N: number, H: number, eps: number) {
  const wg = wgFor(H);
  return new RowProgram(
    u,
    "rms_r",
    ["x"],
    [N],
    { rows: N, wg },
    `${rowPrelude(wg, N)}
    fn main(index: i32) {
      let o = row() * ${H};
      var ss = 0.0;
      for (var j = i32(localIndex); j < ${H}; j += ${wg}) { let v = x[o + j]; ss += v * v; }
      let r = inverseSqrt(reduceSum(ss) / ${f32(H)} + ${f32(eps)});
      if (rowOk() && localIndex == 0u) { result[row()] = r; }
    }`,
  );
}

/** dx_j = r·dy_j·w_j − r³·x_j·Σ_k dy_k·w_k·x_k / H per row, r = rsqrt(mean(x²) + eps) in the same
 *  row pass: the gradient's dx in one dispatch. */
function rmsDxProgram(u: WebgpuModule["webgpu_util"], N: number, H: number, eps: number) {
  const wg = wgFor(H);
  return new RowProgram(
    u,
    "rms_dx_only",
    ["x", "w", "dy"],
    [N, H],
    { rows: N, wg },
    `${rowPrelude(wg, N)}
    fn main(index: i32) {
      let o = row() * ${H};
      var ss = 0.0;
      var s = 0.0;
      for (var j = i32(localIndex); j < ${H}; j += ${wg}) { let v = x[o + j]; ss += v * v; s += dy[o + j] * w[j] * v; }
      let rr = inverseSqrt(reduceSum(ss) / ${f32(H)} + ${f32(eps)});
      let c = rr * rr * rr * reduceSum(s) / ${f32(H)};
      if (rowOk()) { for (var j = i32(localIndex); j < ${H}; j += ${wg}) { result[o + j] = rr * dy[o + j] * w[j] - c * x[o + j]; } }
    }`,
  );
}

/** dw_j = Σ_rows dy_j·x_j·r: one thread per column. */
function rmsDwProgram(u: WebgpuModule["webgpu_util"], N: number, H: number) {
  return new RowProgram(
    u,
    "rms_dw",
    ["x", "dy", "r"],
    [H],
    "flat",
    `
    fn main(index: i32) {
      if (index < ${H}) {
        var acc = 0.0;
        for (var n = 0; n < ${N}; n++) { acc += dy[n * ${H} + index] * x[n * ${H} + index] * r[n]; }
        result[index] = acc;
      }
    }`,
  );
}

/** y [N, I] = silu(gate)·up from gu [N, 2I]. */
function swigluProgram(u: WebgpuModule["webgpu_util"], N: number, I: number) {
  return new RowProgram(
    u,
    "swiglu",
    ["gu"],
    [N, I],
    "flat",
    `
    fn main(index: i32) {
      if (index < ${N * I}) {
        let n = index / ${I};
        let j = index - n * ${I};
        let g = gu[n * ${2 * I} + j];
        result[index] = g / (1.0 + exp(-g)) * gu[n * ${2 * I} + ${I} + j];
      }
    }`,
  );
}

/** dgu [N, 2I]: d gate = dy·u·s·(1 + g·(1 − s)), d up = dy·g·s, s = sigmoid(g). */
function swigluGradProgram(u: WebgpuModule["webgpu_util"], N: number, I: number) {
  return new RowProgram(
    u,
    "swiglu_grad",
    ["gu", "dy"],
    [N, 2 * I],
    "flat",
    `
    fn main(index: i32) {
      if (index < ${2 * N * I}) {
        let n = index / ${2 * I};
        let c = index - n * ${2 * I};
        let j = select(c - ${I}, c, c < ${I});
        let g = gu[n * ${2 * I} + j];
        let up = gu[n * ${2 * I} + ${I} + j];
        let d = dy[n * ${I} + j];
        let s = 1.0 / (1.0 + exp(-g));
        result[index] = select(d * g * s, d * up * s * (1.0 + g * (1.0 - s)), c < ${I});
      }
    }`,
  );
}

/** Softmax over rows of x [R, S]: masked scores (−1e9) get exactly 0. R and S are read from the
 *  output's shape uniform, not compiled in: a decode step's attention width grows by one each step,
 *  and a shader per width was a compile every step. */
function softmaxProgram(u: WebgpuModule["webgpu_util"], R: number, S: number) {
  const wg = wgFor(S);
  return new RowProgram(
    u,
    "softmax",
    ["x"],
    [R, S],
    { rows: R, wg },
    `${rowPrelude(wg, "uniforms.outShape[0]")}
    fn main(index: i32) {
      let S = uniforms.outShape[1];
      let o = row() * S;
      var m = -3.402823e+38;
      for (var j = i32(localIndex); j < S; j += ${wg}) { m = max(m, x[o + j]); }
      m = reduceMax(m);
      var s = 0.0;
      for (var j = i32(localIndex); j < S; j += ${wg}) { s += exp(x[o + j] - m); }
      let inv = 1.0 / reduceSum(s);
      if (rowOk()) { for (var j = i32(localIndex); j < S; j += ${wg}) { result[o + j] = exp(x[o + j] - m) * inv; } }
    }`,
  );
}

/** dx = y·(dy − Σ dy·y) per row of y, dy [R, S]. */
function softmaxGradProgram(u: WebgpuModule["webgpu_util"], R: number, S: number) {
  const wg = wgFor(S);
  return new RowProgram(
    u,
    "softmax_grad",
    ["y", "dy"],
    [R, S],
    { rows: R, wg },
    `${rowPrelude(wg, R)}
    fn main(index: i32) {
      let o = row() * ${S};
      var s = 0.0;
      for (var j = i32(localIndex); j < ${S}; j += ${wg}) { s += dy[o + j] * y[o + j]; }
      let t = reduceSum(s);
      if (rowOk()) { for (var j = i32(localIndex); j < ${S}; j += ${wg}) { result[o + j] = y[o + j] * (dy[o + j] - t); } }
    }`,
  );
}

/** Per row of logits [n, V]: [log p(target), entropy] → [n, 2]. */
function logpProgram(u: WebgpuModule["webgpu_util"], n: number, V: number) {
  const wg = wgFor(V);
  return new RowProgram(
    u,
    "logp",
    ["logits", "targets"],
    [n, 2],
    { rows: n, wg },
    `${rowPrelude(wg, n)}
    fn main(index: i32) {
      let o = row() * ${V};
      var m = -3.402823e+38;
      for (var j = i32(localIndex); j < ${V}; j += ${wg}) { m = max(m, logits[o + j]); }
      m = reduceMax(m);
      var s = 0.0;
      var sx = 0.0;
      for (var j = i32(localIndex); j < ${V}; j += ${wg}) {
        let x = logits[o + j];
        let e = exp(x - m);
        s += e;
        sx += e * (x - m);
      }
      let S = reduceSum(s);
      let SX = reduceSum(sx);
      if (rowOk() && localIndex == 0u) {
        let ls = log(S);
        result[row() * 2] = logits[o + targets[row()]] - m - ls;
        result[row() * 2 + 1] = ls - SX / S;
      }
    }`,
  );
}

/** d logits [n, V] = dy[:, 0]·(onehot(target) − softmax(logits)). */
function dLogitsProgram(u: WebgpuModule["webgpu_util"], n: number, V: number) {
  const wg = wgFor(V);
  return new RowProgram(
    u,
    "dlogits",
    ["logits", "targets", "dy"],
    [n, V],
    { rows: n, wg },
    `${rowPrelude(wg, n)}
    fn main(index: i32) {
      let o = row() * ${V};
      var m = -3.402823e+38;
      for (var j = i32(localIndex); j < ${V}; j += ${wg}) { m = max(m, logits[o + j]); }
      m = reduceMax(m);
      var s = 0.0;
      for (var j = i32(localIndex); j < ${V}; j += ${wg}) { s += exp(logits[o + j] - m); }
      let d = dy[row() * 2];
      let c = -d / reduceSum(s);
      let t = targets[row()];
      if (rowOk()) {
        for (var j = i32(localIndex); j < ${V}; j += ${wg}) { result[o + j] = c * exp(logits[o + j] - m) + select(0.0, d, j == t); }
      }
    }`,
  );
}

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
      : `(qkv[src] * cosT[b * ${hd} + j] + qkv[src - j + select(j - ${half}, j + ${half}, j < ${half})] * sinT[b * ${hd} + j])${part === "q" ? ` * ${f32(Math.fround(scale))}` : ""}`;
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

/** Any T (prefill, training): the heads of qkv [B·T, (nH + 2·nKv)·hd] in attention's layouts, part "q"
 *  (rope · scale, [B, nH, T, hd]), "kT" (rope, [B, nKv, hd, T]) or "v" ([B, nKv, T, hd]); cos, sin
 *  [B·T, hd]. In place of two splits, RoPE, the scale and three transposes. */
function seqHeadsProgram(
  u: WebgpuModule["webgpu_util"],
  part: "q" | "kT" | "v",
  B: number,
  T: number,
  nH: number,
  nKv: number,
  hd: number,
  scale: number,
) {
  const heads = part === "q" ? nH : nKv,
    first = part === "q" ? 0 : part === "kT" ? nH : nH + nKv,
    width = (nH + 2 * nKv) * hd,
    half = hd / 2;
  // index → (b, h, t, j) in the part's layout
  const coords =
    part === "kT"
      ? `let t = index % ${T}; let j = (index / ${T}) % ${hd}; let h = (index / ${T * hd}) % ${heads}; let b = index / ${T * hd * heads};`
      : `let j = index % ${hd}; let t = (index / ${hd}) % ${T}; let h = (index / ${T * hd}) % ${heads}; let b = index / ${T * hd * heads};`;
  const value =
    part === "v"
      ? "qkv[src + j]"
      : `(qkv[src + j] * cosT[n * ${hd} + j] + qkv[src + select(j - ${half}, j + ${half}, j < ${half})] * sinT[n * ${hd} + j])${part === "q" ? ` * ${f32(Math.fround(scale))}` : ""}`;
  return new RowProgram(
    u,
    `seq_heads_${part}`,
    ["qkv", "cosT", "sinT"],
    part === "kT" ? [B, heads, hd, T] : [B, heads, T, hd],
    "flat",
    `
    fn main(index: i32) {
      if (index < ${B * heads * T * hd}) {
        ${coords}
        let n = b * ${T} + t;
        let src = n * ${width} + (${first} + h) * ${hd};
        result[index] = ${value};
      }
    }`,
  );
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

/** A whole-vocabulary draw per row (draw.ts): the id walk of rollout/sample-row.ts, one workgroup per
 *  row. Weights exp((x − max)/T) (0 below −40, NaN ignored) are float32; every sum of them (over
 *  256 contiguous chunks of ids, the chunks' running sums, the normaliser, the target u·Σ and the
 *  walk) is carried in double-float32 (a value and its rounding error), so the walk crosses where the
 *  host's float64 walk does: float32 alone resolves a cumulative sum to ~1e-7 of it, about a token's
 *  share of a flat 152k-token row, and drew a neighbour in ~1 of 200 such draws. The one thread
 *  owning the chunk the target falls in walks its ids. us holds per row u as two
 *  float32 (u = hi + lo). Output [B, 2]: the token (−1 where the row has no finite largest logit)
 *  and its log-prob (x − max)/T − log Σ, in float32. */
function drawProgram(u: WebgpuModule["webgpu_util"], B: number, V: number, T: number) {
  const wg = 256,
    C = Math.ceil(V / wg);
  return new RowProgram(
    u,
    "draw",
    ["x", "us"],
    [B, 2],
    { rows: B, wg },
    `${rowPrelude(wg, B)}
  var<workgroup> sums: array<vec2<f32>, ${wg}>;
  var<workgroup> pre: array<vec2<f32>, ${wg + 1}>;
  var<workgroup> pick: i32;
  var<workgroup> rem: vec2<f32>;
  fn wt(v: f32, m: f32) -> f32 {
    let z = (v - m) / ${f32(T)};
    if (z > -40.0) { return exp(z); }
    return 0.0;
  }
  fn twoSum(a: f32, b: f32) -> vec2<f32> {
    let s = a + b;
    let bb = s - a;
    return vec2<f32>(s, (a - (s - bb)) + (b - bb));
  }
  fn norm(a: f32, b: f32) -> vec2<f32> {
    let s = a + b;
    return vec2<f32>(s, b - (s - a));
  }
  fn ddAdd(a: vec2<f32>, b: f32) -> vec2<f32> {
    let s = twoSum(a.x, b);
    return norm(s.x, s.y + a.y);
  }
  fn ddAdd2(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let s = twoSum(a.x, b.x);
    return norm(s.x, s.y + (a.y + b.y));
  }
  fn ddLess(a: vec2<f32>, b: vec2<f32>) -> bool { return a.x < b.x || (a.x == b.x && a.y < b.y); }
  fn main(index: i32) {
    let o = row() * ${V};
    var m = -3.4028234663852886e38;
    for (var j = i32(localIndex); j < ${V}; j += ${wg}) { let v = x[o + j]; if (v > m) { m = v; } }
    m = reduceMax(m);
    let j0 = i32(localIndex) * ${C};
    let j1 = min(${V}, j0 + ${C});
    var s = vec2<f32>(0.0, 0.0);
    for (var j = j0; j < j1; j++) { s = ddAdd(s, wt(x[o + j], m)); }
    sums[localIndex] = s;
    workgroupBarrier();
    if (localIndex == 0u) {
      var acc = vec2<f32>(0.0, 0.0);
      for (var t = 0; t < ${wg}; t++) { pre[t] = acc; acc = ddAdd2(acc, sums[t]); }
      pre[${wg}] = acc;
      let uh = us[row() * 2];
      let ul = us[row() * 2 + 1];
      let p = uh * acc.x;
      let tgt = norm(p, fma(uh, acc.x, -p) + (uh * acc.y + ul * acc.x));
      var c = 0;
      for (var t = 0; t < ${wg}; t++) {
        if (sums[t].x > 0.0) {
          c = t;
          if (ddLess(tgt, pre[t + 1])) { break; }
        }
      }
      pick = c;
      let d = twoSum(tgt.x, -pre[c].x);
      rem = norm(d.x, d.y + (tgt.y - pre[c].y));
    }
    workgroupBarrier();
    if (rowOk() && i32(localIndex) == pick) {
      var walked = vec2<f32>(0.0, 0.0);
      var tok = j0;
      for (var j = j0; j < j1; j++) {
        let w = wt(x[o + j], m);
        if (w > 0.0) {
          walked = ddAdd(walked, w);
          tok = j;
          if (ddLess(rem, walked)) { break; }
        }
      }
      let total = pre[${wg}].x + pre[${wg}].y;
      let finite = m > -3.4028234663852886e38 && m < 3.4028234663852886e38;
      result[row() * 2] = select(-1.0, f32(tok), finite);
      result[row() * 2 + 1] = (x[o + tok] - m) / ${f32(T)} - log(total);
    }
  }`,
  );
}

/** Greedy per row (draw.ts at temperature 0): the largest logit's lowest id (NaN passed over, as the
 *  host's argmax), log-prob 0; token −1 where the row has no finite largest logit. Output [B, 2]. */
function greedyProgram(u: WebgpuModule["webgpu_util"], B: number, V: number) {
  const wg = 256;
  return new RowProgram(
    u,
    "greedy",
    ["x"],
    [B, 2],
    { rows: B, wg },
    `${rowPrelude(wg, B)}
  var<workgroup> at: array<i32, ${wg}>;
  fn main(index: i32) {
    let o = row() * ${V};
    var m = -3.4028234663852886e38;
    var best = ${V};
    for (var j = i32(localIndex); j < ${V}; j += ${wg}) {
      let v = x[o + j];
      if (v > m) { m = v; best = j; }
    }
    let top = reduceMax(m);
    at[localIndex] = select(${V}, best, m == top);
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
      if (localIndex < s) { at[localIndex] = min(at[localIndex], at[localIndex + s]); }
      workgroupBarrier();
    }
    if (rowOk() && localIndex == 0u) {
      let finite = top > -3.4028234663852886e38 && top < 3.4028234663852886e38 && at[0] < ${V};
      result[row() * 2] = select(-1.0, f32(at[0]), finite);
      result[row() * 2 + 1] = 0.0;
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

/** Register the row kernels for the webgpu backend (once the package is loaded). */
export function registerWebgpuRows(mod: WebgpuModule): void {
  const u = mod.webgpu_util;
  const run = (b: Backend, p: RowProgram, inputs: tf.TensorInfo[]) => b.runWebGPUProgram(p, inputs, "float32") as tf.TensorInfo;
  const on = ["webgpu"];
  /** Runs a slot program with dst, a cache tensor, as its output: written in place at `pos`. */
  const writeInto = (b: Backend, p: RowProgram, inputs: tf.TensorInfo[], dst: tf.TensorInfo, pos: number) => {
    b.runWebGPUProgram(p, inputs, "float32", [{ type: "int32", data: [pos] }], dst);
    b.tensorMap.get(dst.dataId).values = null; // a copy read back earlier is stale now
  };
  setWebgpuHeadsInto((b, qkv, cos, sin, { nH, nKv, hd, scale }, kDst, vDst, pos) => {
    const B = qkv.shape[0];
    const q = run(b, headsProgram(u, "q", B, nH, nKv, hd, scale), [qkv, cos, sin]);
    writeInto(b, headsProgram(u, "k", B, nH, nKv, hd, scale, kDst.shape), [qkv, cos, sin], kDst, pos);
    writeInto(b, headsProgram(u, "v", B, nH, nKv, hd, scale, vDst.shape), [qkv, cos, sin], vDst, pos);
    return { ...q, shape: [B * nKv, nH / nKv, hd] }; // decodeHeads' layout of q
  });
  setWebgpuSlotWriter((b, dst, src, pos, rows) =>
    writeInto(b, slotProgram(u, dst.shape, tfjs.util.sizeFromShape(src.shape), rows), [src], dst, pos),
  );
  const rowsOf = (t: tf.TensorInfo) => t.shape.slice(0, -1).reduce((a, d) => a * d, 1);
  const last = (t: tf.TensorInfo) => t.shape[t.shape.length - 1];
  registerKernel(
    DRAW_ROWS,
    () =>
      ({ inputs, backend, attrs }) => {
        const { logits, temperature, us, B, V } = drawCall(inputs, attrs);
        const b = backend as Backend;
        if (temperature === 0) return run(b, greedyProgram(u, B, V), [logits]);
        const hiLo = new Float32Array(2 * B); // each uniform as float32 hi + lo
        us.forEach((x, r) => {
          hiLo[2 * r] = Math.fround(x);
          hiLo[2 * r + 1] = x - hiLo[2 * r];
        });
        const uv = b.makeTensorInfo([B, 2], "float32", hiLo) as tf.TensorInfo;
        const out = run(b, drawProgram(u, B, V, temperature), [logits, uv]);
        b.disposeData(uv.dataId);
        return out;
      },
    on,
  );
  registerKernel(
    K.rmsNorm,
    () =>
      ({ inputs, backend, attrs }) => {
        const { x, w } = inputs as { x: tf.TensorInfo; w: tf.TensorInfo };
        return run(backend, rmsNormProgram(u, x.shape[0], w.shape[0], attrs!.eps as number), [x, w]);
      },
    on,
  );
  registerKernel(
    K.rmsNormGrad,
    () =>
      ({ inputs, backend, attrs }) => {
        const { x, w, dy } = inputs as { x: tf.TensorInfo; w: tf.TensorInfo; dy: tf.TensorInfo };
        const [N, H] = x.shape;
        const dx = run(backend, rmsDxProgram(u, N, H, attrs!.eps as number), [x, w, dy]);
        const r = run(backend, rmsRProgram(u, N, H, attrs!.eps as number), [x]);
        const dw = run(backend, rmsDwProgram(u, N, H), [x, dy, r]);
        (backend as Backend).disposeData(r.dataId);
        return [dx, dw];
      },
    on,
  );
  registerKernel(
    RMS_NORM_DX,
    () =>
      ({ inputs, backend, attrs }) => {
        const { x, w, dy } = inputs as { x: tf.TensorInfo; w: tf.TensorInfo; dy: tf.TensorInfo };
        return run(backend, rmsDxProgram(u, x.shape[0], x.shape[1], attrs!.eps as number), [x, w, dy]);
      },
    on,
  );
  registerKernel(
    RMS_NORM_DW,
    () =>
      ({ inputs, backend, attrs }) => {
        const { x, dy } = inputs as { x: tf.TensorInfo; dy: tf.TensorInfo };
        const [N, H] = x.shape;
        const r = run(backend, rmsRProgram(u, N, H, attrs!.eps as number), [x]);
        const dw = run(backend, rmsDwProgram(u, N, H), [x, dy, r]);
        (backend as Backend).disposeData(r.dataId);
        return dw;
      },
    on,
  );
  registerKernel(
    K.swiglu,
    () =>
      ({ inputs, backend }) => {
        const { gu } = inputs as { gu: tf.TensorInfo };
        return run(backend, swigluProgram(u, gu.shape[0], gu.shape[1] / 2), [gu]);
      },
    on,
  );
  registerKernel(
    K.swigluGrad,
    () =>
      ({ inputs, backend }) => {
        const { gu, dy } = inputs as { gu: tf.TensorInfo; dy: tf.TensorInfo };
        return run(backend, swigluGradProgram(u, gu.shape[0], gu.shape[1] / 2), [gu, dy]);
      },
    on,
  );
  registerKernel(
    K.softmax,
    () =>
      ({ inputs, backend }) => {
        const { x } = inputs as { x: tf.TensorInfo };
        const out = run(backend, softmaxProgram(u, rowsOf(x), last(x)), [x]);
        return { ...out, shape: x.shape };
      },
    on,
  );
  registerKernel(
    K.softmaxGrad,
    () =>
      ({ inputs, backend }) => {
        const { y, dy } = inputs as { y: tf.TensorInfo; dy: tf.TensorInfo };
        const out = run(backend, softmaxGradProgram(u, rowsOf(y), last(y)), [y, dy]);
        return { ...out, shape: y.shape };
      },
    on,
  );
  registerKernel(
    K.logp,
    () =>
      ({ inputs, backend }) => {
        const { logits, targets } = inputs as { logits: tf.TensorInfo; targets: tf.TensorInfo };
        return run(backend, logpProgram(u, logits.shape[0], logits.shape[1]), [logits, targets]);
      },
    on,
  );
  registerKernel(
    K.dLogits,
    () =>
      ({ inputs, backend }) => {
        const { logits, targets, dy } = inputs as { logits: tf.TensorInfo; targets: tf.TensorInfo; dy: tf.TensorInfo };
        return run(backend, dLogitsProgram(u, logits.shape[0], logits.shape[1]), [logits, targets, dy]);
      },
    on,
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
        return (["q", "kT", "v"] as const).map((part) => run(backend, seqHeadsProgram(u, part, B, T, nH, nKv, hd, scale), [qkv, cos, sin]));
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
