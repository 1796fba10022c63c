/** Sampling one row of logits on the host, given the whole row. Two walks, both inverse-CDF draws
 *  (the first token whose cumulative mass exceeds u·(kept mass), u uniform in [0, 1)) from the same
 *  distribution, differing only in the order the tokens are walked, so a seed maps to different tokens:
 *  - "id" (the host sampler: wasm, cpu; every earlier version's draws, bit for bit): the whole
 *    vocabulary, or the top-p nucleus, is walked in id order; top-k candidates in rank order.
 *  - "rank" (the device sampler's, webgpu): every mode walks a prefix of the tokens in *rank order*
 *    (value descending, lower id first among ties), so a draw only needs the most likely tokens, which
 *    is all the device path reads back; sampler.ts comes here for a row only when the prefix reaches
 *    past its candidates.
 *  Modes (both walks): greedy (temperature 0) is the argmax, lowest id on ties, and draws no uniform;
 *  top-k keeps the k most likely, then top-p of their renormalised mass (Hugging Face's warper order);
 *  top-p alone keeps the most likely tokens until their mass reaches topP (ties at the boundary: lower
 *  ids first); neither keeps the whole vocabulary.
 *  Leaves out: repetition penalties, min-p, stop ids (the rollout loop owns stopping). */
import { NonFiniteError } from "../util/errors.ts";

export interface SamplingParams {
  /** 0 = greedy. */
  temperature: number;
  /** Nucleus mass in (0, 1]; 1 = off. */
  topP?: number;
  /** Keep the k most likely tokens; 0 = off. */
  topK?: number;
}

export interface RowDraw {
  token: number;
  /** log p(token) under the distribution drawn from (after top-k/top-p renormalisation); 0 for greedy. */
  logprob: number;
}

export function checkSamplingParams(p: SamplingParams): void {
  if (!(Number.isFinite(p.temperature) && p.temperature >= 0))
    throw new Error(`temperature ${p.temperature} is invalid; accepted: a finite number >= 0 (0 = greedy)`);
  const topP = p.topP ?? 1;
  if (!(topP > 0 && topP <= 1)) throw new Error(`topP ${topP} is invalid; accepted: a number in (0, 1]`);
  const topK = p.topK ?? 0;
  if (!(Number.isInteger(topK) && topK >= 0)) throw new Error(`topK ${topK} is invalid; accepted: an integer >= 0 (0 = off)`);
}

/** Below this (in units of log-prob relative to the max) exp() is skipped: e^-40·V < 1e-12 even at
 *  V = 152k, far under float32 resolution, so the normaliser is unchanged in practice. */
const NEGLIGIBLE = -40;

/** exp((x − max) / T), 0 where negligible: the unnormalised weight of a logit. */
export function weightOf(x: number, max: number, T: number): number {
  const z = (x - max) / T;
  return z > NEGLIGIBLE ? Math.exp(z) : 0;
}

/** Rank order is found through buckets of (max − x)/T, PER_UNIT to a unit: a bucket's tokens all rank
 *  above the next bucket's, so only the one bucket where the cumulative mass crosses is sorted. */
const PER_UNIT = 16;
const BUCKETS = -NEGLIGIBLE * PER_UNIT + 1;

/** The order a whole-vocabulary or top-p draw walks (see the header). */
export type Walk = "id" | "rank";

/** Buffers reused across the rows of one call. */
export class Scratch {
  e: Float64Array; // weightOf(row[j]), 0 where negligible
  copy: Float32Array; // quickselect works on a copy
  idx: Uint32Array; // token ids, permuted by the nucleus select (id walk)
  private ranks?: { bucket: Uint16Array; bucketMass: Float64Array }; // rank walk only
  constructor(readonly V: number) {
    this.e = new Float64Array(V);
    this.copy = new Float32Array(V);
    this.idx = new Uint32Array(V);
  }
  get rank(): { bucket: Uint16Array; bucketMass: Float64Array } {
    return (this.ranks ??= { bucket: new Uint16Array(this.V), bucketMass: new Float64Array(BUCKETS) });
  }
}

/** The uniform a row consumes: one rng draw, none when greedy (so greedy rows leave the stream alone). */
export function uniformFor(params: SamplingParams, rng: { next(): number }): number {
  return params.temperature === 0 ? 0 : rng.next();
}

