/** The head's log-probs of given targets, h [n, hidden] → [n, 2] (log p(target), entropy), in chunks
 *  of rows whose logits are never all held at once. One way per way the head's weight is held
 *  (weight.ts): [hidden, vocab] (trainable or frozen), [vocab, hidden] (large frozen f32 models) or
 *  column blocks (larger than a storage binding).
 *  - A frozen head recorded on a gradient tape: each chunk's forward also forms the input gradient of
 *    its log-probs per unit of dy, g = (onehot(target) − softmax(logits)) · wᵀ [rows, hidden], while
 *    its logits are at hand; the tape keeps g, and the backward pass is dy[:, 0] · g, a row scaling.
 *    Two vocabulary products per chunk instead of three (forward, the logits again in the backward
 *    pass, the backward product): the head is ~a quarter of a 0.5B token's forward.
 *  - A trainable head (full mode) recomputes its chunk's logits in the backward pass: its weight
 *    gradient needs them whole, scaled by dy, and the tape keeps no [rows, vocab] tensor.
 *  Entropy carries no gradient (logprob.ts dLogits).
 *  Leaves out: the logits themselves (forward() computes those whole). */
import * as tf from "@tensorflow/tfjs";
import { isRecording } from "../kernels/checkpoint.ts";
import type { CustomGradFn } from "../kernels/kernels.ts";
import { dLogits, logpEntropy } from "../kernels/logprob.ts";
import { matMulAT, matMulBT, matMulXWT } from "../kernels/matmul.ts";
import { backendProfile } from "../kernels/profile.ts";
import { gatherRows } from "../kernels/gather-rows.ts";
import type { BaseWeight } from "./weight.ts";
import { checkBatch } from "./attention.ts";
import type { ForwardOptions, Qwen2Config } from "./types.ts";

/** h [n, H] and one target per row → [n, 2]: log p(target) and the entropy of each row; V is the
 *  vocabulary size (the head's output width). chunkRows: rows per chunk (default: as many as the
 *  backend profile's logitChunkFloats allow). */
export function headLogprobs(head: BaseWeight, h: tf.Tensor2D, targets: number[], V: number, chunkRows?: number): tf.Tensor2D {
  const H = h.shape[1];
  // Rows of logits materialised at once (wasm: 20M floats, 80 MB per chunk, 136 rows of the 0.5B
  // vocab; a frozen head's chunk holds two such tensors, the logits and their gradient, a trainable
  // one's forward and backward ~7). The 0.5B head's two products per row on 2 threads, GFLOP/s: 24
  // rows ~34, 64 rows 48.6–49.1, 128 rows 52.6–55.9, 256 rows 55.4–59.2, 512 rows 57.8.
  // (a multiple of 8 rows where it can be: the wasm kernel's row and column blocks are whole then)
  const fit = Math.max(1, Math.floor(backendProfile().logitChunkFloats / V)),
    rows = chunkRows ?? (fit >= 8 ? fit - (fit % 8) : fit);
  const recording = isRecording();
  const left = head.left;
  const w = left || head.parts ? null : head.value();
  // A frozen head as two functions of a chunk: its logits, and the input gradient of given logit gradients.
  const frozen: { logits: (hh: tf.Tensor2D) => tf.Tensor2D; back: (dl: tf.Tensor2D) => tf.Tensor2D } | null = head.isVariable
    ? null
    : left
      ? { logits: (hh) => matMulXWT(hh, left), back: (dl) => head.backward(dl) }
      : head.parts
        ? { logits: (hh) => head.matmul(hh), back: (dl) => head.backward(dl) }
        : { logits: (hh) => tf.matMul(hh, w!), back: (dl) => matMulBT(dl, w!) };
  const outs: tf.Tensor2D[] = [];
  for (let s = 0; s < targets.length; s += rows) {
    const n = Math.min(rows, targets.length - s);
    const hc = n === h.shape[0] ? h : tf.slice(h, [s, 0], [n, H]),
      tc = targets.slice(s, s + n);
    if (!frozen) outs.push(trainableChunk(hc, w!, tc));
    else if (!recording) outs.push(tf.tidy(() => logpEntropy(frozen.logits(hc), tc)));
    else outs.push(frozenChunk(hc, tc, frozen.logits, frozen.back));
  }
  return outs.length === 1 ? outs[0] : (tf.concat(outs, 0) as tf.Tensor2D);
}

