import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { groupAdvantages, groupHasSignal } from "../../src/trainer/advantages.ts";
import { expectGradMatchesFd } from "./helpers/loss-fd.ts";
import { aggregateLoss, perTokenLoss, policyLoss, readSums, statsFromSums, type PolicyLossConfig } from "../../src/trainer/policy-loss.ts";
import { lrAt, lrLambda } from "../../src/trainer/schedule.ts";
import { rightPad, microBatchRows } from "../../src/trainer/batch.ts";

beforeAll(async () => {
  await tf.setBackend("cpu");
});

describe("groupAdvantages", () => {
  it("matches hand values with the unbiased std", () => {
    // [1, 0]: mean 0.5, unbiased std sqrt(0.5) = 0.70710678
    const [a] = groupAdvantages([[1, 0]], "group");
    expect(a[0]).toBeCloseTo(0.5 / (Math.SQRT1_2 + 1e-4), 12);
    expect(a[1]).toBeCloseTo(-0.5 / (Math.SQRT1_2 + 1e-4), 12);
    // [1, 2, 3, 6]: mean 3, squared deviations 4+1+0+9 = 14, std sqrt(14/3) = 2.1602469
    const [b] = groupAdvantages([[1, 2, 3, 6]], "group", 0);
    expect(b.map((x) => +x.toFixed(6))).toEqual([-0.92582, -0.46291, 0, 1.38873]);
    expect(groupAdvantages([[1, 2, 3, 6]], "none")[0]).toEqual([-2, -1, 0, 3]);
  });

  it("gives zeros for equal groups (also where the float mean is not exact) and for groups of one", () => {
    expect(groupAdvantages([[0.1, 0.1, 0.1], [1, 1], [5]], "group")).toEqual([[0, 0, 0], [0, 0], [0]]);
    expect(groupHasSignal([0.1, 0.1, 0.1])).toBe(false);
    expect(groupHasSignal([0, 1])).toBe(true);
  });

  it("rejects bad input with a clear message", () => {
    expect(() => groupAdvantages([[]], "group")).toThrow(/group 0 is empty/);
    expect(() => groupAdvantages([[1, NaN]], "group")).toThrow(/reward 0.1 is NaN/);
    expect(() => groupAdvantages([[1]], "std" as "group")).toThrow(/not one of/);
  });
});

// Hand example (see the comments): 2 sequences, 3 positions, ε = 0.2, ε_high = 0.28.
//  seq 0, A = +1, mask [0,1,1]: ρ = 1.5 → clipped to 1.28 (high clip), ℓ = −1.28; ρ = 0.5 → ℓ = −0.5
//  seq 1, A = −2, mask [0,1,0]: ρ = 0.5 → min(−1, −1.6) = −1.6 (low clip), ℓ = 1.6; position 2 is
//  masked and has a huge ratio that must not leak.
//  ref − logp: ln 2, 0, −ln 2 on the three counted tokens → k3 = 0.306853, 0, 0.193147 (sum 0.5).
const hand = () => {
  const logp = tf.tensor2d([
    [-1, -2, -1],
    [-3, -1, -1],
  ]);
  const delta = [
    [0, Math.log(1.5), Math.log(0.5)],
    [0, Math.log(0.5), 50],
  ]; // logp − old
  const oldLogp = tf.tensor2d(
    [
      [-1, -2, -1],
      [-3, -1, -1],
    ].map((r, n) => r.map((x, t) => x - delta[n][t])),
  );
  const dRef = [
    [0, Math.log(2), 0],
    [0, -Math.log(2), 3],
  ];
  const refLogp = tf.tensor2d(
    [
      [-1, -2, -1],
      [-3, -1, -1],
    ].map((r, n) => r.map((x, t) => x + dRef[n][t])),
  );
  return {
    logp,
    oldLogp,
    refLogp,
    advantages: tf.tensor1d([1, -2]),
    mask: tf.tensor2d([
      [0, 1, 1],
      [0, 1, 0],
    ]),
  };
};
const base: PolicyLossConfig = { epsilon: 0.2, epsilonHigh: 0.28, beta: 0, lossType: "grpo", maxNewTokens: 4 };

