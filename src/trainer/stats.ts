/** Confidence intervals and pass@k for evaluation summaries: the Wilson score interval for an
 *  accuracy, the unbiased pass@k estimator (Chen et al. 2021, "Evaluating Large Language Models
 *  Trained on Code"), and a normal-approximation interval for a mean of per-question scores.
 *  Pure functions on plain numbers; no tensors, no bootstrap. And the plain mean. */

/** The mean of xs (summed in order), or `empty` for an empty list (default NaN). */
export function mean(xs: readonly number[]): number;
export function mean<E>(xs: readonly number[], empty: E): number | E;
export function mean(xs: readonly number[], empty: unknown = NaN): unknown {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : empty;
}

export interface Interval {
  /** Point estimate. */
  value: number;
  lo: number;
  hi: number;
}

function checkCount(name: string, x: number): void {
  if (!Number.isInteger(x) || x < 0) throw new RangeError(`${name} = ${x}: expected a whole number >= 0`);
}

/** Wilson score interval for `successes` out of `n` trials. Unlike the Wald interval it stays inside
 *  [0, 1] and is sensible at 0/n and n/n, which small eval sets hit often. z = 1.96 gives 95%. */
export function wilsonInterval(successes: number, n: number, z = 1.96): Interval {
  checkCount("successes", successes);
  checkCount("n", n);
  if (n === 0) throw new RangeError(`n = 0: an interval needs at least one trial`);
  if (successes > n) throw new RangeError(`successes = ${successes} > n = ${n}: expected successes <= n`);
  if (!(z > 0)) throw new RangeError(`z = ${z}: expected a positive number (1.96 for 95%)`);
  const p = successes / n;
  const z2 = z * z;
  const denom = 1 + z2 / n;
  const center = (p + z2 / (2 * n)) / denom;
  const half = (z / denom) * Math.sqrt((p * (1 - p)) / n + z2 / (4 * n * n));
  return { value: p, lo: Math.max(0, center - half), hi: Math.min(1, center + half) };
}

/** Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k), computed as a
 *  product so it neither overflows nor loses precision for large n. */
export function passAtK(n: number, c: number, k: number): number {
  checkCount("n", n);
  checkCount("c", c);
  checkCount("k", k);
  if (c > n) throw new RangeError(`c = ${c} > n = ${n}: expected correct samples <= samples`);
  if (k < 1 || k > n) throw new RangeError(`k = ${k}: expected 1 <= k <= n = ${n}`);
  if (n - c < k) return 1; // every k-subset holds at least one correct sample
  // C(n-c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i)
  let miss = 1;
  for (let i = n - c + 1; i <= n; i++) miss *= 1 - k / i;
  return 1 - miss;
}

/** Mean of per-question scores (for example pass@1 = c_i / k from k samples each) with a normal
 *  interval mean ± z·s/√n, s the sample standard deviation (n - 1). The interval is clamped to
 *  [lo, hi] bounds when given (scores in [0, 1] use the defaults). One value gives a zero-width
 *  interval: there is nothing to estimate the spread from. */
export function meanCI(values: readonly number[], z = 1.96, bounds: [number, number] = [0, 1]): Interval & { sem: number; n: number } {
  const n = values.length;
  if (n === 0) throw new RangeError(`meanCI of an empty list: expected at least one value`);
  for (const v of values) if (!Number.isFinite(v)) throw new RangeError(`meanCI: value ${v} is not a finite number`);
  const m = mean(values);
  const variance = n > 1 ? values.reduce((a, v) => a + (v - m) ** 2, 0) / (n - 1) : 0;
  const sem = Math.sqrt(variance / n);
  return {
    value: m,
    lo: Math.max(bounds[0], m - z * sem),
    hi: Math.min(bounds[1], m + z * sem),
    sem,
    n,
  };
}
