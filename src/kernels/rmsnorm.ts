/** RMSNorm, y = x / √(mean(x²) + eps) · w over the last axis of x [N, H], as one kernel forward and
 *  one backward on the CPU backends (wasm, cpu): a JS pass over heap views, as the dequantize kernel
 *  does. Through tfjs ops the forward is 6 kernels (Square, Mean, Add, Rsqrt, Mul, Mul) and its
 *  gradient about 15 more, each a full pass over [N, H] plus a kernel launch; a small model's decode
 *  step spent 40 of its 230 kernels here. On webgpu the kernels are WGSL programs (webgpu/rows.ts:
 *  one dispatch forward, three backward, at every size); other backends keep the op path, whose
 *  gradient tfjs derives. Sums run in float64 (JS) or in four float32 lanes (wasm's vector kernel), so results
 *  differ from the op path by float32 rounding only. */
import * as tf from "@tensorflow/tfjs";
import { type CustomGradFn, heapOffset, once, registerKernel } from "./kernels.ts";
import { heapRmsNorm, heapRmsNormGrad } from "./wasm/heap-ops.ts";

/** On wasm with H a multiple of 4 the heap module's vector kernels run at every size, rows split over
 *  the helper threads (a small training step: 9 norms of [2048, 256] each way). */
const heapKernel = (backendName: string, H: number) => backendName === "wasm" && H % 4 === 0;

export const RMS_NORM = "MarlRmsNorm";
export const RMS_NORM_GRAD = "MarlRmsNormGrad";
/** The gradient's parts apart (webgpu): dx alone is one program, and LoRA training never asks for the
 *  frozen weight's dw (two more). */
export const RMS_NORM_DX = "MarlRmsNormDx";
export const RMS_NORM_DW = "MarlRmsNormDw";

/** y [N·H] from x [N·H], w [H]. */
export function rmsNormInto(y: Float32Array, x: Float32Array, w: Float32Array, H: number, eps: number): void {
  for (let o = 0; o < x.length; o += H) {
    let ss = 0;
    for (let j = 0; j < H; j++) ss += x[o + j] * x[o + j];
    const r = 1 / Math.sqrt(ss / H + eps);
    for (let j = 0; j < H; j++) y[o + j] = x[o + j] * r * w[j];
  }
}

/** dx [N·H] and dw [H] from x, w and dy: with r = 1/√(mean(x²)+eps) and s = Σ_k dy_k·w_k·x_k per row,
 *  dx_j = r·dy_j·w_j − r³·x_j·s / H and dw_j = Σ_rows dy_j·x_j·r. */
export function rmsNormGradInto(
  dx: Float32Array,
  dw: Float32Array,
  x: Float32Array,
  w: Float32Array,
  dy: Float32Array,
  H: number,
  eps: number,
): void {
  const acc = new Float64Array(H);
  for (let o = 0; o < x.length; o += H) {
    let ss = 0,
      s = 0;
    for (let j = 0; j < H; j++) {
      ss += x[o + j] * x[o + j];
      s += dy[o + j] * w[j] * x[o + j];
    }
    const r = 1 / Math.sqrt(ss / H + eps),
      c = (r * r * r * s) / H;
    for (let j = 0; j < H; j++) {
      dx[o + j] = r * dy[o + j] * w[j] - c * x[o + j];
      acc[j] += dy[o + j] * x[o + j] * r;
    }
  }
  dw.set(acc);
}

const register = once(() => {
  registerKernel(RMS_NORM, (io, backendName) => ({ inputs, backend, attrs }) => {
    const { x, w } = inputs as { x: tf.TensorInfo; w: tf.TensorInfo };
    const y = io.output(backend, x.shape),
      H = w.shape[0],
      eps = attrs!.eps as number; // views after every allocation: the wasm heap may move
    if (heapKernel(backendName, H))
      heapRmsNorm(backend, heapOffset(backend, x), heapOffset(backend, w), heapOffset(backend, y), x.shape[0], H, eps);
    else rmsNormInto(io.view(backend, y), io.view(backend, x), io.view(backend, w), H, eps);
    return y;
  });
  registerKernel(RMS_NORM_GRAD, (io, backendName) => ({ inputs, backend, attrs }) => {
    const { x, w, dy } = inputs as { x: tf.TensorInfo; w: tf.TensorInfo; dy: tf.TensorInfo };
    const dx = io.output(backend, x.shape),
      dw = io.output(backend, w.shape),
      H = w.shape[0],
      eps = attrs!.eps as number;
    if (heapKernel(backendName, H)) {
      const g = heapRmsNormGrad(
        backend,
        heapOffset(backend, x),
        heapOffset(backend, w),
        heapOffset(backend, dy),
        heapOffset(backend, dx),
        x.shape[0],
        H,
        eps,
      );
      io.view(backend, dw).set(g);
    } else
      rmsNormGradInto(io.view(backend, dx), io.view(backend, dw), io.view(backend, x), io.view(backend, w), io.view(backend, dy), H, eps);
    return [dx, dw];
  });
});

