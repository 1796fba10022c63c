/** Matrix products routed to the wasm backend's fast path: a plain 2-D matMul(a[M,K], b[K,N]).
 *  Measured on tfjs 4.22 wasm, transposeA/transposeB and 3-D batched matMuls are 4–16× slower than
 *  that, and tfjs' own matMul gradient uses them. So the gradients here materialise the transpose of
 *  the smaller operand and call the plain product, and batched products loop over 2-D slices.
 *  Results are identical to tf.matMul up to float32 summation order. Backends without that penalty
 *  (backendProfile().matMulForm "batched": webgpu) keep batches whole and materialise transposes. */
import * as tf from "@tensorflow/tfjs";
import { backendProfile } from "./profile.ts";

type CustomGradFn = Parameters<typeof tf.customGrad>[0];

/** Multiply-adds per slice below which bmm uses the batched kernel. */
const SMALL_PRODUCT = 64 * 1024;
/** Rows per slice up to which bmm uses the batched kernel (a decode step's query heads per KV head). */
const FEW_ROWS = 16;

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

/** Batched a [G, M, K] · b [G, K, N] → [G, M, N] as G plain 2-D products (a loop beats the batched
 *  kernel by ~4× on wasm). One custom gradient for the whole product, so the backward pass does not
 *  pad every slice's gradient back to full size. */
export function bmm(a: tf.Tensor3D, b: tf.Tensor3D): tf.Tensor3D {
  // A decode step (a few query rows per slice, whatever the context length) and other small products:
  // the one batched kernel is as fast or faster than G slices (7 rows × 64 × 200 keys, 16 slices:
  // 2.6 vs 5.5 ms), and decoding records no gradient.
  if (backendProfile().matMulForm === "batched") return bmmBatched(a, b);
  if (a.shape[1] <= FEW_ROWS || a.shape[1] * a.shape[2] * b.shape[2] <= SMALL_PRODUCT) return tf.matMul(a, b);
  const f = tf.customGrad(((x: tf.Tensor3D, y: tf.Tensor3D, save: tf.GradSaveFunc) => {
    save([x, y]);
    return {
      value: loop(x, y, (p, q) => tf.matMul(p, q)),
      gradFunc: (dy: tf.Tensor3D, saved: tf.Tensor[]) => {
        const [sx, sy] = saved as tf.Tensor3D[];
        return [loop(dy, sy, matMulBT), loop(sx, dy, matMulAT)];
      },
    };
  }) as unknown as CustomGradFn);
  return f(a, b) as tf.Tensor3D;
}

/** bmm as one batched kernel, with a gradient whose transposes are materialised (profile.ts: webgpu). */
function bmmBatched(a: tf.Tensor3D, b: tf.Tensor3D): tf.Tensor3D {
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

/** out[i] = f(a[i], b[i]) over the leading axis, with tf.slice (not split/unstack: those call the wasm
 *  slice function directly and bypass the faster Slice kernel registered in src/backend.ts). */
function loop(a: tf.Tensor3D, b: tf.Tensor3D, f: (p: tf.Tensor2D, q: tf.Tensor2D) => tf.Tensor2D): tf.Tensor3D {
  return tf.tidy(() => {
    const G = a.shape[0];
    const outs: tf.Tensor3D[] = [];
    for (let i = 0; i < G; i++) {
      const p = tf.reshape<tf.Rank.R2>(tf.slice(a, [i, 0, 0], [1, a.shape[1], a.shape[2]]), [a.shape[1], a.shape[2]]);
      const q = tf.reshape<tf.Rank.R2>(tf.slice(b, [i, 0, 0], [1, b.shape[1], b.shape[2]]), [b.shape[1], b.shape[2]]);
      const r = f(p, q);
      outs.push(tf.reshape(r, [1, ...r.shape]));
    }
    return G === 1 ? outs[0] : (tf.concat(outs, 0) as tf.Tensor3D);
  });
}
