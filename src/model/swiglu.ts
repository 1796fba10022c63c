/** SwiGLU on a fused gate/up output: z [N, 2I] = [gate | up] → silu(gate)·up [N, I], as one kernel
 *  forward and one backward on the CPU backends (wasm, cpu), a JS pass over heap views. Through tfjs
 *  ops it is a split and three kernels (Sigmoid, Mul, Mul) forward and about ten backward. Other
 *  backends (webgpu) keep the op path. */
import * as tf from "@tensorflow/tfjs";
import { registerCpuKernel } from "./dequant-kernel.ts";
import type { CustomGradFn } from "./weight.ts";

const SWIGLU = "MarlSwiGlu";
const SWIGLU_GRAD = "MarlSwiGluGrad";

/** y [N·I] from z [N·2I]. */
export function swiGluInto(y: Float32Array, z: Float32Array, I: number): void {
  for (let i = 0, o = 0; o < y.length; i += 2 * I, o += I)
    for (let j = 0; j < I; j++) {
      const g = z[i + j];
      y[o + j] = (g / (1 + Math.exp(-g))) * z[i + I + j];
    }
}

/** dz [N·2I] from z and dy [N·I]: with s = σ(g), d gate = dy·up·s·(1 + g·(1 − s)), d up = dy·g·s. */
export function swiGluGradInto(dz: Float32Array, z: Float32Array, dy: Float32Array, I: number): void {
  for (let i = 0, o = 0; o < dy.length; i += 2 * I, o += I)
    for (let j = 0; j < I; j++) {
      const g = z[i + j], u = z[i + I + j], s = 1 / (1 + Math.exp(-g)), d = dy[o + j];
      dz[i + j] = d * u * s * (1 + g * (1 - s));
      dz[i + I + j] = d * g * s;
    }
}

let registered = false;
function register(): void {
  if (registered) return;
  registered = true;
  registerCpuKernel(SWIGLU, ["z"], ([z]) => [[z.shape[0], z.shape[1] / 2]], ([y], [z], a) => swiGluInto(y, z, a.I as number));
  registerCpuKernel(SWIGLU_GRAD, ["z", "dy"], ([z]) => [z.shape], ([dz], [z, dy], a) => swiGluGradInto(dz, z, dy, a.I as number));
}

/** The tfjs-op form (every backend; the reference the kernels are tested against). */
export function swiGluOps(z: tf.Tensor2D): tf.Tensor2D {
  const [gate, up] = tf.split(z, 2, 1);
  return tf.mul(tf.mul(gate, tf.sigmoid(gate)), up);
}

const fused = tf.customGrad(((z: tf.Tensor2D, save: tf.GradSaveFunc) => {
  save([z]);
  return {
    value: tf.engine().runKernel(SWIGLU, { z }, { I: z.shape[1] / 2 }) as tf.Tensor2D,
    gradFunc: (dy: tf.Tensor2D, saved: tf.Tensor[]) => tf.engine().runKernel(SWIGLU_GRAD, { z: saved[0], dy }, { I: z.shape[1] / 2 }) as tf.Tensor2D,
  };
}) as unknown as CustomGradFn) as unknown as (z: tf.Tensor2D) => tf.Tensor2D;

/** silu(gate)·up of z [N, 2I] = [gate | up] → [N, I]: one kernel each way on wasm and cpu. */
export function swiGlu(z: tf.Tensor2D): tf.Tensor2D {
  register();
  if (tf.getKernel(SWIGLU, tf.getBackend()) === undefined || z.dtype !== "float32") return swiGluOps(z);
  return fused(z);
}