/** The tfjs-op form (every backend; the reference the kernels are tested against). */
export function rmsNormOps(x: tf.Tensor2D, w: tf.Tensor1D, eps: number): tf.Tensor2D {
  const v = tf.mean(tf.square(x), -1, true);
  return tf.mul(tf.mul(x, tf.rsqrt(tf.add(v, eps))), w);
}

/** The one-kernel form for one eps (customGrad takes tensors only, so eps is closed over): one
 *  gradient kernel for both inputs. */
const fusedByEps = new Map<number, (x: tf.Tensor2D, w: tf.Tensor1D) => tf.Tensor2D>();
function fused(eps: number): (x: tf.Tensor2D, w: tf.Tensor1D) => tf.Tensor2D {
  let f = fusedByEps.get(eps);
  if (f) return f;
  const attrs = { eps };
  f = tf.customGrad(((x: tf.Tensor2D, w: tf.Tensor1D, save: tf.GradSaveFunc) => {
    save([x, w]);
    return {
      value: tf.engine().runKernel(RMS_NORM, { x, w }, attrs) as tf.Tensor2D,
      gradFunc: (dy: tf.Tensor2D, saved: tf.Tensor[]) =>
        tf.engine().runKernel(RMS_NORM_GRAD, { x: saved[0], w: saved[1], dy }, attrs) as tf.Tensor[],
    };
  }) as unknown as CustomGradFn) as unknown as (x: tf.Tensor2D, w: tf.Tensor1D) => tf.Tensor2D;
  fusedByEps.set(eps, f);
  return f;
}

/** Where the backend has the gradient's parts as kernels of their own (webgpu), the kernel's
 *  gradient computes each input's part only when the tape asks for it: LoRA training never asks for
 *  the frozen weight's (its input is not reached from the trained variables), so dx is one dispatch
 *  instead of the joint gradient's three. */
const registerPartsGradient = once(() =>
  tf.registerGradient({
    kernelName: RMS_NORM,
    inputsToSave: ["x", "w"],
    gradFunc: (dy, saved, attrs) => {
      const [x, w] = saved;
      const part = (name: string) => () => tf.engine().runKernel(name, { x, w, dy: dy as tf.Tensor }, attrs) as tf.Tensor;
      return { x: part(RMS_NORM_DX), w: part(RMS_NORM_DW) };
    },
  }),
);

/** Rows up to which the JS kernels run: measured on wasm (1 thread), they beat the six op kernels
 *  up to ~512 rows of 256 (0.34 vs 0.74 ms at 64 rows) but lose at 2048 (13.8 vs 4.4 ms), where the
 *  kernels' SIMD passes outweigh the launches. */
const MAX_KERNEL_ROWS = 256;

/** RMSNorm of x [N, H] with weight w [H]: one kernel each way on wasm (the heap module's, any size,
 *  where H is a multiple of 4) and on cpu for up to MAX_KERNEL_ROWS rows (decode steps, small
 *  batches), tfjs ops otherwise and on other backends. */
export function rmsNorm(x: tf.Tensor2D, w: tf.Tensor1D, eps: number): tf.Tensor2D {
  register();
  const b = tf.getBackend();
  if (
    (x.shape[0] > MAX_KERNEL_ROWS && !heapKernel(b, x.shape[1]) && b !== "webgpu") ||
    tf.getKernel(RMS_NORM, b) === undefined ||
    x.dtype !== "float32"
  )
    return rmsNormOps(x, w, eps);
  if (tf.getKernel(RMS_NORM_DX, b) === undefined) return fused(eps)(x, w);
  registerPartsGradient();
  return tf.engine().runKernel(RMS_NORM, { x, w }, { eps }) as tf.Tensor2D;
}