/** Draw one token from a whole row with the uniform `u` (see uniformFor), walking `walk` order. */
export function sampleRow(
  row: Float32Array<ArrayBufferLike>,
  params: SamplingParams,
  u: number,
  scratch = new Scratch(row.length),
  walk: Walk = "id",
): RowDraw {
  const V = row.length;
  const T = params.temperature === 0 ? 1 : params.temperature;
  let max = -Infinity,
    argmax = 0;
  for (let j = 0; j < V; j++)
    if (row[j] > max) {
      max = row[j];
      argmax = j;
    } // strict >: lowest id on ties
  // weights that blew up (learning rate) or bad input
  if (!Number.isFinite(max)) throw new NonFiniteError("the largest logit of a sampled row", max);
  const topP = params.topP ?? 1;
  const topK = Math.min(params.topK ?? 0, V);
  const e = scratch.e;
  const ranked = walk === "rank" && params.temperature > 0 && topK === 0; // a draw over the whole row in rank order
  let sum = 0;
  if (ranked) {
    const { bucket, bucketMass } = scratch.rank;
    bucketMass.fill(0);
    for (let j = 0; j < V; j++) {
      const z = (row[j] - max) / T; // weightOf, inlined to bucket in the same pass
      if (!(z > NEGLIGIBLE)) {
        e[j] = 0;
        continue;
      }
      sum += e[j] = Math.exp(z);
      bucketMass[(bucket[j] = Math.min(BUCKETS - 1, Math.floor(-z * PER_UNIT)))] += e[j];
    }
  } else {
    for (let j = 0; j < V; j++) {
      const z = (row[j] - max) / T;
      sum += e[j] = z > NEGLIGIBLE ? Math.exp(z) : 0;
    }
  }
  const logZ = Math.log(sum); // log p_j = (x_j - max)/T - logZ
  const raw = (j: number) => (row[j] - max) / T - logZ;
  if (params.temperature === 0) return { token: argmax, logprob: 0 };

  if (topK > 0) {
    const cand = topIndices(row, topK, scratch.copy); // rank order (both walks)
    const { index, mass } = drawPrefix(
      cand.map((j) => e[j]),
      topP,
      u,
    )!; // whole: never null
    return { token: cand[index], logprob: Math.log(e[cand[index]] / mass) };
  }
  if (ranked) {
    // The whole vocabulary in rank order, or its nucleus (its mass: where the cumulative reaches topP).
    const mass = topP < 1 ? crossing(row, topP * sum, false, scratch).through : sum;
    const tok = crossing(row, u * mass, true, scratch).token;
    return { token: tok, logprob: topP < 1 ? Math.log(e[tok] / mass) : raw(tok) };
  }
  if (topP === 1) {
    // Inverse CDF over the whole vocabulary in id order.
    const target = u * sum;
    let acc = 0,
      tok = argmax;
    for (let j = 0; j < V; j++) {
      if (e[j] === 0) continue;
      acc += e[j];
      tok = j;
      if (target < acc) break;
    }
    return { token: tok, logprob: raw(tok) };
  }
  // Nucleus: find the boundary value by a mass-weighted select (no sort of V), keep everything above
  // it and, among ties at it, the lowest ids until the mass is reached; walk the kept ids in id order.
  const need = topP * sum;
  const { value, before } = nucleusBoundary(row, e, need, scratch.idx);
  let mass = before;
  const kept: number[] = [];
  for (let j = 0; j < V; j++) {
    if (row[j] > value) kept.push(j);
    else if (row[j] === value && mass < need) {
      kept.push(j);
      mass += e[j];
    }
  }
  const target = u * mass;
  let acc = 0,
    i = 0;
  for (; i < kept.length - 1; i++) {
    acc += e[kept[i]];
    if (target < acc) break;
  }
  while (i > 0 && e[kept[i]] === 0) i--; // float round-off ran past the last token with mass
  const tok = kept[i];
  return { token: tok, logprob: Math.log(e[tok] / mass) };
}

/** The value v of the last token the nucleus needs (tokens sorted by value descending): the mass of
 *  values > v is below `need`, of values >= v reaches it. Returns v and the mass strictly above it.
 *  Three-way quickselect over indices (`idx`, scratch of length V), weighted by e; linear on average. */
function nucleusBoundary(
  row: Float32Array<ArrayBufferLike>,
  e: Float64Array,
  need: number,
  idx: Uint32Array,
): { value: number; before: number } {
  let n = 0;
  for (let j = 0; j < row.length; j++) if (e[j] > 0) idx[n++] = j; // zero-mass tokens are never needed
  let lo = 0,
    hi = n - 1,
    before = 0;
  for (;;) {
    const mid = (lo + hi) >>> 1;
    const x = row[idx[lo]],
      y = row[idx[mid]],
      z = row[idx[hi]];
    const pivot = x > y ? (y > z ? y : x > z ? z : x) : x > z ? x : y > z ? z : y;
    // Partition descending: [lo, lt) > pivot, [lt, i) == pivot, (gt, hi] < pivot.
    let lt = lo,
      i = lo,
      gt = hi,
      massGt = 0,
      massEq = 0;
    while (i <= gt) {
      const id = idx[i],
        v = row[id];
      if (v > pivot) {
        idx[i] = idx[lt];
        idx[lt] = id;
        lt++;
        i++;
        massGt += e[id];
      } else if (v < pivot) {
        idx[i] = idx[gt];
        idx[gt] = id;
        gt--;
      } else {
        i++;
        massEq += e[id];
      }
    }
    if (before + massGt >= need && lt > lo)
      hi = lt - 1; // the boundary is among the larger values
    else if (before + massGt + massEq >= need || gt >= hi) return { value: pivot, before: before + massGt };
    else {
      before += massGt + massEq;
      lo = gt + 1;
    }
  }
}

