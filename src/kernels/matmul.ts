/** Matrix products with a transposed operand, formed the way the backend runs them best
 *  (backendProfile().matMulForm): on wasm, cpu and tensorflow as one matMul with transposeA/B (the
 *  wasm kernel, gemm.ts, reads a transposed A in place and packs a transposed B, so no transpose
 *  is materialised); on webgpu with the flags too, except for one-batch products over K ≥ 2000, where
 *  the transpose is materialised (see flagsFor). Also the products with a frozen
 *  weight, whose gradients go to the input only. */
import * as tf from "@tensorflow/tfjs";
import { backendProfile } from "./profile.ts";

type CustomGradFn = Parameters<typeof tf.customGrad>[0];

const flags = () => backendProfile().matMulForm === "flags";
/** Whether a product of one batch over K may use the transpose flags: always on "flags" backends;
 *  on webgpu ("batched") below K 2000, where tfjs never picks its split-K program (one batch,
 *  K ≥ 2000, few output tiles), whose transposed operand sums wrong. Each transpose avoided is a
 *  dispatch and a pass over the operand (a small training step materialised 129). */
const flagsFor = (K: number) => flags() || K < SPLIT_K_MIN;
const SPLIT_K_MIN = 2000;

/** a [M, K] · bᵀ where b is [N, K] → [M, N]. */
export function matMulBT(a: tf.Tensor2D, b: tf.Tensor2D): tf.Tensor2D {
  return flagsFor(a.shape[1]) ? tf.matMul(a, b, false, true) : tf.matMul(a, tf.transpose(b));
}
/** aᵀ · b for a [K, M], b [K, N] → [M, N]. */
export function matMulAT(a: tf.Tensor2D, b: tf.Tensor2D): tf.Tensor2D {
  return flagsFor(a.shape[0]) ? tf.matMul(a, b, true, false) : tf.matMul(tf.transpose(a), b);
}
/** The wasm kernel of matMulXWT's (w · xᵀ)ᵀ: the product over w's rows in place, its output stored
 *  transposed as it is summed (gemm.ts), so no transpose follows. No gradient of its own (callers wrap
 *  it in theirs). */
export const XWT = "MarlMatMulXWT";
/** Rows of x up to which matMulXWT runs (w · xᵀ)ᵀ (wasm, 2 threads, GFLOP/s, x · wᵀ packing w against
 *  the transposed store: [64, 896] · [151936, 896]ᵀ 42.6 vs 48.0; 128 rows 53.9 vs 43.4). */
const XWT_ROWS = 64;

/** x [M, K] · wᵀ for a large w held [N, K] (torch's layout). With many rows, one transposed product
 *  (the kernel packs w's panels once for all M rows); with few (decoding), (w · xᵀ)ᵀ, so only the small
 *  x is repacked and the product runs over w's rows in place (on wasm stored transposed as it goes). */
export function matMulXWT(x: tf.Tensor2D, w: tf.Tensor2D): tf.Tensor2D {
  if (!flags()) return flagsFor(x.shape[1]) ? tf.matMul(x, w, false, true) : tf.transpose(tf.matMul(w, tf.transpose(x)));
  if (x.shape[0] <= XWT_ROWS && x.dtype === "float32" && w.dtype === "float32" && tf.getKernel(XWT, tf.getBackend()))
    return tf.engine().runKernel(XWT, { x, w }) as tf.Tensor2D;
  return x.shape[0] >= 64 ? tf.matMul(x, w, false, true) : tf.transpose(tf.matMul(w, x, false, true));
}

/** a [M, K] · b [K, N], differentiable in both. */
export const mm = tf.customGrad(((a: tf.Tensor2D, b: tf.Tensor2D, save: tf.GradSaveFunc) => {
  save([a, b]);
  return {
    value: tf.matMul(a, b),
    gradFunc: (dy: tf.Tensor2D, saved: tf.Tensor[]) => {
      const [sa, sb] = saved as tf.Tensor2D[];
      return [matMulBT(dy, sb), matMulAT(sa, dy)];
    },
  };
}) as unknown as CustomGradFn) as (a: tf.Tensor2D, b: tf.Tensor2D) => tf.Tensor2D;

/** a [M, K] · b [K, N] + c [M, N], differentiable in all three: c is the product's epilogue where
 *  the backend's profile says so (fusedAddend), an add after it elsewhere (c + a·b, the order the
 *  model's LoRA terms always had). */
export function mmAdd(a: tf.Tensor2D, b: tf.Tensor2D, c: tf.Tensor2D): tf.Tensor2D {
  if (!backendProfile().fusedAddend) return tf.add(c, mm(a, b));
  const f = tf.customGrad(((aa: tf.Tensor2D, bb: tf.Tensor2D, cc: tf.Tensor2D, save: tf.GradSaveFunc) => {
    save([aa, bb]);
    return {
      value: tf.fused.matMul({ a: aa, b: bb, bias: cc }),
      gradFunc: (dy: tf.Tensor2D, saved: tf.Tensor[]) => {
        const [sa, sb] = saved as tf.Tensor2D[];
        return [matMulBT(dy, sb), matMulAT(sa, dy), tf.clone(dy)];
      },
    };
  }) as unknown as CustomGradFn);
  return f(a, b, c) as tf.Tensor2D;
}