/** A chunk of a frozen head on a gradient tape (see the file header): the tape keeps g [n, H], the
 *  input gradient per unit of dy[:, 0], formed in the forward pass from the chunk's logits. */
function frozenChunk(
  h: tf.Tensor2D,
  targets: number[],
  logitsOf: (hh: tf.Tensor2D) => tf.Tensor2D,
  back: (dl: tf.Tensor2D) => tf.Tensor2D,
): tf.Tensor2D {
  const n = h.shape[0];
  const f = tf.customGrad(((hh: tf.Tensor2D, save: tf.GradSaveFunc) => {
    const [value, g] = tf.tidy(() => {
      const logits = logitsOf(hh);
      return [logpEntropy(logits, targets), back(dLogits(logits, targets, tf.ones([n, 2])))];
    });
    save([g]); // kept as a clone
    g.dispose();
    return {
      value,
      gradFunc: (dy: tf.Tensor2D, saved: tf.Tensor[]) => tf.mul(saved[0], tf.slice(dy, [0, 0], [n, 1])),
    };
  }) as unknown as CustomGradFn);
  return f(h) as tf.Tensor2D;
}

/** A chunk of a trainable head w [H, V] (full mode): the custom gradient recomputes the logits in the
 *  backward pass, so the tape never holds a [n, V] chunk; w gets its gradient. Entropy carries none. */
function trainableChunk(h: tf.Tensor2D, w: tf.Tensor2D, targets: number[]): tf.Tensor2D {
  const f = tf.customGrad(((hh: tf.Tensor2D, ww: tf.Tensor2D, save: tf.GradSaveFunc) => {
    save([hh, ww]);
    return {
      value: tf.tidy(() => logpEntropy(tf.matMul(hh, ww), targets)),
      gradFunc: (dy: tf.Tensor2D, saved: tf.Tensor[]) =>
        tf.tidy(() => {
          const [hs, ws] = saved as tf.Tensor2D[];
          const g = dLogits(tf.matMul(hs, ws), targets, dy);
          return [matMulBT(g, ws), matMulAT(hs, g)];
        }),
    };
  }) as unknown as CustomGradFn);
  return f(h, w) as tf.Tensor2D;
}

/** What tokenLogprobs reads of a model (Qwen2ForCausalLM). */
export interface LogprobModel {
  readonly config: Qwen2Config;
  readonly head: BaseWeight;
  sharedPrefix(ids: number[][], mask: number[][], opts: ForwardOptions): number;
  /** The decoder stack's final-normed hidden rows [B·T, H] (with a shared prefix of P tokens: the
   *  prefix's rows, then each row's rest). Inside tf.tidy. */
  run(ids: number[][], mask: number[][], opts: ForwardOptions, cache: null, prefix: number): { hidden: tf.Tensor2D };
}

/** CausalLM.tokenLogprobs for a Qwen2 model: only each row's span of the log-prob mask reaches the
 *  vocabulary head (headLogprobs), the rest of the row is 0. */
