/** The head's log-probs of given targets, h [n, hidden] → [n, 2] (log p(target), entropy), in chunks
 *  of rows whose logits are never all held at once: each chunk's custom gradient recomputes its
 *  logits in the backward pass, so a training tape keeps no [n, vocab] tensor. One chunk function per
 *  way the head's weight is held (weight.ts): [hidden, vocab] (trainable or frozen), [vocab, hidden]
 *  (large frozen f32 models) or column blocks (larger than a storage binding).
 *  Leaves out: the logits themselves (forward() computes those whole). */
import * as tf from "@tensorflow/tfjs";
import type { CustomGradFn } from "../engine/kernels.ts";
import { dLogits, logpEntropy } from "../engine/logprob.ts";
import { matMulAT, matMulBT, matMulXWT } from "../engine/matmul.ts";
import { backendProfile } from "../engine/profile.ts";
import type { BaseWeight } from "./weight.ts";

/** h [n, H] and one target per row → [n, 2]: log p(target) and the entropy of each row; V is the vocabulary size (the head's output width). */
export function headLogprobs(head: BaseWeight, h: tf.Tensor2D, targets: number[], V: number): tf.Tensor2D {
  const H = h.shape[1];
  // Rows of logits materialised at once (wasm: 10M floats, 40 MB per chunk; the forward and
  // backward of a chunk hold ~7 such tensors: ~280 MB, 64 rows of the 0.5B vocab: its head product
  // ran at 34 GFLOP/s on 2 threads with the 24 rows of a 4M chunk, 64 with 64 rows, which repay
  // packing the [896, 151936] weight panel by panel).
  // (a multiple of 8 rows where it can be: the wasm kernel's row and column blocks are whole then)
  const fit = Math.max(1, Math.floor(backendProfile().logitChunkFloats / V)),
    rows = fit >= 8 ? fit - (fit % 8) : fit;
  const left = head.left;
  const w = left || head.parts ? null : head.value();
  const outs: tf.Tensor2D[] = [];
  for (let s = 0; s < targets.length; s += rows) {
    const n = Math.min(rows, targets.length - s);
    const hc = tf.slice(h, [s, 0], [n, H]),
      tc = targets.slice(s, s + n);
    outs.push(
      left
        ? logprobChunkLeft(hc, left, tc)
        : head.parts
          ? logprobChunkBlocks(hc, head, tc)
          : logprobChunk(hc, w!, () => head.value(), tc, head.isVariable),
    );
  }
  return outs.length === 1 ? outs[0] : (tf.concat(outs, 0) as tf.Tensor2D);
}

/** logprobChunk for a frozen head held [vocab, hidden] (large f32 models, see weight.ts): the logits
 *  are h · wᵀ and the input gradient dLogits · w. */
function logprobChunkLeft(h: tf.Tensor2D, wLeft: tf.Tensor2D, targets: number[]): tf.Tensor2D {
  const logitsOf = (hh: tf.Tensor2D) => matMulXWT(hh, wLeft); // [n, V]
  const f = tf.customGrad(((hh: tf.Tensor2D, save: tf.GradSaveFunc) => {
    save([hh]);
    return {
      value: tf.tidy(() => logpEntropy(logitsOf(hh), targets)),
      gradFunc: (dy: tf.Tensor2D, saved: tf.Tensor[]) =>
        tf.tidy(() => tf.matMul(dLogits(logitsOf(saved[0] as tf.Tensor2D), targets, dy), wLeft)),
    };
  }) as unknown as CustomGradFn);
  return f(h) as tf.Tensor2D;
}

/** logprobChunk for a frozen head held in column blocks (weight.ts): logits and the backward product
 *  go block by block, so no kernel binds the whole head. */
function logprobChunkBlocks(h: tf.Tensor2D, head: BaseWeight, targets: number[]): tf.Tensor2D {
  const f = tf.customGrad(((hh: tf.Tensor2D, save: tf.GradSaveFunc) => {
    save([hh]);
    return {
      value: tf.tidy(() => logpEntropy(head.matmul(hh), targets)),
      gradFunc: (dy: tf.Tensor2D, saved: tf.Tensor[]) =>
        tf.tidy(() => head.backward(dLogits(head.matmul(saved[0] as tf.Tensor2D), targets, dy))),
    };
  }) as unknown as CustomGradFn);
  return f(h) as tf.Tensor2D;
}

/** log p(target) and the entropy for a chunk of rows: h [n, H], w [H, V] → [n, 2]. The custom gradient
 *  recomputes the logits in the backward pass, so the tape never holds a [n, V] chunk; w gets a
 *  gradient only when it is trainable (full mode). A frozen w is fetched again by `weightAgain` in the
 *  backward pass (a dequantized head is gone by then). Entropy carries no gradient. */
function logprobChunk(h: tf.Tensor2D, w: tf.Tensor2D, weightAgain: () => tf.Tensor2D, targets: number[], wTrainable: boolean): tf.Tensor2D {
  const fwd = (hh: tf.Tensor2D, ww: tf.Tensor2D) => tf.tidy(() => logpEntropy(tf.matMul(hh, ww), targets));
  const dLogitsFor = (hh: tf.Tensor2D, ww: tf.Tensor2D, dy: tf.Tensor2D) => dLogits(tf.matMul(hh, ww), targets, dy);
  if (wTrainable) {
    const f = tf.customGrad(((hh: tf.Tensor2D, ww: tf.Tensor2D, save: tf.GradSaveFunc) => {
      save([hh, ww]);
      return {
        value: fwd(hh, ww),
        gradFunc: (dy: tf.Tensor2D, saved: tf.Tensor[]) =>
          tf.tidy(() => {
            const [hs, ws] = saved as tf.Tensor2D[];
            const g = dLogitsFor(hs, ws, dy);
            return [matMulBT(g, ws), matMulAT(hs, g)];
          }),
      };
    }) as unknown as CustomGradFn);
    return f(h, w) as tf.Tensor2D;
  }
  const f = tf.customGrad(((hh: tf.Tensor2D, save: tf.GradSaveFunc) => {
    save([hh]);
    return {
      value: fwd(hh, w),
      gradFunc: (dy: tf.Tensor2D, saved: tf.Tensor[]) =>
        tf.tidy(() => {
          const wb = weightAgain();
          return matMulBT(dLogitsFor(saved[0] as tf.Tensor2D, wb, dy), wb);
        }),
    };
  }) as unknown as CustomGradFn);
  return f(h) as tf.Tensor2D;
}