/** x [M, K] · wᵀ for a frozen, large w held [N, K] (torch's layout, kept so a 2 GB f32 model is not
 *  transposed at load). Its gradient, dy · w, is a plain product. */
export function mmFrozenLeft(x: tf.Tensor2D, w: tf.Tensor2D): tf.Tensor2D {
  const f = tf.customGrad(((xx: tf.Tensor2D) => ({
    value: matMulXWT(xx, w),
    gradFunc: (dy: tf.Tensor2D) => tf.matMul(dy, w),
  })) as unknown as CustomGradFn);
  return f(x) as tf.Tensor2D;
}

/** The two halves of a product with a frozen w [K, N], for ops that wrap them in a gradient of their
 *  own (mmFrozen, lora-linear.ts): x·w plus the bias and an addend, and dy·wᵀ plus an addend, each
 *  addend the product's epilogue (callers use it where the profile has fusedAddend). `w` is
 *  re-fetched for the backward pass, so a dequantized weight need not stay alive. */
export interface FrozenProduct {
  forward(x: tf.Tensor2D, addend?: tf.Tensor2D): tf.Tensor2D;
  inputGrad(dy: tf.Tensor2D, addend?: tf.Tensor2D): tf.Tensor2D;
}

export function frozenProduct(w: () => tf.Tensor2D, wForward?: tf.Tensor2D, bias?: tf.Tensor1D): FrozenProduct {
  const product = (xx: tf.Tensor2D, ww: tf.Tensor2D, add?: tf.Tensor2D) => {
    const epilogue = add && bias ? tf.add(add, bias) : (add ?? bias);
    return epilogue ? (tf.fused.matMul({ a: xx, b: ww, bias: epilogue }) as tf.Tensor2D) : (tf.matMul(xx, ww) as tf.Tensor2D);
  };
  return {
    forward: (xx, add) => (wForward ? product(xx, wForward, add) : tf.tidy(() => product(xx, w(), add))),
    inputGrad: (dy, add) =>
      tf.tidy(() => {
        if (!add) return matMulBT(dy, w());
        const t = flagsFor(dy.shape[1]);
        return tf.fused.matMul({ a: dy, b: t ? w() : tf.transpose(w()), transposeB: t, bias: add }) as tf.Tensor2D;
      }),
  };
}

/** x [M, K] · w [K, N] with w frozen (no gradient computed for it; `w` is re-fetched for the backward
 *  pass, so a dequantized weight need not stay alive). Plus, where given, a frozen bias [N] and an
 *  addend [M, N] that is differentiated (a residual): with the profile's fusedAddend both are the
 *  product's epilogue, elsewhere adds after it (product + bias, addend + product). */
export function mmFrozen(
  x: tf.Tensor2D,
  w: () => tf.Tensor2D,
  wForward?: tf.Tensor2D,
  extra: { bias?: tf.Tensor1D; addend?: tf.Tensor2D } = {},
): tf.Tensor2D {
  const { bias, addend } = extra;
  if (!backendProfile().fusedAddend && (bias || addend)) {
    const y = mmFrozen(x, w, wForward);
    const b: tf.Tensor2D = bias ? tf.add(y, bias) : y;
    return addend ? tf.add(addend, b) : b;
  }
  const p = frozenProduct(w, wForward, bias);
  if (addend) {
    const f = tf.customGrad(((xx: tf.Tensor2D, aa: tf.Tensor2D) => ({
      value: p.forward(xx, aa),
      gradFunc: (dy: tf.Tensor2D) => [p.inputGrad(dy), tf.clone(dy)],
    })) as unknown as CustomGradFn);
    return f(x, addend) as tf.Tensor2D;
  }
  const f = tf.customGrad(((xx: tf.Tensor2D) => ({
    value: p.forward(xx),
    gradFunc: (dy: tf.Tensor2D) => p.inputGrad(dy),
  })) as unknown as CustomGradFn);
  return f(x) as tf.Tensor2D;
}

/** Batched a [G, M, K] · b [G, K, N] → [G, M, N] as one batched product, with a gradient formed as
 *  matMulBT/AT form theirs. wasm shares the batch's slices out over its threads (gemm.ts). */
export function bmm(a: tf.Tensor3D, b: tf.Tensor3D): tf.Tensor3D {
  const f = tf.customGrad(((x: tf.Tensor3D, y: tf.Tensor3D, save: tf.GradSaveFunc) => {
    save([x, y]);
    return {
      value: tf.matMul(x, y),
      gradFunc: (dy: tf.Tensor3D, saved: tf.Tensor[]) => {
        const [sx, sy] = saved as tf.Tensor3D[];
        // batched (more than one batch) products never take tfjs' split-K program: flags everywhere
        if (flags() || sx.shape[0] > 1) return [tf.matMul(dy, sy, false, true), tf.matMul(sx, dy, true, false)];
        return [tf.matMul(dy, tf.transpose(sy, [0, 2, 1])), tf.matMul(tf.transpose(sx, [0, 2, 1]), dy)];
      },
    };
  }) as unknown as CustomGradFn);
  return f(a, b) as tf.Tensor3D;
}
