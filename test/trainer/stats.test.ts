import { describe, expect, it } from "vitest";
import { meanCI, passAtK, wilsonInterval } from "../../src/trainer/stats.ts";

function binom(n: number, k: number): number {
  let r = 1;
  for (let i = 1; i <= k; i++) r = (r * (n - k + i)) / i;
  return r;
}

describe("wilsonInterval", () => {
  it("matches published values", () => {
    // 8/10 at 95%: (0.4902, 0.9433) — Newcombe (1998), Table I style example, also R binom.wilson.
    const a = wilsonInterval(8, 10);
    expect(a.value).toBe(0.8);
    expect(a.lo).toBeCloseTo(0.4902, 4);
    expect(a.hi).toBeCloseTo(0.9433, 4);
    // 0/10: lower bound 0, upper bound z²/(n+z²) = 3.8416/13.8416.
    const b = wilsonInterval(0, 10);
    expect(b.lo).toBe(0);
    expect(b.hi).toBeCloseTo(3.8416 / 13.8416, 10);
    // 50/100: symmetric about 0.5, (0.4038, 0.5962).
    const c = wilsonInterval(50, 100);
    expect(c.lo).toBeCloseTo(0.4038, 4);
    expect(c.hi).toBeCloseTo(0.5962, 4);
  });

  it("rejects impossible counts with the value in the message", () => {
    expect(() => wilsonInterval(3, 2)).toThrow(/successes = 3 > n = 2/);
    expect(() => wilsonInterval(1, 0)).toThrow(/n = 0/);
    expect(() => wilsonInterval(1.5, 4)).toThrow(/successes = 1.5/);
  });
});

describe("passAtK", () => {
  it("equals 1 - C(n-c,k)/C(n,k)", () => {
    expect(passAtK(10, 3, 5)).toBeCloseTo(1 - 21 / 252, 12);
    expect(passAtK(2, 1, 1)).toBeCloseTo(0.5, 12);
    for (const [n, c, k] of [
      [20, 4, 1],
      [20, 4, 10],
      [16, 0, 4],
      [16, 16, 4],
      [30, 7, 3],
    ]) {
      expect(passAtK(n, c, k)).toBeCloseTo(1 - binom(n - c, k) / binom(n, k), 12);
    }
  });

  it("pass@1 is c/n and pass@k grows with k", () => {
    expect(passAtK(8, 3, 1)).toBeCloseTo(3 / 8, 12);
    expect(passAtK(8, 3, 6)).toBe(1); // n - c = 5 < 6
    const ks = [1, 2, 3, 4, 5].map((k) => passAtK(8, 3, k));
    for (let i = 1; i < ks.length; i++) expect(ks[i]).toBeGreaterThan(ks[i - 1]);
  });

  it("stays finite for large n", () => {
    expect(passAtK(1000, 10, 100)).toBeCloseTo(1 - binom(990, 100) / binom(1000, 100), 10);
    expect(() => passAtK(4, 5, 1)).toThrow(/c = 5 > n = 4/);
    expect(() => passAtK(4, 1, 5)).toThrow(/k = 5/);
  });
});

describe("meanCI", () => {
  it("gives mean ± 1.96·s/√n", () => {
    // per-question pass@1 from 4 samples: 0, 0.25, 1, 0.75 → mean 0.5, s² = 0.625/3
    const r = meanCI([0, 0.25, 1, 0.75]);
    const sem = Math.sqrt(0.625 / 3 / 4);
    expect(r.value).toBeCloseTo(0.5, 12);
    expect(r.sem).toBeCloseTo(sem, 12);
    expect(r.lo).toBeCloseTo(0.5 - 1.96 * sem, 12);
    expect(r.hi).toBeCloseTo(0.5 + 1.96 * sem, 12);
  });

  it("clamps to the score range and handles one value", () => {
    const r = meanCI([1, 1, 1, 0.5]);
    expect(r.hi).toBe(1);
    expect(meanCI([0.3])).toMatchObject({ value: 0.3, lo: 0.3, hi: 0.3, sem: 0 });
    expect(() => meanCI([])).toThrow(/empty/);
    expect(() => meanCI([NaN])).toThrow(/NaN/);
  });
});
