/** Next-token sampling for a decode batch: temperature, top-k and top-p (nucleus) over logits [B, V],
 *  driven by a seeded Rng so a run can be replayed. Temperature 0 is greedy argmax (lowest id on ties).
 *
 *  Returns, per row, the token, its log-probability under the distribution actually sampled from
 *  (after temperature, top-k and top-p renormalisation; the "old policy" log-prob GRPO's ratio needs
 *  when rollouts are filtered) and the plain log_softmax(logits / T) value (what the trainer recomputes).
 *  Leaves out: repetition penalties, min-p, stop ids (the rollout loop owns stopping).
 *
 *  Heavy work stays on the backend: scaling, log-sum-exp over V and tf.topK; only B·k candidate values
 *  come back to JS. Without top-k/top-p the full rows come back once (the exact full distribution).
 *  Reads are synchronous (dataSync): the rollout step needs the tokens before it can go on anyway. */
import * as tf from "@tensorflow/tfjs";
import type { Rng } from "../util/rng.ts";

export interface SamplingParams {
  /** 0 = greedy. */
  temperature: number;
  /** Nucleus mass in (0, 1]; 1 = off. */
  topP?: number;
  /** Keep the k most likely tokens; 0 = off. */
  topK?: number;
}

export interface SampleResult {
  tokens: number[];
  /** log p(token) under the sampling distribution (0 for greedy: the choice was certain). */
  logprobs: number[];
  /** log_softmax(logits / T)[token], no top-k/top-p truncation (T = 1 for greedy). */
  rawLogprobs: number[];
}

/** First candidate count for top-p without top-k; grows ×8 until the nucleus fits (flat rows). */
const TOP_P_FIRST_K = 256;

export function checkSamplingParams(p: SamplingParams): void {
  if (!(Number.isFinite(p.temperature) && p.temperature >= 0))
    throw new Error(`temperature ${p.temperature} is invalid; accepted: a finite number >= 0 (0 = greedy)`);
  const topP = p.topP ?? 1;
  if (!(topP > 0 && topP <= 1)) throw new Error(`topP ${topP} is invalid; accepted: a number in (0, 1]`);
  const topK = p.topK ?? 0;
  if (!(Number.isInteger(topK) && topK >= 0)) throw new Error(`topK ${topK} is invalid; accepted: an integer >= 0 (0 = off)`);
}

/** Sample one token per row of logits [B, V]. Does not dispose `logits`; leaks no tensors. */
export function sampleTokens(logits: tf.Tensor2D, params: SamplingParams, rng: Rng): SampleResult {
  checkSamplingParams(params);
  const [B, V] = logits.shape;
  const topP = params.topP ?? 1;
  const topK = Math.min(params.topK ?? 0, V);
  if (params.temperature === 0) return greedy(logits);

  // scaled = logits / T; lse = logsumexp(scaled) per row, so log p = scaled - lse.
  const [scaled, lse] = tf.tidy(() => {
    const s = tf.div(logits.toFloat(), params.temperature) as tf.Tensor2D; // [B, V]
    return [s, tf.logSumExp(s, 1)] as const; // [B]
  });
  try {
    const lseV = lse.dataSync();
    if (topK === 0 && topP === 1) {
      const rows = scaled.dataSync(); // [B·V], the exact full distribution
      return sampleFull(rows, B, V, lseV, rng);
    }
    let k = topK > 0 ? topK : Math.min(V, TOP_P_FIRST_K);
    for (;;) {
      const { values, indices } = tf.topk(scaled, k, true); // [B, k] each, descending, lower id first on ties
      const vals = values.dataSync();
      const idx = indices.dataSync();
      tf.dispose([values, indices]);
      // Without top-k the candidates must hold the whole nucleus; otherwise widen and redo.
      const fits = topK > 0 || k === V || nucleusFits(vals, B, k, lseV, topP);
      if (fits) return sampleCandidates(vals, idx, B, k, lseV, topP, topK > 0, rng);
      k = Math.min(V, k * 8);
    }
  } finally {
    tf.dispose([scaled, lse]);
  }
}

