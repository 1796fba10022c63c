/** RoPE (rotate-half) and SwiGLU (silu(gate)·up) as one kernel each way on the CPU backends (wasm,
 *  cpu) for small inputs: a JS pass over heap views, as rmsnorm.ts does. Through tfjs ops RoPE is five
 *  kernels (SplitV, Concat, two Multiply, Add) and SwiGLU four (SplitV, Sigmoid, two Multiply); a
 *  small model's decode step launched 36 of its ~200 kernels for them, each costing more to launch
 *  than its few thousand elements take. Large inputs (prefill, training) and other backends keep the
 *  op path, whose SIMD kernels win there; results agree with it to float32 rounding. The exception is
 *  SwiGLU on wasm: there the heap module's vector kernel (heap-code.ts) runs at every size, split
 *  over the helper threads by rows, in place of the op path's SplitV, Sigmoid, two Multiply and a
 *  backward of seven kernels (a small training step's 32 Multiply, 4 Sigmoid, 4 SplitV and 4 Concat
 *  of [2048, 688] became 8 kernel calls). On webgpu all four are WGSL programs (webgpu/rows.ts; RoPE in webgpu/heads.ts) at
 *  every size: there each op of the op path is a dispatch. */
import * as tf from "@tensorflow/tfjs";
import { type CustomGradFn, heapOffset, once, registerKernel } from "./kernels.ts";
import { heapSwiglu } from "./wasm/heap-ops.ts";

/** Elements up to which the JS kernels run (a decode step's rows; prefill and training use ops). */
const MAX_KERNEL_ELEMENTS = 64 * 1024;
/** Whether rope() of this many elements runs the JS kernel on wasm/cpu, which rounds each output to
 *  float32 once (its sum in float64), or the op path, which rounds each product and the sum (the
 *  heads kernels of heads.ts round as the layer's op path would, to give its bits). */
export const ropeKernelRuns = (size: number) => size <= MAX_KERNEL_ELEMENTS;

/** out = x·cos + rot(x)·sin over the last axis (hd): rot(x)[j] = x[(j + hd/2) mod hd], the sign of
 *  rotate-half being in the sin table's first half (attention.ts ropeTables). x [rows·heads·hd],
 *  tables [rows·hd]. With `transpose`, the adjoint: dx[j] = dy[j]·cos[j] + dy[j']·sin[j'], j' = (j +
 *  hd/2) mod hd, the gradient of the same rotation. */
export function ropeInto(
  out: Float32Array,
  x: Float32Array,
  cos: Float32Array,
  sin: Float32Array,
  heads: number,
  hd: number,
  transpose: boolean,
): void {
  const half = hd / 2,
    rows = cos.length / hd;
  for (let r = 0; r < rows; r++) {
    const t = r * hd;
    for (let h = 0; h < heads; h++) {
      const o = (r * heads + h) * hd;
      for (let j = 0; j < hd; j++) {
        const jr = j < half ? j + half : j - half;
        out[o + j] = x[o + j] * cos[t + j] + x[o + jr] * (transpose ? sin[t + jr] : sin[t + j]);
      }
    }
  }
}

/** y [N·I] = silu(g)·u from gu [N·2I] (each row: gate, then up). */
export function swigluInto(y: Float32Array, gu: Float32Array, I: number): void {
  for (let n = 0, N = gu.length / (2 * I); n < N; n++) {
    const o = 2 * n * I;
    for (let j = 0; j < I; j++) {
      const g = gu[o + j];
      y[n * I + j] = (g / (1 + Math.exp(-g))) * gu[o + I + j];
    }
  }
}

/** dgu [N·2I] from gu and dy [N·I]: d gate = dy·u·s·(1 + g·(1 − s)), d up = dy·g·s, s = sigmoid(g). */
export function swigluGradInto(dgu: Float32Array, gu: Float32Array, dy: Float32Array, I: number): void {
  for (let n = 0, N = gu.length / (2 * I); n < N; n++) {
    const o = 2 * n * I;
    for (let j = 0; j < I; j++) {
      const g = gu[o + j],
        u = gu[o + I + j],
        d = dy[n * I + j];
      const s = 1 / (1 + Math.exp(-g));
      dgu[o + j] = d * u * s * (1 + g * (1 - s));
      dgu[o + I + j] = d * g * s;
    }
  }
}

/** wasm runs SwiGLU on the heap module's vector kernel (any size, rows split over the helper threads)
 *  where I is a multiple of 4; the JS loop covers the rest. */
const heapKernel = (backendName: string, I: number) => backendName === "wasm" && I % 4 === 0;

export const ROPE = "MarlRope",
  SWIGLU = "MarlSwiglu",
  SWIGLU_GRAD = "MarlSwigluGrad";