describe("policyLoss on hand values", () => {
  it("aggregates per loss type as hand-computed, with β = 0", async () => {
    const x = hand();
    const expected = { grpo: (-0.89 + 1.6) / 2, bnpo: (-1.78 + 1.6) / 3, dapo: (-1.78 + 1.6) / 3, dr_grpo: -0.18 / (2 * 4) } as const;
    for (const [lossType, want] of Object.entries(expected)) {
      const { loss, sums } = policyLoss({ ...x, refLogp: null }, { ...base, lossType: lossType as PolicyLossConfig["lossType"] });
      expect(loss.dataSync()[0]).toBeCloseTo(want, 5);
      const st = statsFromSums(await readSums(sums));
      expect(st.tokens).toBe(3);
      expect(st.clipFracLow).toBeCloseTo(1 / 3, 6);
      expect(st.clipFracHigh).toBeCloseTo(1 / 3, 6);
      expect(st.ratio).toBeCloseTo((1.5 + 0.5 + 0.5) / 3, 5);
      expect(st.kl).toBe(0);
      loss.dispose();
    }
    tf.dispose(Object.values(x));
  });

  it("adds β·k3 KL", async () => {
    const x = hand();
    const cfg = { ...base, beta: 0.1 };
    const g = policyLoss(x, cfg);
    // grpo: seq 0 (−1.78 + 0.1·0.306853)/2, seq 1 1.6 + 0.1·0.193147, mean of the two
    expect(g.loss.dataSync()[0]).toBeCloseTo(((-1.78 + 0.0306853) / 2 + (1.6 + 0.0193147)) / 2, 5);
    expect(statsFromSums(await readSums(g.sums)).kl).toBeCloseTo(0.5 / 3, 5);
    const b = policyLoss(x, { ...cfg, lossType: "bnpo" });
    expect(b.loss.dataSync()[0]).toBeCloseTo((-0.18 + 0.05) / 3, 5);
    await readSums(b.sums);
    tf.dispose([g.loss, b.loss, ...Object.values(x)]);
  });

  it("uses the whole batch's totals when given (micro-batch pieces add up)", async () => {
    const x = hand();
    const whole = policyLoss({ ...x, refLogp: null }, { ...base, lossType: "bnpo" });
    let sum = 0;
    for (const n of [0, 1]) {
      const pick = (t: tf.Tensor2D) => tf.slice(t, [n, 0], [1, 3]) as tf.Tensor2D;
      const part = {
        logp: pick(x.logp),
        oldLogp: pick(x.oldLogp),
        refLogp: null,
        advantages: tf.slice(x.advantages, [n], [1]) as tf.Tensor1D,
        mask: pick(x.mask),
      };
      const r = policyLoss(part, { ...base, lossType: "bnpo" }, { numSequences: 2, numTokens: 3 });
      sum += r.loss.dataSync()[0];
      await readSums(r.sums);
      tf.dispose([r.loss, part.logp, part.oldLogp, part.advantages, part.mask]);
    }
    expect(sum).toBeCloseTo(whole.loss.dataSync()[0], 6);
    await readSums(whole.sums);
    tf.dispose([whole.loss, ...Object.values(x)]);
  });

  it("rejects mismatched shapes", () => {
    const x = hand();
    expect(() => policyLoss({ ...x, advantages: tf.tensor1d([1]) }, base)).toThrow(/advantages has shape \[1\]; expected \[2\]/);
    expect(() => policyLoss({ ...x, mask: tf.zeros([2, 2]) as tf.Tensor2D }, base)).toThrow(/mask has shape \[2,2\]/);
    tf.dispose(Object.values(x));
  });
});

// float64 reference of the same loss, for finite differences.
function refLoss(logp: number[][], old: number[][], ref: number[][], A: number[], mask: number[][], cfg: PolicyLossConfig): number {
  const N = logp.length;
  let total = 0,
    tokens = 0;
  const perSeq: number[] = [];
  logp.forEach((row, n) => {
    let s = 0,
      c = 0;
    row.forEach((lp, t) => {
      if (!mask[n][t]) return;
      const r = Math.exp(lp - old[n][t]);
      const cl = Math.min(Math.max(r, 1 - cfg.epsilon), 1 + cfg.epsilonHigh);
      const d = ref[n][t] - lp;
      const l = -Math.min(r * A[n], cl * A[n]) + cfg.beta * (Math.exp(d) - d - 1);
      s += l;
      c += 1;
    });
    perSeq.push(s / Math.max(1, c));
    total += s;
    tokens += c;
  });
  if (cfg.lossType === "grpo") return perSeq.reduce((a, b) => a + b, 0) / N;
  if (cfg.lossType === "dr_grpo") return total / (N * cfg.maxNewTokens);
  return total / tokens;
}

