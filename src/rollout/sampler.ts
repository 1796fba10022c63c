/** Next-token sampling for a decode batch: temperature, top-k and top-p (nucleus) over logits [B, V],
 *  driven by a seeded Rng so a run can be replayed. Temperature 0 is greedy argmax (lowest id on ties).
 *  How a seed maps to tokens is defined in sample-row.ts; this file decides where the work happens.
 *
 *  Returns, per row, the token, its log-probability under the distribution actually sampled from
 *  (after temperature, top-k and top-p renormalisation; the "old policy" log-prob) and the plain
 *  log_softmax(logits / T) value (what the trainer recomputes).
 *
 *  Three paths, the same distribution, different draws for a seed (one uniform per sampled row, in row
 *  order, on all):
 *  - host (wasm, cpu): read the logits [B, V] once and draw each row in JS, walking ids (sample-row.ts's
 *    "id" walk): the same tokens for a seed as every earlier version. On wasm and cpu that read is a
 *    copy of memory the engine already holds, and a JS pass beats tfjs' reductions (at B 32 ×
 *    V 151,669 on 2 cores: logSumExp ~150 ms and topk ~30 ms on wasm, ~900 / ~700 ms on cpu; read + JS
 *    ~130 ms).
 *  - a draw over the whole vocabulary (a temperature, no top-k or top-p: the rollouts' default) and
 *    greedy (the argmax, lowest id on ties: evaluation's default) where the logits lie, on wasm and
 *    webgpu (kernels/draw.ts): the id walk again, nothing or B·2 floats read. On wasm the host walk's
 *    float64 arithmetic, rows split over the heap module's threads (32 rows of 151,936 took ~150 ms
 *    a step on one thread): the host path's tokens and log-probs. On webgpu one workgroup per row in
 *    float32 with double-float32 running sums: the host's tokens unless a draw lands within float32
 *    rounding of a boundary, log-probs to ~1e-6.
 *  - candidates (webgpu's top-k and top-p draws, where a read is a transfer and a sync): draws walk
 *    ranks ("rank" walk), since only the most likely tokens reach the host. The device computes per
 *    row the top K logits with their ids, the normaliser's part below them (Σ exp((x − max)/T) over
 *    x < the K-th value) and the count of ties at the K-th value; one read of B·(2 + 2K) floats
 *    (K = 64: 17 KB at B 32, instead of 19 MB of logits). The host adds the candidates' weights in float64 and draws with the rank walk's
 *    own code; a row whose draw or nucleus reaches past its candidates (flat distributions, ties at the
 *    K-th value) reads its logits row and is drawn by the host's rank walk, all such rows in one more
 *    read. Token ids are the rank walk's on the host (`walk: "rank"`, what the tests compare with); the
 *    tail of the normaliser is summed in float32 instead of float64, so log-probs agree to ~1e-6 and a
 *    draw within ~1e-7 of a boundary could in principle go the other way. So webgpu's tokens for a seed
 *    differ from wasm's on top-p draws (as float rounding alone would make them anyway).
 *    GRPO recomputes its old log-probs with the trainer's forward (trainer/grpo.ts); these are the
 *    logged sampling log-probs. */
import * as tf from "@tensorflow/tfjs";
import { drawWholeRows } from "../kernels/draw.ts";
import { backendProfile } from "../kernels/profile.ts";
import type { Rng } from "../util/rng.ts";
import {
  checkSamplingParams,
  drawPrefix,
  sampleRow,
  Scratch,
  uniformFor,
  weightOf,
  type RowDraw,
  type SamplingParams,
  type Walk,
} from "./sample-row.ts";

export { checkSamplingParams, sampleRow, topIndices, type SamplingParams, type Walk } from "./sample-row.ts";

export interface SampleResult {
  tokens: number[];
  /** log p(token) under the sampling distribution (0 for greedy: the choice was certain). */
  logprobs: number[];
  /** Floats read back from the backend: B·V on the host path (none where wasm draws on its heap);
   *  B·(2 + 2K) on the candidate path, plus V for each row drawn from its whole row. */
  readFloats: number;
}

