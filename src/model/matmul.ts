/** Matrix products routed to the wasm backend's fast path: a plain matMul(a[…, M, K], b[…, K, N])
 *  (wasm-gemm.ts; 2-D or batched). Transposed products fall to tfjs' kernel, 4–16× slower, and tfjs'
 *  own matMul gradient uses them. So the gradients here materialise the transpose of the smaller
 *  operand and call the plain product. Results are identical to tf.matMul up to float32 summation
 *  order. webgpu (backendProfile().matMulForm "batched") materialises transposes too. */
import * as tf from "@tensorflow/tfjs";
import { backendProfile } from "./profile.ts";

type CustomGradFn = Parameters<typeof tf.customGrad>[0];

/** a [M, K] · bᵀ where b is [N, K] → [M, N], transposing whichever side is cheaper. */
export function matMulBT(a: tf.Tensor2D, b: tf.Tensor2D): tf.Tensor2D {
  if (backendProfile().matMulForm === "batched") return tf.matMul(a, tf.transpose(b));
  if (b.size <= a.size + a.shape[0] * b.shape[0]) return tf.matMul(a, tf.transpose(b));
  return tf.transpose(tf.matMul(b, tf.transpose(a))); // (b · aᵀ)ᵀ: for a huge b (the vocab head)
}
/** aᵀ · b for a [K, M], b [K, N] → [M, N]. */
export function matMulAT(a: tf.Tensor2D, b: tf.Tensor2D): tf.Tensor2D {
  if (backendProfile().matMulForm === "batched") return tf.matMul(tf.transpose(a), b);
  return tf.matMul(tf.transpose(a), b);
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

/** a [M, K] · w [K, N] for a large persistent w, without the wasm fast path caching a packed copy of
 *  w (XNNPACK keeps one per weight tensor for as long as the tensor lives: for a 2 GB model that is
 *  another 2 GB, past the 4 GiB heap). w is sliced along K into fresh tensors, whose packed copies go
 *  away with them, and the partial products are summed. */
export function matMulUncached(a: tf.Tensor2D, w: tf.Tensor2D, chunkFloats = 8 * 1024 * 1024): tf.Tensor2D {
  const [K, N] = w.shape, M = a.shape[0];
  const rows = Math.max(1, Math.floor(chunkFloats / N));
  let acc: tf.Tensor2D | null = null;
  for (let k = 0; k < K; k += rows) {
    const n = Math.min(rows, K - k);
    // One tidy per slice: a slice of w and its packed copy are freed before the next is cut (holding
    // them all would copy w twice over).
    const part = tf.tidy(() => tf.matMul(tf.slice(a, [0, k], [M, n]), tf.slice(w, [k, 0], [n, N])) as tf.Tensor2D);
    if (!acc) acc = part;
    else {
      const sum: tf.Tensor2D = tf.add(acc, part);
      tf.dispose([acc, part]);
      acc = sum;
    }
  }
  return acc!;
}

/** x [M, K] · wᵀ for a frozen, large w held [N, K] (torch's layout): computed as (w · xᵀ)ᵀ so w is the
 *  left operand, which the wasm backend does not pack and cache. The backward pass uses
 *  matMulUncached for the same reason. */
export function mmFrozenLeft(x: tf.Tensor2D, w: tf.Tensor2D): tf.Tensor2D {
  const f = tf.customGrad(((xx: tf.Tensor2D) => ({
    value: tf.tidy(() => tf.transpose(tf.matMul(w, tf.transpose(xx)))),
    gradFunc: (dy: tf.Tensor2D) => matMulUncached(dy, w),
  })) as unknown as CustomGradFn);
  return f(x) as tf.Tensor2D;
}

/** x [M, K] · w [K, N] with w frozen (no gradient computed for it; `w` is re-fetched for the backward
 *  pass, so a dequantized weight need not stay alive). */
export function mmFrozen(x: tf.Tensor2D, w: () => tf.Tensor2D, wForward?: tf.Tensor2D): tf.Tensor2D {
  const f = tf.customGrad(((xx: tf.Tensor2D) => ({
    value: wForward ? tf.matMul(xx, wForward) : tf.tidy(() => tf.matMul(xx, w())),
    gradFunc: (dy: tf.Tensor2D) => tf.tidy(() => matMulBT(dy, w())),
  })) as unknown as CustomGradFn);
  return f(x) as tf.Tensor2D;
}

/** Batched a [G, M, K] · b [G, K, N] → [G, M, N] as one batched product, with a gradient whose
 *  transposes are materialised (no transposed matMul: slow on wasm, wrong on webgpu, see profile.ts).
 *  wasm runs the batch slice by slice on heap offsets (wasm-gemm.ts), without slicing copies. */
export function bmm(a: tf.Tensor3D, b: tf.Tensor3D): tf.Tensor3D {
  const f = tf.customGrad(((x: tf.Tensor3D, y: tf.Tensor3D, save: tf.GradSaveFunc) => {
    save([x, y]);
    return {
      value: tf.matMul(x, y),
      gradFunc: (dy: tf.Tensor3D, saved: tf.Tensor[]) => {
        const [sx, sy] = saved as tf.Tensor3D[];
        return [tf.matMul(dy, tf.transpose(sy, [0, 2, 1])), tf.matMul(tf.transpose(sx, [0, 2, 1]), dy)];
      },
    };
  }) as unknown as CustomGradFn);
  return f(a, b) as tf.Tensor3D;
}