describe("policyLoss gradients", () => {
  // Ratios spread over [0.6, 1.5] (some clipped, none on a clip edge), ref near logp.
  const logp = [
    [-0.5, -1.2, -0.3, -2.0],
    [-0.7, -0.1, -1.5, -0.9],
    [-1.1, -0.4, -0.8, -0.2],
  ];
  const old = [
    [-0.4, -1.0, -0.7, -1.9],
    [-0.7, -0.5, -1.2, -0.9],
    [-1.0, -0.6, -0.6, -0.3],
  ];
  const ref = [
    [-0.6, -1.1, -0.2, -2.2],
    [-0.9, -0.3, -1.4, -0.7],
    [-1.2, -0.5, -0.9, -0.1],
  ];
  const A = [1.2, -0.7, 0.4];
  const mask = [
    [0, 1, 1, 1],
    [0, 1, 1, 0],
    [0, 0, 1, 1],
  ];

  for (const lossType of ["grpo", "bnpo", "dr_grpo"] as const) {
    it(`match float64 finite differences (${lossType}, β = 0.05)`, () => {
      const cfg: PolicyLossConfig = { epsilon: 0.2, epsilonHigh: 0.28, beta: 0.05, lossType, maxNewTokens: 5 };
      expectGradMatchesFd({ logp, old, ref, A, mask }, cfg, (lp) => refLoss(lp, old, ref, A, mask, cfg));
    });
  }

  it("with oldLogp = logp the ratio is 1 and the gradient is −A·mask/denominator", async () => {
    const N = 3,
      counts = mask.map((r) => r.reduce((a, b) => a + b, 0)),
      total = counts.reduce((a, b) => a + b, 0);
    for (const lossType of ["grpo", "bnpo", "dr_grpo"] as const) {
      const cfg: PolicyLossConfig = { epsilon: 0.2, epsilonHigh: 0.2, beta: 0.3, lossType, maxNewTokens: 6 };
      const x = tf.tensor2d(logp),
        old = tf.tensor2d(logp),
        msk = tf.tensor2d(mask),
        adv = tf.tensor1d(A);
      let sums: ReturnType<typeof policyLoss>["sums"] | null = null;
      const g = tf.grad((lp: tf.Tensor) => {
        // ref = logp too: the KL term and its gradient vanish
        const r = policyLoss({ logp: lp as tf.Tensor2D, oldLogp: old, refLogp: old, advantages: adv, mask: msk }, cfg);
        Object.values(r.sums).forEach((t) => tf.keep(t));
        sums = r.sums;
        return r.loss;
      })(x);
      expect(statsFromSums(await readSums(sums!)).ratio).toBeCloseTo(1, 6);
      const got = g.arraySync() as number[][];
      mask.forEach((row, n) =>
        row.forEach((m, t) => {
          const denom = lossType === "grpo" ? counts[n] * N : lossType === "bnpo" ? total : N * 6;
          expect(got[n][t]).toBeCloseTo((-A[n] * m) / denom, 6);
        }),
      );
      tf.dispose([g, x, old, msk, adv]);
    }
  });
});

describe("learning-rate schedules", () => {
  it("match transformers' get_*_schedule_with_warmup", () => {
    const c = { warmupSteps: 2, totalSteps: 10 };
    expect([0, 1, 2, 6, 10, 12].map((s) => lrLambda(s, { ...c, type: "linear" }))).toEqual([0, 0.5, 1, 0.5, 0, 0]);
    const cos = [0, 1, 2, 4, 6, 10].map((s) => lrLambda(s, { ...c, type: "cosine" }));
    [0, 0.5, 1, 0.8535533905932737, 0.5, 0].forEach((v, i) => expect(cos[i]).toBeCloseTo(v, 12));
    expect([0, 1, 3, 4, 100].map((s) => lrLambda(s, { type: "constant", warmupSteps: 4, totalSteps: 0 }))).toEqual([0, 0.25, 0.75, 1, 1]);
    expect(lrAt(0, { type: "constant", lr: 3e-4, warmupSteps: 0, totalSteps: 5 })).toBe(3e-4);
    expect(lrAt(6, { type: "linear", lr: 2e-3, warmupSteps: 2, totalSteps: 10 })).toBeCloseTo(1e-3, 15);
  });
  it("rejects bad settings", () => {
    expect(() => lrLambda(0, { type: "step" as "linear", warmupSteps: 0, totalSteps: 1 })).toThrow(/not one of constant, linear, cosine/);
    expect(() => lrLambda(-1, { type: "linear", warmupSteps: 0, totalSteps: 1 })).toThrow(/step -1/);
    expect(() => lrLambda(0, { type: "cosine", warmupSteps: 0, totalSteps: 0 })).toThrow(/totalSteps 0/);
  });
});

