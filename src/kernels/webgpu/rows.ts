/** The row kernels the wasm heap module fused, as WGSL programs on the webgpu backend: RMSNorm and
 *  its gradient (by parts: dx one dispatch, dw two; rmsnorm.ts), SwiGLU and its gradient, attention's
 *  softmax and its gradient; the attention heads' kernels are in heads.ts, the vocabulary's in
 *  vocab.ts. Through tfjs ops each was 4–15 dispatches and as many passes over its tensor; here each
 *  is one. A row reduction runs one workgroup per row (a tree sum in workgroup memory, float32);
 *  element-wise kernels one thread per output. Registers itself (families.ts) through
 *  kernels.ts' registerKernel; the op files (rmsnorm.ts, rope-swiglu.ts, softmax.ts) hold the kernel names, the
 *  gradients and the choice of path. Inputs are 2-D views [rows, width] (a reshape is free).
 *  Leaves out: float16, and vector (vec4) loads. */
import type * as tf from "@tensorflow/tfjs";
import { registerKernel, type Backend } from "../kernels.ts";
import { RMS_NORM, RMS_NORM_DW, RMS_NORM_DX, RMS_NORM_GRAD } from "../rmsnorm.ts";
import { SWIGLU, SWIGLU_GRAD } from "../rope-swiglu.ts";
import { SOFTMAX, SOFTMAX_GRAD } from "../softmax.ts";
import { cols, f32, RowProgram, rowPrelude, run, wgFor, type WebgpuModule } from "./program.ts";
import { webgpuFamily } from "./families.ts";

const K = {
  rmsNorm: RMS_NORM,
  rmsNormGrad: RMS_NORM_GRAD,
  swiglu: SWIGLU,
  swigluGrad: SWIGLU_GRAD,
  softmax: SOFTMAX,
  softmaxGrad: SOFTMAX_GRAD,
};

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
      ${cols(H, wg, `let v = x[o + j]; ss += v * v;`)}
      let r = inverseSqrt(reduceSum(ss) / ${f32(H)} + ${f32(eps)});
      if (rowOk()) { ${cols(H, wg, `result[o + j] = x[o + j] * r * w[j];`)} }
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
      ${cols(H, wg, `let v = x[o + j]; ss += v * v;`)}
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
      ${cols(H, wg, `let v = x[o + j]; ss += v * v; s += dy[o + j] * w[j] * v;`)}
      let rr = inverseSqrt(reduceSum(ss) / ${f32(H)} + ${f32(eps)});
      let c = rr * rr * rr * reduceSum(s) / ${f32(H)};
      if (rowOk()) { ${cols(H, wg, `result[o + j] = rr * dy[o + j] * w[j] - c * x[o + j];`)} }
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
 *  and a shader per width was a compile every step. With `bias`, softmax of x + bias for x [B, H, T,
 *  S] as rows [B·H·T, S] and bias [B, 1, T, S] (attention's mask, added here rather than by a
 *  dispatch of its own): row (b, h, t) adds bias row (b, t), the sizes from the shape uniforms too. */
function softmaxProgram(u: WebgpuModule["webgpu_util"], R: number, S: number, bias = false) {
  const wg = wgFor(S);
  const at = bias ? "(x[o + j] + bias[ob + j])" : "x[o + j]";
  return new RowProgram(
    u,
    bias ? "softmax_bias" : "softmax",
    bias ? ["x", "bias"] : ["x"],
    [R, S],
    { rows: R, wg },
    `${rowPrelude(wg, "uniforms.outShape[0]")}
    fn main(index: i32) {
      let S = uniforms.outShape[1];
      let o = row() * S;
      ${bias ? `let ob = ((row() / (uniforms.outShape[0] / uniforms.biasShape[0])) * uniforms.biasShape[2]` : ""}
      ${bias ? `  + row() % uniforms.biasShape[2]) * S;` : ""}
      var m = -3.402823e+38;
      ${cols("S", wg, `m = max(m, ${at});`)}
      m = reduceMax(m);
      var s = 0.0;
      ${cols("S", wg, `s += exp(${at} - m);`)}
      let inv = 1.0 / reduceSum(s);
      if (rowOk()) { ${cols("S", wg, `result[o + j] = exp(${at} - m) * inv;`)} }
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
      ${cols(S, wg, `s += dy[o + j] * y[o + j];`)}
      let t = reduceSum(s);
      if (rowOk()) { ${cols(S, wg, `result[o + j] = y[o + j] * (dy[o + j] - t);`)} }
    }`,
  );
}

/** Register the row kernels for the webgpu backend (when the backend starts). */
function registerWebgpuRows(mod: WebgpuModule): void {
  const u = mod.webgpu_util;
  const on = ["webgpu"];
  const rowsOf = (t: tf.TensorInfo) => t.shape.slice(0, -1).reduce((a, d) => a * d, 1);
  const last = (t: tf.TensorInfo) => t.shape[t.shape.length - 1];
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
        const { x, bias } = inputs as { x: tf.TensorInfo; bias?: tf.TensorInfo };
        const out = bias
          ? run(backend, softmaxProgram(u, rowsOf(x), last(x), true), [x, bias])
          : run(backend, softmaxProgram(u, rowsOf(x), last(x)), [x]);
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
}

webgpuFamily(registerWebgpuRows);
