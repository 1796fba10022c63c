/** A whole-vocabulary draw per row of logits on the backend that holds them (rollout/sampler.ts's
 *  host path): on wasm the heap module draws the rows where they are, split over its threads
 *  (heap.ts drawRows: the arithmetic of sample-row.ts's id walk, so the same tokens and log-probs),
 *  where reading 32 × 151,936 logits and drawing on one thread took ~150 ms a decode step.
 *  The kernel (MarlDrawRows) returns int32 [B, 4]: per row two float64 (the token, then its log-prob)
 *  as 32-bit words, so the log-prob arrives exact. It is registered with the wasm
 *  kernels (backend.ts registerWasmExtras → registerWasmDraw); this file imports no backend, so the
 *  sampler can ask for it under any. */
import * as tf from "@tensorflow/tfjs";

export const DRAW_ROWS = "MarlDrawRows";

export interface DrawRowsAttrs {
  temperature: number;
  us: number[]; // one uniform in [0, 1) per row
}

/** Per row of float32 logits [B, V]: the token drawn with uniform us[b] at `temperature` over the
 *  whole vocabulary, and its log-prob; token −1 for a row without a finite largest logit. null where
 *  the current backend has no such kernel. */
export async function drawWholeRows(
  logits: tf.Tensor2D,
  temperature: number,
  us: number[],
): Promise<{ token: number; logprob: number }[] | null> {
  if (logits.dtype !== "float32" || tf.getKernel(DRAW_ROWS, tf.getBackend()) === undefined) return null;
  const attrs: DrawRowsAttrs = { temperature, us };
  const out = tf.engine().runKernel(DRAW_ROWS, { logits }, attrs as unknown as tf.NamedAttrMap) as tf.Tensor2D;
  const words = (await out.data()) as Int32Array;
  out.dispose();
  const f = new Float64Array(Int32Array.from(words).buffer); // a copy at offset 0: aligned for float64
  return us.map((_, b) => ({ token: f[2 * b], logprob: f[2 * b + 1] }));
}