export function tokenLogprobs(
  m: LogprobModel,
  inputIds: number[][],
  attentionMask: number[][],
  opts: ForwardOptions & { withEntropy?: boolean; logprobMask?: number[][] } = {},
): { logprobs: tf.Tensor2D; entropy?: tf.Tensor2D } {
  const mask = checkBatch(m.config.vocabSize, inputIds, attentionMask);
  const B = inputIds.length,
    T = inputIds[0].length,
    H = m.config.hiddenSize;
  const spans = logprobSpans(opts.logprobMask, B, T);
  const res: { lp: tf.Tensor2D; ent?: tf.Tensor2D } = tf.tidy(() => {
    if (spans.every(([lo, hi]) => hi <= lo)) return { lp: tf.zeros([B, T]) as tf.Tensor2D, ent: tf.zeros([B, T]) as tf.Tensor2D };
    const P = m.sharedPrefix(inputIds, mask, opts);
    const { hidden } = m.run(inputIds, mask, opts, null, P); // [B·T, H], or [P + B·(T − P), H]
    // Only each row's span [lo, hi) reaches the head, position t's log-prob from hidden row t − 1 (the
    // vocabulary product is ~a quarter of a 0.5B token's forward, and a GRPO rollout's prompt needs
    // none); the rest of the row is 0. Positions [lo − 1, hi − 1) of row b, in runs of hidden's rows.
    const runsOf = (b: number, t0: number, t1: number): [number, number][] =>
      P === 0
        ? [[b * T + t0, t1 - t0]]
        : ([
            [t0, Math.min(t1, P) - t0], // in the shared prefix
            [P + b * (T - P) + Math.max(t0, P) - P, t1 - Math.max(t0, P)], // in the row's own part
          ] as [number, number][]);
    const targets = spans.flatMap(([lo, hi], b) => inputIds[b].slice(lo, hi));
    if (backendProfile().dispatchBound) {
      // The spans' hidden rows by one gather, and the head's rows back to [B, T] by another from
      // them and a zero row (outside a span, or where logprobMask is 0): a few dispatches whatever
      // the rows, where a slice and a pad per row are ~10 each.
      const rows = spans.flatMap(([lo, hi], b) =>
        hi > lo ? runsOf(b, lo - 1, hi - 1).flatMap(([r, n]) => Array.from({ length: Math.max(0, n) }, (_, i) => r + i)) : [],
      );
      const both = headLogprobs(m.head, gatherRows(hidden, Int32Array.from(rows)), targets, m.config.vocabSize);
      let k = 0;
      const at = new Int32Array(B * T).fill(-1); // −1: a zero
      spans.forEach(([lo, hi], b) => {
        for (let t = lo; t < hi; t++, k++) if (!opts.logprobMask || opts.logprobMask[b][t]) at[b * T + t] = k;
      });
      // a column of both [n, 2] is every other row of it as [2n, 1]
      const flat = tf.reshape(both, [2 * targets.length, 1]) as tf.Tensor2D;
      const column = (col: number) =>
        tf.reshape(
          gatherRows(
            flat,
            at.map((i) => (i < 0 ? -1 : 2 * i + col)),
          ),
          [B, T],
        ) as tf.Tensor2D;
      return { lp: column(0), ent: opts.withEntropy ? column(1) : undefined };
    }
    const pieces = spans.flatMap(([lo, hi], b) =>
      hi > lo ? runsOf(b, lo - 1, hi - 1).flatMap(([r, n]) => (n > 0 ? [tf.slice(hidden, [r, 0], [n, H])] : [])) : [],
    );
    const rows = pieces.length === 1 ? pieces[0] : (tf.concat(pieces, 0) as tf.Tensor2D);
    const both = headLogprobs(m.head, rows, targets, m.config.vocabSize); // [Σ spans, 2]
    const keep = opts.logprobMask ? tf.tensor2d(opts.logprobMask.flat(), [B, T], "float32") : null;
    const rowsOf = (col: number) => {
      let k = 0;
      const rows = spans.map(([lo, hi]) => {
        const n = Math.max(0, hi - lo);
        const r = n > 0 ? tf.pad(tf.reshape(tf.slice(both, [k, col], [n, 1]), [n]), [[lo, T - hi]]) : tf.zeros([T]);
        k += n;
        return r;
      });
      const all = tf.stack(rows) as tf.Tensor2D; // [B, T]
      return keep ? (tf.mul(all, keep) as tf.Tensor2D) : all; // 0 where logprobMask is 0
    };
    return { lp: rowsOf(0), ent: rowsOf(1) };
  });
  if (opts.withEntropy) return { logprobs: res.lp, entropy: res.ent };
  res.ent?.dispose();
  return { logprobs: res.lp };
}

/** Each row's span [lo, hi) of positions whose log-prob is asked for: from its first to its last 1
 *  of the mask (position 0 has none), [1, T) without a mask. */
export function logprobSpans(mask: number[][] | undefined, B: number, T: number): [number, number][] {
  if (!mask) return Array.from({ length: B }, () => [1, T]);
  if (mask.length !== B || mask.some((r) => r.length !== T))
    throw new Error(`logprobMask is [${mask.length}][${mask[0]?.length}]; expected [${B}][${T}] like the ids`);
  return mask.map((r) => {
    let lo = 1,
      hi = T;
    while (lo < T && r[lo] === 0) lo++;
    while (hi > lo && r[hi - 1] === 0) hi--;
    return [lo, hi];
  });
}