describe("batch padding", () => {
  it("right-pads ids and masks", () => {
    const b = rightPad([[5, 6, 7], [8]], [[0, 1, 1], [1]], 0);
    expect(b).toEqual({
      ids: [
        [5, 6, 7],
        [8, 0, 0],
      ],
      attentionMask: [
        [1, 1, 1],
        [1, 0, 0],
      ],
      lossMask: [
        [0, 1, 1],
        [1, 0, 0],
      ],
    });
    // micro-batches as GRPO forms them: index groups, each right-padded to its own longest row
    const seqs = [[1], [2, 3], [4]],
      masks = [[1], [1, 1], [0]];
    const padded = (groups: number[][]) =>
      groups.map(
        (g) =>
          rightPad(
            g.map((r) => seqs[r]),
            g.map((r) => masks[r]),
            9,
          ).ids,
      );
    expect(
      padded(
        microBatchRows(
          seqs.map((q) => q.length),
          2,
        ),
      ),
    ).toEqual([
      [
        [1, 9],
        [2, 3],
      ],
      [[4]],
    ]);
    expect(() => rightPad([[1, 2]], [[1]], 0)).toThrow(/sequence 0 has 2 tokens but its loss mask has 1/);
    expect(() => rightPad([[1, 2]], [[1, 1]], 0, 1)).toThrow(/length 1 is shorter/);
  });

  it("splits a micro-batch into equal parts where its longest row allows fewer rows", () => {
    const lengths = [3, 9, 4, 4, 2, 2, 2, 2, 5];
    expect(microBatchRows(lengths, 4)).toEqual([[0, 1, 2, 3], [4, 5, 6, 7], [8]]);
    // rows of ≥ 9 tokens: 3 at a time, so 4 rows go as 2 + 2 (not 3 + 1); shorter chunks stay whole
    const cap = (len: number) => (len >= 9 ? 3 : len >= 5 ? 1 : 8);
    expect(microBatchRows(lengths, 4, cap)).toEqual([[0, 1], [2, 3], [4, 5, 6, 7], [8]]);
    expect(microBatchRows(lengths, 9, cap)).toEqual([
      [0, 1, 2],
      [3, 4, 5],
      [6, 7, 8],
    ]);
    expect(microBatchRows([7, 7, 7], 3, () => 0)).toEqual([[0], [1], [2]]); // at least one row
    // longest first (ties in index order): each micro-batch pads to a length close to its rows'
    expect(microBatchRows(lengths, 4, undefined, true)).toEqual([[1, 8, 2, 3], [0, 4, 5, 6], [7]]);
    expect(microBatchRows(lengths, 4, cap, true)).toEqual([[1, 8], [2, 3], [0, 4, 5, 6], [7]]);
    expect(microBatchRows([7, 7], 2, () => Infinity)).toEqual([[0, 1]]);
    // with groups (GRPO: rows of one prompt): groups together, the longest group first, longest first within
    const prompt = [0, 1, 0, 1, 2, 2, 2, 2, 0];
    expect(microBatchRows(lengths, 4, undefined, true, prompt)).toEqual([[1, 3, 8, 2], [0, 4, 5, 6], [7]]);
    const seqs = [[1], [2, 3], [4]],
      masks = [[1], [1, 1], [0]];
    const groups = microBatchRows(
      seqs.map((q) => q.length),
      3,
      (len) => (len > 1 ? 1 : 3),
    );
    expect(
      groups.map(
        (g) =>
          rightPad(
            g.map((r) => seqs[r]),
            g.map((r) => masks[r]),
            9,
          ).ids,
      ),
    ).toEqual([[[1]], [[2, 3]], [[4]]]);
  });
});
