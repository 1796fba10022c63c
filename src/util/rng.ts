/** Seeded random numbers with a state that can be saved and restored (checkpoints resume the exact
 *  stream). Mulberry32 over a 32-bit state: fast, small, and good enough for sampling and shuffling;
 *  not for cryptography. */
export class Rng {
  private state: number;

  constructor(seed: number) {
    this.state = seed >>> 0;
  }

  /** Uniform in [0, 1). */
  next(): number {
    let t = (this.state = (this.state + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** Integer in [lo, hi] inclusive. */
  int(lo: number, hi: number): number {
    return lo + Math.floor(this.next() * (hi - lo + 1));
  }

  /** Standard normal (Box-Muller). */
  normal(): number {
    const u = 1 - this.next();
    const v = this.next();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  }

  pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.next() * items.length)];
  }

  /** Fisher-Yates, in place; returns the array. */
  shuffle<T>(items: T[]): T[] {
    for (let i = items.length - 1; i > 0; i--) {
      const j = Math.floor(this.next() * (i + 1));
      [items[i], items[j]] = [items[j], items[i]];
    }
    return items;
  }

  /** A new generator whose stream is independent of this one's future draws. */
  fork(): Rng {
    return new Rng(Math.floor(this.next() * 4294967296));
  }

  getState(): number {
    return this.state;
  }

  setState(state: number): void {
    this.state = state >>> 0;
  }
}

/** lowbias32 (Chris Wellons' integer hash): a 32-bit avalanche of x. */
function mix32(x: number): number {
  x ^= x >>> 16;
  x = Math.imul(x, 0x7feb352d);
  x ^= x >>> 15;
  x = Math.imul(x, 0x846ca68b);
  x ^= x >>> 16;
  return x >>> 0;
}

/** A counter-based uniform in [0, 1) with 53 random bits, keyed on (seed, row, position): the draw
 *  of a row's token at a position is the same whatever else the batch holds and whichever step
 *  reaches it (the compiled decoder's draws; Philox-style keyed streams in vLLM and JAX). */
export function keyedUniform(seed: number, row: number, position: number): number {
  const h = mix32(mix32(mix32(seed >>> 0) ^ (row >>> 0)) ^ Math.imul(position >>> 0, 0x9e3779b9));
  const a = h >>> 5, // 27 bits
    b = mix32(h ^ 0x85ebca6b) >>> 6; // 26 bits
  return (a * 67108864 + b) / 9007199254740992;
}