const register = once(() => {
  registerKernel(ROPE, (io, backendName) => ({ inputs, backend, attrs }) => {
    const { x, cos, sin } = inputs as { x: tf.TensorInfo; cos: tf.TensorInfo; sin: tf.TensorInfo };
    const out = io.output(backend, x.shape); // views after every allocation: the wasm heap may move
    const heads = x.shape[2],
      hd = x.shape[3];
    ropeInto(
      io.view(backend, out),
      io.view(backend, x),
      io.view(backend, cos),
      io.view(backend, sin),
      heads,
      hd,
      attrs!.transpose as boolean,
    );
    return out;
  });
  registerKernel(SWIGLU, (io, backendName) => ({ inputs, backend }) => {
    const { gu } = inputs as { gu: tf.TensorInfo };
    const I = gu.shape[1] / 2,
      y = io.output(backend, [gu.shape[0], I]);
    if (heapKernel(backendName, I)) heapSwiglu(backend, heapOffset(backend, gu), null, heapOffset(backend, y), gu.shape[0], I);
    else swigluInto(io.view(backend, y), io.view(backend, gu), I);
    return y;
  });
  registerKernel(SWIGLU_GRAD, (io, backendName) => ({ inputs, backend }) => {
    const { gu, dy } = inputs as { gu: tf.TensorInfo; dy: tf.TensorInfo };
    const dgu = io.output(backend, gu.shape),
      I = gu.shape[1] / 2;
    if (heapKernel(backendName, I))
      heapSwiglu(backend, heapOffset(backend, gu), heapOffset(backend, dy), heapOffset(backend, dgu), gu.shape[0], I);
    else swigluGradInto(io.view(backend, dgu), io.view(backend, gu), io.view(backend, dy), I);
    return dgu;
  });
});

const kernels = (x: tf.Tensor) => {
  register();
  return ropeKernelRuns(x.size) && x.dtype === "float32" && tf.getKernel(ROPE, tf.getBackend()) !== undefined;
};
/** webgpu's kernels (webgpu/rows.ts) run at every size: there each op of the op path is a dispatch. */
export const webgpuKernel = (x: tf.Tensor, name: string) =>
  tf.getBackend() === "webgpu" && x.dtype === "float32" && tf.getKernel(name, "webgpu") !== undefined;

/** The tfjs-op forms (every backend; the references the kernels are tested against). */
export function ropeOps(x: tf.Tensor4D, cos: tf.Tensor4D, sin: tf.Tensor4D): tf.Tensor4D {
  const [x1, x2] = tf.split(x, 2, 3);
  return tf.add(tf.mul(x, cos), tf.mul(tf.concat([x2, x1], 3), sin));
}
export function swigluOps(gu: tf.Tensor2D): tf.Tensor2D {
  const [gate, up] = tf.split(gu, 2, 1);
  return tf.mul(tf.mul(gate, tf.sigmoid(gate)), up);
}

const ropeKernel = tf.customGrad(((x: tf.Tensor4D, cos: tf.Tensor4D, sin: tf.Tensor4D, save: tf.GradSaveFunc) => {
  save([cos, sin]);
  return {
    value: tf.engine().runKernel(ROPE, { x, cos, sin }, { transpose: false }) as tf.Tensor4D,
    gradFunc: (dy: tf.Tensor4D, [c, s]: tf.Tensor[]) => [
      tf.engine().runKernel(ROPE, { x: dy, cos: c, sin: s }, { transpose: true }) as tf.Tensor,
      tf.zerosLike(c),
      tf.zerosLike(s),
    ],
  };
}) as unknown as CustomGradFn) as unknown as (x: tf.Tensor4D, cos: tf.Tensor4D, sin: tf.Tensor4D) => tf.Tensor4D;

const swigluKernel = tf.customGrad(((gu: tf.Tensor2D, save: tf.GradSaveFunc) => {
  save([gu]);
  return {
    value: tf.engine().runKernel(SWIGLU, { gu }) as tf.Tensor2D,
    gradFunc: (dy: tf.Tensor2D, [g]: tf.Tensor[]) => tf.engine().runKernel(SWIGLU_GRAD, { gu: g, dy }) as tf.Tensor,
  };
}) as unknown as CustomGradFn) as unknown as (gu: tf.Tensor2D) => tf.Tensor2D;

/** x [B, T, heads, hd] rotated by the per-row tables cos, sin [B, T, 1, hd] (rotate-half). */
export function rope(x: tf.Tensor4D, cos: tf.Tensor4D, sin: tf.Tensor4D): tf.Tensor4D {
  return kernels(x) || webgpuKernel(x, ROPE) ? ropeKernel(x, cos, sin) : ropeOps(x, cos, sin);
}

/** silu(gate)·up for gu [N, 2I] holding gate and up side by side (the fused gate_up projection). */
export function swiglu(gu: tf.Tensor2D): tf.Tensor2D {
  const b = tf.getBackend();
  return kernels(gu) ||
    (gu.dtype === "float32" && heapKernel(b, gu.shape[1] / 2) && tf.getKernel(SWIGLU, b) !== undefined) ||
    webgpuKernel(gu, SWIGLU)
    ? swigluKernel(gu)
    : swigluOps(gu);
}