/** The token at which rank order's cumulative mass crosses `need` (exceeds it when strict, a draw;
 *  reaches it otherwise, a nucleus) and the cumulative mass through that token. */
function crossing(row: Float32Array<ArrayBufferLike>, need: number, strict: boolean, scratch: Scratch): { token: number; through: number } {
  const e = scratch.e,
    { bucket, bucketMass } = scratch.rank;
  const crosses = (m: number) => (strict ? m > need : m >= need);
  let b = 0,
    before = 0;
  while (b < BUCKETS - 1 && !crosses(before + bucketMass[b])) before += bucketMass[b++];
  while (b > 0 && bucketMass[b] === 0) before -= bucketMass[--b]; // float round-off ran past the last token with mass
  const ids: number[] = [];
  for (let j = 0; j < row.length; j++) if (e[j] > 0 && bucket[j] === b) ids.push(j);
  ids.sort((i, j) => row[j] - row[i] || i - j); // rank order within the bucket (ids arrive ascending)
  let acc = before;
  for (const j of ids) {
    acc += e[j];
    if (crosses(acc)) return { token: j, through: acc };
  }
  return { token: ids[ids.length - 1], through: acc }; // round-off again: the bucket's last token
}

/** Inverse-CDF draw over weights `w` in rank order: keep the shortest prefix whose mass reaches topP
 *  of `total` (everything when topP is 1), then take the first index whose cumulative weight exceeds
 *  u·(kept mass). Returns that index and the kept mass. `total` given: w are only the first of more
 *  tokens whose weights sum to total, and null means the prefix or the draw reaches past them.
 *  Shared by the host path and the candidate path (sampler.ts), so both draw alike. */
export function drawPrefix(w: ArrayLike<number>, topP: number, u: number, total?: number): { index: number; mass: number } | null {
  const whole = total === undefined;
  let mass = 0;
  if (whole) for (let i = 0; i < w.length; i++) mass += w[i];
  else mass = total;
  let kept = w.length;
  if (topP < 1) {
    const need = topP * mass;
    mass = 0;
    kept = 0;
    while (kept < w.length && mass < need) mass += w[kept++];
    if (mass < need && !whole) return null; // the nucleus is wider than the candidates
  }
  const target = u * mass;
  let acc = 0;
  for (let i = 0; i < kept; i++) {
    acc += w[i];
    if (target < acc) return { index: i, mass };
  }
  if (!whole && topP === 1) return null; // the draw lands past the candidates
  let i = kept - 1;
  while (i > 0 && w[i] === 0) i--; // float round-off ran past the last token with mass
  return { index: i, mass };
}

/** Indices of the k largest values in rank order (value descending, lower id first among ties). */
export function topIndices(
  row: Float32Array<ArrayBufferLike>,
  k: number,
  copy: Float32Array<ArrayBufferLike> = new Float32Array(row.length),
): number[] {
  const V = row.length;
  let kth: number;
  if (k >= V) kth = -Infinity;
  else {
    copy.set(row);
    kth = kthLargest(copy, k);
  }
  const above: number[] = [],
    equal: number[] = [];
  for (let j = 0; j < V; j++) {
    if (row[j] > kth) above.push(j);
    else if (row[j] === kth && equal.length < k) equal.push(j);
  }
  const idx = above.concat(equal.slice(0, k - above.length));
  idx.sort((a, b) => row[b] - row[a] || a - b);
  return idx;
}

/** The k-th largest value (1-based), by three-way quickselect in place; linear on average, and ties
 *  (flat rows) cost nothing extra. Median-of-three pivots keep it deterministic. */
function kthLargest(a: Float32Array<ArrayBufferLike>, k: number): number {
  let lo = 0,
    hi = a.length - 1,
    want = k - 1; // index in descending order
  for (;;) {
    if (lo >= hi) return a[lo];
    const mid = (lo + hi) >>> 1;
    const x = a[lo],
      y = a[mid],
      z = a[hi];
    const pivot = x > y ? (y > z ? y : x > z ? z : x) : x > z ? x : y > z ? z : y;
    // Partition descending: [lo, lt) > pivot, [lt, i) == pivot, (gt, hi] < pivot.
    let lt = lo,
      i = lo,
      gt = hi;
    while (i <= gt) {
      const v = a[i];
      if (v > pivot) {
        a[i] = a[lt];
        a[lt] = v;
        lt++;
        i++;
      } else if (v < pivot) {
        a[i] = a[gt];
        a[gt] = v;
        gt--;
      } else i++;
    }
    if (want < lt) hi = lt - 1;
    else if (want > gt) lo = gt + 1;
    else return pivot;
  }
}
