/** One supervised fine-tuning update: masked next-token cross-entropy, gradient accumulation over
 *  micro-batches, global-norm clipping, AdamW. Leaves out packing several samples into one row and
 *  label smoothing. */
import * as tf from "@tensorflow/tfjs";
import type { CausalLM } from "../model/types.ts";
import { microBatchRows, rightPad } from "./batch.ts";
import { NonFiniteError } from "../util/errors.ts";
import { accumulateGrads } from "./grads.ts";
import type { AdamW } from "./optimizer.ts";

/** Rows of equal length. lossMask is aligned to ids: token t counts when lossMask[t] = 1, and is
 *  predicted from tokens < t (so position 0, with nothing before it, never counts). */
export interface SftBatch {
  ids: number[][]; // [B, L]
  attentionMask: number[][]; // [B, L]
  lossMask: number[][]; // [B, L]
}

export interface SftStepConfig {
  maxGradNorm: number; // ≤ 0 or Infinity: no clipping
  lr: number;
}

export interface SftStepResult {
  loss: number; // mean cross-entropy (nats) over the step's counted tokens
  gradNorm: number; // before clipping
  tokens: number; // counted tokens
}

/** 1 where a token is trained on: loss mask, inside the attention mask, and not position 0. */
export function effectiveMask(batch: SftBatch): number[][] {
  checkBatch(batch);
  return batch.lossMask.map((row, b) => row.map((m, t) => (t > 0 && m && batch.attentionMask[b][t] ? 1 : 0)));
}

export function countTokens(batch: SftBatch): number {
  return effectiveMask(batch).reduce((s, row) => s + row.reduce((a, x) => a + x, 0), 0);
}

/** Mean next-token cross-entropy over the counted tokens, −Σ log p(ids[t] | ids[<t]) / count.
 *  `tokenTotal` replaces the count as the divisor, so micro-batch losses add up to the mean over a
 *  larger batch. `training` turns on LoRA dropout. */
export function sftLoss(model: CausalLM, batch: SftBatch, opts: { tokenTotal?: number; training?: boolean } = {}): tf.Scalar {
  const mask = effectiveMask(batch);
  const count = mask.reduce((s, row) => s + row.reduce((a, x) => a + x, 0), 0);
  const divisor = opts.tokenTotal ?? count;
  if (!(divisor > 0)) throw new Error(`SFT batch has ${count} tokens with lossMask 1 (after position 0); need at least one`);
  return tf.tidy(() => {
    // the head scores only the counted tokens (a prompt's positions need no vocabulary product)
    const training = opts.training ?? false;
    const { logprobs } = model.tokenLogprobs(batch.ids, batch.attentionMask, { training, logprobMask: mask }); // [B, L]
    const m = tf.tensor2d(mask, [mask.length, mask[0].length], "float32"); // [B, L]
    return tf.div(tf.neg(tf.sum(tf.mul(logprobs, m))), divisor) as tf.Scalar;
  });
}

/** The batch's rows in parts of at most `maxRows(L)` rows (all of them when it allows that many). */
export function splitRows(batch: SftBatch, maxRows?: (length: number) => number): SftBatch[] {
  const B = batch.ids.length;
  if (!maxRows || B === 0) return [batch];
  const parts = microBatchRows(new Array<number>(B).fill(batch.ids[0].length), B, maxRows);
  if (parts.length === 1) return [batch];
  return parts.map((rows) => ({
    ids: rows.map((r) => batch.ids[r]),
    attentionMask: rows.map((r) => batch.attentionMask[r]),
    lossMask: rows.map((r) => batch.lossMask[r]),
  }));
}

/** A step's rows (indices into `encoded`) as micro-batches of `batchSize` conversations, each padded
 *  on the right to its longest; the loss reads the assistant's tokens. */
export function sftMicroBatches(
  rows: number[],
  encoded: { ids: number[]; assistantMask: number[] }[],
  batchSize: number,
  padId: number,
): SftBatch[] {
  const micro: SftBatch[] = [];
  for (let i = 0; i < rows.length; i += batchSize) {
    const part = rows.slice(i, i + batchSize).map((r) => encoded[r]);
    micro.push(
      rightPad(
        part.map((e) => e.ids),
        part.map((e) => e.assistantMask),
        padId,
      ),
    );
  }
  return micro;
}

/** One optimizer step over micro-batches. Each micro-batch's loss is divided by the token count of
 *  all of them, so the summed gradients equal those of one big batch; that also lets a micro-batch
 *  with more rows than the model's trainRowsFor allows (the backend's memory) run in parts with the
 *  same result. NaN/Inf loss or gradient norm throws NonFiniteError before any weight changes. */
export async function sftStep(model: CausalLM, optimizer: AdamW, batches: SftBatch[], cfg: SftStepConfig): Promise<SftStepResult> {
  const maxRows = model.trainRowsFor?.bind(model);
  const microBatches = batches.flatMap((b) => splitRows(b, maxRows));
  const counts = microBatches.map(countTokens);
  const tokens = counts.reduce((a, b) => a + b, 0);
  if (tokens === 0)
    throw new Error(`SFT step got ${microBatches.length} micro-batches with no token under lossMask 1; nothing to learn from`);
  const vars = model.trainableVariables();
  let acc: tf.NamedTensorMap | null = null;
  let loss = 0;
  try {
    for (let i = 0; i < microBatches.length; i++) {
      if (counts[i] === 0) continue; // contributes nothing to loss or gradient
      const { value, grads } = tf.variableGrads(() => sftLoss(model, microBatches[i], { tokenTotal: tokens, training: true }), vars);
      acc = accumulateGrads(acc, grads);
      loss += (await value.data())[0];
      value.dispose();
    }
    if (!Number.isFinite(loss)) throw new NonFiniteError("SFT loss", loss);
    const { gradNorm } = await optimizer.applyGradients(acc!, { lr: cfg.lr, maxGradNorm: cfg.maxGradNorm });
    return { loss, gradNorm, tokens };
  } finally {
    if (acc) tf.dispose(Object.values(acc));
  }
}

function checkBatch(batch: SftBatch): void {
  const B = batch.ids.length;
  if (B === 0) throw new Error("SFT batch has no rows");
  const L = batch.ids[0].length;
  for (const [name, rows] of [
    ["ids", batch.ids],
    ["attentionMask", batch.attentionMask],
    ["lossMask", batch.lossMask],
  ] as const) {
    if (rows.length !== B) throw new Error(`SFT batch ${name} has ${rows.length} rows; expected ${B} like ids`);
    rows.forEach((r, b) => {
      if (r.length !== L)
        throw new Error(`SFT batch ${name}[${b}] has ${r.length} columns; expected ${L} (rows must be padded to one length)`);
    });
  }
}