export interface SampleOptions {
  /** Draw from candidates computed on the device. Default: the backend profile's `deviceSampling`,
   *  where a whole-vocabulary draw still goes to the backend's draw kernel; true: candidates always. */
  onDevice?: boolean;
  /** The host path's walk: "id" (default: the host sampler's own draws) or "rank" (the device path's
   *  draws, computed from the whole rows: the reference the tests compare the device path with). The
   *  candidate path always walks ranks; "rank" also keeps a whole-vocabulary draw off the kernel. */
  walk?: Walk;
}

/** K, the candidates per row on the device path (more when top-k needs them: topK + 1, so the k-th
 *  is known to be above the rest). A trained model's draw at T = 1 lands in its top 64 nearly always. */
export const CANDIDATES = 64;

/** Sample one token per row of logits [B, V]. Does not dispose `logits`; leaks no tensors. Reads are
 *  asynchronous and batched over rows (a GPU backend has no synchronous read in Node). */
export async function sampleTokens(logits: tf.Tensor2D, params: SamplingParams, rng: Rng, opts: SampleOptions = {}): Promise<SampleResult> {
  checkSamplingParams(params);
  const [B, V] = logits.shape;
  const us = Array.from({ length: B }, () => uniformFor(params, rng)); // row order, as the host path draws
  const onDevice = opts.onDevice ?? backendProfile().deviceSampling;
  const whole = params.temperature > 0 && !(params.topK ?? 0) && (params.topP ?? 1) === 1;
  // A whole-vocabulary draw walks ids where the logits lie, on a backend with the kernel (wasm: the
  // host walk's arithmetic; webgpu: the same walk in float32), and greedy takes the argmax there
  // (both walks agree on it), unless the candidates are asked for.
  const byKernel =
    (whole || params.temperature === 0) && opts.onDevice !== true && (opts.walk ?? "id") === "id"
      ? await drawWholeRows(logits, params.temperature, us)
      : null;
  const { draws, floats } = byKernel
    ? { draws: byKernel.draws.map((d) => (d.token >= 0 ? d : null)), floats: byKernel.readFloats } // −1: sampleRow says what is wrong
    : onDevice
      ? await fromCandidates(logits, params, us)
      : { draws: new Array<RowDraw | null>(B).fill(null), floats: 0 };
  const walk = onDevice && !byKernel ? "rank" : (opts.walk ?? "id");
  const rest = draws.flatMap((d, b) => (d === null ? [b] : []));
  if (rest.length > 0) {
    const sub = tf.tidy(() => {
      const x = rest.length === B ? logits : tf.gather(logits, rest);
      return x.dtype === "float32" ? x : tf.cast(x, "float32");
    });
    const data = (await sub.data()) as Float32Array;
    if (sub !== logits) sub.dispose();
    const scratch = new Scratch(V);
    rest.forEach((b, i) => (draws[b] = sampleRow(data.subarray(i * V, (i + 1) * V), params, us[b], scratch, walk)));
  }
  const out: SampleResult = { tokens: [], logprobs: [], readFloats: floats + rest.length * V };
  for (const d of draws as RowDraw[]) {
    out.tokens.push(d.token);
    out.logprobs.push(d.logprob);
  }
  return out;
}

/** The candidate path: one device pass and one read for all rows; null for a row the candidates
 *  cannot decide (the caller reads that row). */
