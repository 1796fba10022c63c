/** A whole-vocabulary draw per row of logits on the backend that holds them (rollout/sampler.ts):
 *  the inverse-CDF draw of sample-row.ts's id walk, where the logits lie.
 *  - wasm: the heap module draws the rows split over its threads (heap.ts drawRows: the id walk's
 *    float64 arithmetic, so the same tokens and log-probs as the host), where reading 32 × 151,936
 *    logits and drawing on one thread took ~150 ms a decode step. The kernel (MarlDrawRows) returns
 *    int32 [B, 4]: per row two float64 (the token, then its log-prob) as 32-bit words, so the
 *    log-prob arrives exact. Registered by backend.ts registerWasmExtras → registerWasmDraw.
 *  - webgpu: one workgroup per row (webgpu/vocab.ts drawProgram), float32 weights with the running
 *    sums in double-float32, so the host walk's tokens but for a draw within float32 rounding of a
 *    boundary; float32 [B, 2] (token, log-prob to ~1e-6): B·2 floats read a step, where the top-64
 *    candidates read B·130 and a flat row (random weights) its whole row.
 *  Greedy (temperature 0) is the argmax on both, lowest id among equal largest logits, log-prob 0.
 *  This file imports no backend, so the sampler can ask for it under any. */
import * as tf from "@tensorflow/tfjs";

export const DRAW_ROWS = "MarlDrawRows";

export interface DrawRowsAttrs {
  temperature: number;
  us: number[]; // one uniform in [0, 1) per row
}

/** A kernel's view of its call: the logits, their shape and the attributes, the uniforms checked
 *  against the rows (each backend's kernel starts here). */
export function drawCall(
  inputs: tf.NamedTensorInfoMap,
  attrs: tf.NamedAttrMap | undefined,
): DrawRowsAttrs & { logits: tf.TensorInfo; B: number; V: number } {
  const { logits } = inputs as { logits: tf.TensorInfo };
  const { temperature, us } = attrs as unknown as DrawRowsAttrs;
  const [B, V] = logits.shape;
  if (us.length !== B) throw new Error(`draw: ${us.length} uniforms for ${B} rows of logits`);
  return { logits, temperature, us, B, V };
}

/** Per row of float32 logits [B, V]: the token drawn with uniform us[b] at `temperature` over the
 *  whole vocabulary, and its log-prob (temperature 0: the argmax, lowest id on ties, log-prob 0,
 *  the uniforms unused); token −1 for a row without a finite largest logit; and the
 *  floats read back from a device (none from the wasm heap). null where the current backend has no
 *  such kernel. */
export async function drawWholeRows(
  logits: tf.Tensor2D,
  temperature: number,
  us: number[],
): Promise<{ draws: { token: number; logprob: number }[]; readFloats: number } | null> {
  if (logits.dtype !== "float32" || tf.getKernel(DRAW_ROWS, tf.getBackend()) === undefined) return null;
  const attrs: DrawRowsAttrs = { temperature, us };
  const out = tf.engine().runKernel(DRAW_ROWS, { logits }, attrs as unknown as tf.NamedAttrMap) as tf.Tensor2D;
  const data = await out.data();
  out.dispose();
  // float32 [B, 2] from a device (a transfer); int32 [B, 4] of float64 words from the heap (a copy)
  const [f, readFloats] =
    // int bits: a copy at offset 0, aligned for float64
    data instanceof Float32Array ? [data, data.length] : [new Float64Array(Int32Array.from(data as Int32Array).buffer), 0];
  return { draws: us.map((_, b) => ({ token: f[2 * b], logprob: f[2 * b + 1] })), readFloats };
}