function greedy(logits: tf.Tensor2D): SampleResult {
  const [B] = logits.shape;
  const { values, indices, lse } = tf.tidy(() => {
    // topK(…, 1) keeps the lower index among equal values (argMax makes no such promise everywhere).
    const { values, indices } = tf.topk(logits.toFloat(), 1, true); // [B, 1]
    return { values, indices, lse: tf.logSumExp(logits.toFloat(), 1) }; // [B]
  });
  const v = values.dataSync(), i = indices.dataSync(), l = lse.dataSync();
  tf.dispose([values, indices, lse]);
  const tokens: number[] = [], logprobs: number[] = [], rawLogprobs: number[] = [];
  for (let b = 0; b < B; b++) {
    tokens.push(i[b]);
    logprobs.push(0);
    rawLogprobs.push(v[b] - l[b]);
  }
  return { tokens, logprobs, rawLogprobs };
}

/** Inverse-CDF draw from exp(row - lse) over the whole vocabulary. */
function sampleFull(rows: ArrayLike<number>, B: number, V: number, lse: ArrayLike<number>, rng: Rng): SampleResult {
  const tokens: number[] = [], logprobs: number[] = [], rawLogprobs: number[] = [];
  for (let b = 0; b < B; b++) {
    const off = b * V;
    const u = rng.next();
    let acc = 0, tok = -1, lastPositive = 0;
    for (let j = 0; j < V; j++) {
      const p = Math.exp(rows[off + j] - lse[b]);
      if (p > 0) lastPositive = j;
      acc += p;
      if (u < acc) { tok = j; break; }
    }
    if (tok < 0) tok = lastPositive; // float sum fell short of u: the tail's last token
    const lp = rows[off + tok] - lse[b];
    tokens.push(tok);
    logprobs.push(lp);
    rawLogprobs.push(lp);
  }
  return { tokens, logprobs, rawLogprobs };
}

function nucleusFits(vals: ArrayLike<number>, B: number, k: number, lse: ArrayLike<number>, topP: number): boolean {
  for (let b = 0; b < B; b++) {
    let mass = 0;
    for (let j = 0; j < k; j++) mass += Math.exp(vals[b * k + j] - lse[b]);
    if (mass < topP) return false;
  }
  return true;
}

/** Candidates are each row's top k (descending). As Hugging Face orders its warpers: top-k first, then
 *  the smallest prefix holding topP of the top-k-renormalised mass (at least one token); renormalise,
 *  draw. Without top-k the candidates hold the whole nucleus, so their mass is measured against 1. */
function sampleCandidates(
  vals: ArrayLike<number>, idx: ArrayLike<number>, B: number, k: number,
  lse: ArrayLike<number>, topP: number, topKOn: boolean, rng: Rng,
): SampleResult {
  const tokens: number[] = [], logprobs: number[] = [], rawLogprobs: number[] = [];
  const p = new Float64Array(k);
  for (let b = 0; b < B; b++) {
    const off = b * k;
    let total = 0;
    for (let j = 0; j < k; j++) total += p[j] = Math.exp(vals[off + j] - lse[b]);
    const need = topP * (topKOn ? total : 1);
    let kept = 0, mass = 0;
    while (kept < k) {
      mass += p[kept++];
      if (topP < 1 && mass >= need) break;
    }
    const u = rng.next() * mass;
    let acc = 0, j = 0;
    for (; j < kept - 1; j++) {
      acc += p[j];
      if (u < acc) break;
    }
    while (j > 0 && p[j] === 0) j--; // float round-off past the last token with mass
    tokens.push(idx[off + j]);
    logprobs.push(Math.log(p[j] / mass));
    rawLogprobs.push(vals[off + j] - lse[b]);
  }
  return { tokens, logprobs, rawLogprobs };
}