async function fromCandidates(
  logits: tf.Tensor2D,
  params: SamplingParams,
  us: number[],
): Promise<{ draws: (RowDraw | null)[]; floats: number }> {
  const [B, V] = logits.shape;
  const T = params.temperature === 0 ? 1 : params.temperature;
  const K = candidatesFor(params, V);
  const packed = tf.tidy(() => {
    const x = logits.dtype === "float32" ? logits : tf.cast(logits, "float32");
    const { values, indices } = tf.topk(x, K); // [B, K], value descending (ties in any order)
    const max = tf.slice(values, [0, 0], [B, 1]); // [B, 1]
    const kth = tf.slice(values, [0, K - 1], [B, 1]); // [B, 1]
    // The normaliser's part below the candidates, in float32; the host adds the candidates' own
    // weights in float64, so a peaked row's log-probs keep full precision.
    const w = tf.mul(tf.exp(tf.div(tf.sub(x, max), T)), tf.cast(tf.less(x, kth), "float32")); // [B, V]
    // Summed in blocks of 256, then over blocks: a float32 running sum over 152k terms drifts ~1e-4.
    const n = Math.ceil(V / 256);
    const blocks = tf.reshape(
      n * 256 === V
        ? w
        : tf.pad(w, [
            [0, 0],
            [0, n * 256 - V],
          ]),
      [B, n, 256],
    ); // [B, n, 256]
    const below = tf.sum(tf.sum(blocks, 2), 1, true); // [B, 1]
    const atKth = tf.sum(tf.cast(tf.equal(x, kth), "float32"), 1, true); // [B, 1]: tokens tied at the K-th value
    return tf.concat([below, atKth, values, tf.cast(indices, "float32")], 1); // [B, 2 + 2K]; ids < 2^24 are exact
  });
  const data = (await packed.data()) as Float32Array;
  packed.dispose();

  return { draws: drawCandidates(data, K, V, params, us), floats: B * (2 + 2 * K) };
}

/** Candidate count per row for these settings: the top CANDIDATES (topK + 1 when more, so the k-th
 *  is known to be above the rest), 2 for greedy (is the max unique?). */
export function candidatesFor(params: SamplingParams, V: number): number {
  const topK = Math.min(params.topK ?? 0, V);
  return Math.min(V, params.temperature === 0 ? 2 : Math.max(CANDIDATES, topK + 1));
}

/** Per row of packed candidates [below, atKth, values K, ids K] (any order of the K; `below` the
 *  normaliser's part under the K-th value, `atKth` the count of tokens tied at it), the draw with
 *  uniform us[b] in rank order, or null where the candidates cannot decide it (the caller reads that
 *  row). The device path of sampleTokens and the compiled decoder's (kernels/webgpu/decode/) share it. */
export function drawCandidates(data: Float32Array, K: number, V: number, params: SamplingParams, us: number[]): (RowDraw | null)[] {
  const greedy = params.temperature === 0;
  const T = greedy ? 1 : params.temperature;
  const topP = params.topP ?? 1;
  const topK = Math.min(params.topK ?? 0, V);
  const W = 2 + 2 * K;
  const draws = us.map((u, b): RowDraw | null => {
    const row = data.subarray(b * W, (b + 1) * W);
    const vals = row.subarray(2, 2 + K),
      ids = row.subarray(2 + K);
    const order = Array.from({ length: K }, (_, i) => i).sort((i, j) => vals[j] - vals[i] || ids[i] - ids[j]); // rank order
    const max = vals[order[0]],
      kth = vals[order[K - 1]];
    if (!Number.isFinite(max) || vals.some(Number.isNaN)) return null; // non-finite logits: the host path says what is wrong
    // Tokens above the K-th value are all here and in rank order; tokens tied at it may not all be.
    let certain = K;
    if (K < V) while (certain > 0 && vals[order[certain - 1]] === kth) certain--;
    const wAll = order.map((i) => weightOf(vals[i], max, T));
    let sum = row[0],
      here = 0; // here: candidates tied at the K-th value
    for (let i = 0; i < K; i++) {
      sum += wAll[i];
      if (vals[order[i]] === kth) here++;
    }
    sum += (row[1] - here) * weightOf(kth, max, T); // ties at the K-th value that did not fit
    const w = wAll.slice(0, certain);
    const logZ = Math.log(sum);
    const drawn = (i: number, logprob: (raw: number) => number): RowDraw => {
      const raw = (vals[order[i]] - max) / T - logZ;
      return { token: ids[order[i]], logprob: logprob(raw) };
    };
    if (greedy) return certain > 0 ? drawn(0, () => 0) : null;
    const d = topK > 0 ? (topK <= certain ? drawPrefix(w.slice(0, topK), topP, u) : null) : drawPrefix(w, topP, u, sum);
    if (d === null) return null;
    return drawn(d.index, (raw) => (topK === 0 && topP === 1 ? raw : Math.log(w[d.index] / d.mass)));
  });
  return draws;
}
