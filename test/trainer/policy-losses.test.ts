/** Every entry of the policy-loss table on hand-computed numbers (masked tokens, ties at the clip
 *  bounds, all-zero advantages), float64 finite differences for gspo and minirl, the log-ratio clamp,
 *  and one GRPO step per loss type on a stand-in model.
 *  Over 400 lines: one table of losses, each row checked the same ways side by side. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import {
  aggregateLoss,
  defaultEpsilonHigh,
  importanceLevel,
  LOSS_TYPES,
  perTokenLoss,
  policyLoss,
  readSums,
  statsFromSums,
  type LossType,
  type PolicyLossConfig,
  type PolicyLossInputs,
} from "../../src/trainer/policy-loss.ts";
import { grpoStep, type GrpoConfig, type GrpoRollout } from "../../src/trainer/grpo.ts";
import { AdamW } from "../../src/trainer/optimizer.ts";
import { BigramLM } from "./helpers/bigram-lm.ts";
import { expectGradMatchesFd } from "./helpers/loss-fd.ts";

beforeAll(async () => {
  await tf.setBackend("cpu");
});

const base: PolicyLossConfig = { epsilon: 0.2, epsilonHigh: 0.28, beta: 0, lossType: "grpo", maxNewTokens: 4 };

// The hand example of math.test.ts: 2 sequences, 3 positions, ε = 0.2, ε_high = 0.28.
//  seq 0, A = +1, mask [0,1,1], logp [−1, −2, −1]: ρ = 1.5, 0.5
//  seq 1, A = −2, mask [0,1,0], logp [−3, −1, −1]: ρ = 0.5; position 2 is masked, its ρ = e^50 must not leak.
const LOGP = [
  [-1, -2, -1],
  [-3, -1, -1],
];
const hand = (
  delta = [
    [0, Math.log(1.5), Math.log(0.5)],
    [0, Math.log(0.5), 50],
  ],
  A = [1, -2],
): PolicyLossInputs => ({
  logp: tf.tensor2d(LOGP),
  oldLogp: tf.tensor2d(LOGP.map((r, n) => r.map((x, t) => x - delta[n][t]))),
  refLogp: null,
  advantages: tf.tensor1d(A),
  mask: tf.tensor2d([
    [0, 1, 1],
    [0, 1, 0],
  ]),
});

/** Loss value and token stats, inputs disposed. */
async function run(x: PolicyLossInputs, cfg: PolicyLossConfig) {
  const { loss, sums } = policyLoss(x, cfg);
  const value = loss.dataSync()[0];
  const st = statsFromSums(await readSums(sums));
  tf.dispose([loss, ...Object.values(x).filter((t): t is tf.Tensor => t !== null)]);
  return { value, ...st };
}

// Per entry: loss, and clipped (or dropped) tokens low / high, out of 3 counted tokens.
//  clipped: seq 0 → −1.28 (ρ 1.5 clipped high), −0.5; seq 1 → −min(−1, −1.6) = 1.6 (clipped low)
//  gspo: seq 0 s = exp((ln 1.5 + ln 0.5)/2) = √0.75 = 0.8660254, inside the window: ℓ = −0.8660254 on
//        both tokens; seq 1 s = 0.5 → 1.6 (clipped low). mean per sequence, then over sequences.
//  minirl: window [0.8, 1.28]; seq 0: ρ 1.5 with A > 0 is dropped, ρ 0.5 with A > 0 kept:
//        −0.5·1·(−1) = 0.5; seq 1: ρ 0.5 with A < 0 is dropped. Σ per sequence, ÷ 2 sequences.
const HAND: Record<LossType, { loss: number; low: number; high: number; ratio: number }> = {
  grpo: { loss: (-0.89 + 1.6) / 2, low: 1, high: 1, ratio: 2.5 },
  bnpo: { loss: (-1.78 + 1.6) / 3, low: 1, high: 1, ratio: 2.5 },
  dapo: { loss: (-1.78 + 1.6) / 3, low: 1, high: 1, ratio: 2.5 },
  dr_grpo: { loss: -0.18 / (2 * 4), low: 1, high: 1, ratio: 2.5 },
  gspo: { loss: (-Math.sqrt(0.75) + 1.6) / 2, low: 1, high: 0, ratio: 2 * Math.sqrt(0.75) + 0.5 },
  minirl: { loss: 0.5 / 2, low: 1, high: 1, ratio: 2.5 },
};

describe("the policy-loss table on hand values", () => {
  it("has a hand-computed case for every entry", async () => {
    expect(Object.keys(HAND).sort()).toEqual([...LOSS_TYPES].sort());
  });

  for (const lossType of LOSS_TYPES) {
    it(`${lossType}: loss and clip counts; masked tokens leak nothing`, async () => {
      const cfg = { ...base, lossType };
      const r = await run(hand(), cfg);
      expect(r.value).toBeCloseTo(HAND[lossType].loss, 5);
      expect(r.tokens).toBe(3);
      expect(r.clipFracLow * 3).toBeCloseTo(HAND[lossType].low, 6);
      expect(r.clipFracHigh * 3).toBeCloseTo(HAND[lossType].high, 6);
      expect(r.ratio * 3).toBeCloseTo(HAND[lossType].ratio, 5);
      // Whatever sits at the masked position (here ρ = e^−50 instead of e^50) changes nothing.
      const other = await run(
        hand([
          [0, Math.log(1.5), Math.log(0.5)],
          [7, Math.log(0.5), -50],
        ]),
        cfg,
      );
      expect(other.value).toBe(r.value);
    });

    it(`${lossType}: all-zero advantages give loss 0 and gradient 0`, async () => {
      const x = hand(undefined, [0, 0]);
      const g = tf.grad((lp: tf.Tensor) => {
        const out = policyLoss({ ...x, logp: lp as tf.Tensor2D }, { ...base, lossType });
        tf.dispose(Object.values(out.sums));
        return out.loss;
      })(x.logp);
      expect(Array.from(g.dataSync()).every((v) => v === 0)).toBe(true);
      expect((await run(x, { ...base, lossType })).value === 0).toBe(true); // −0 too
      g.dispose();
    });
  }

  it("importance sampling level: gspo always per sequence, the others as asked", async () => {
    expect(importanceLevel({ lossType: "gspo" })).toBe("sequence");
    expect(importanceLevel({ lossType: "gspo", importanceSamplingLevel: "token" })).toBe("sequence");
    expect(importanceLevel({ lossType: "grpo" })).toBe("token");
    expect(importanceLevel({ lossType: "dr_grpo", importanceSamplingLevel: "sequence" })).toBe("sequence");
    // grpo at sequence level is gspo
    expect((await run(hand(), { ...base, importanceSamplingLevel: "sequence" })).value).toBeCloseTo(HAND.gspo.loss, 6);
    expect(defaultEpsilonHigh("minirl", 0.2)).toBeCloseTo(0.3, 12); // AgentRL's [0.8, 1.3]
    expect(defaultEpsilonHigh("grpo", 0.2)).toBe(0.2);
  });
});

describe("ties at the clip bounds", () => {
  // logp 0 and old ∓ln 2 give ρ = 2 and 0.5 exactly in f32; with ε = 0.5, ε_high = 1 both sit on a bound.
  const tie = (): PolicyLossInputs => ({
    logp: tf.tensor2d([
      [0, 0],
      [0, 0],
    ]),
    oldLogp: tf.tensor2d([
      [0, -Math.log(2)],
      [0, Math.log(2)],
    ]),
    refLogp: null,
    advantages: tf.tensor1d([1, -1]),
    mask: tf.tensor2d([
      [0, 1],
      [0, 1],
    ]),
  });
  const cfg = (lossType: LossType): PolicyLossConfig => ({ epsilon: 0.5, epsilonHigh: 1, beta: 0, lossType, maxNewTokens: 4 });
  const grad = (x: PolicyLossInputs, c: PolicyLossConfig) => {
    const g = tf.grad((lp: tf.Tensor) => {
      const out = policyLoss({ ...x, logp: lp as tf.Tensor2D }, c);
      tf.dispose(Object.values(out.sums));
      return out.loss;
    })(x.logp);
    const v = g.arraySync() as number[][];
    g.dispose();
    return v;
  };

  it("count nothing as clipped and keep the unclipped gradient (clipped losses), keep the token (minirl)", async () => {
    const r = await run(tie(), cfg("grpo"));
    expect(r.ratio * 2).toBe(2.5); // exactly 2 and 0.5: a real tie
    expect(r.clipFrac).toBe(0);
    expect(r.value).toBeCloseTo((-2 + 0.5) / 2, 6); // −min(2·1, 2·1) and −min(−0.5, −0.5)
    // ∂/∂logp of −ρ·A is −ρ·A: −2 and +0.5, ÷ 2 sequences
    expect(grad(tie(), cfg("grpo"))).toEqual([
      [0, -1],
      [0, 0.25],
    ]);
    // minirl: on the bound the token stays; −sg(ρ)·A·logp has gradient −ρ·A (÷ 2 sequences), value 0 at logp 0
    const m = await run(tie(), cfg("minirl"));
    expect(m.clipFrac).toBe(0);
    expect(grad(tie(), cfg("minirl"))).toEqual([
      [0, -1],
      [0, 0.25],
    ]);
  });

  it("just past the bounds: clipped losses have zero gradient there, minirl drops the tokens", async () => {
    const past = { ...cfg("grpo"), epsilon: 0.49, epsilonHigh: 0.99 };
    for (const lossType of ["grpo", "minirl"] as const) {
      const c = { ...past, lossType };
      expect((await run(tie(), c)).clipFrac).toBe(1);
      expect(grad(tie(), c)).toEqual([
        [0, 0],
        [0, 0],
      ]);
    }
  });
});

// float64 references for finite differences.
function refGspo(logp: number[][], old: number[][], ref: number[][], A: number[], mask: number[][], cfg: PolicyLossConfig): number {
  let total = 0;
  logp.forEach((row, n) => {
    const on = row.map((_, t) => mask[n][t] === 1);
    const count = on.filter(Boolean).length;
    const s = Math.exp(row.reduce((a, lp, t) => a + (on[t] ? lp - old[n][t] : 0), 0) / Math.max(1, count));
    const cl = Math.min(Math.max(s, 1 - cfg.epsilon), 1 + cfg.epsilonHigh);
    let seq = 0;
    row.forEach((lp, t) => {
      if (!on[t]) return;
      const d = ref[n][t] - lp;
      seq += -Math.min(s * A[n], cl * A[n]) + cfg.beta * (Math.exp(d) - d - 1);
    });
    total += seq / Math.max(1, count);
  });
  return total / logp.length;
}

/** MINIRL with its importance weight read at `at` (the detached point) and the log-prob term at `logp`. */
function refMinirl(
  logp: number[][],
  at: number[][],
  old: number[][],
  ref: number[][],
  A: number[],
  mask: number[][],
  cfg: PolicyLossConfig,
): number {
  let total = 0;
  logp.forEach((row, n) =>
    row.forEach((lp, t) => {
      if (!mask[n][t]) return;
      const r = Math.exp(at[n][t] - old[n][t]);
      const out = (r > 1 + cfg.epsilonHigh && A[n] > 0) || (r < 1 - cfg.epsilon && A[n] < 0);
      const d = ref[n][t] - lp;
      total += (out ? 0 : -r * A[n] * lp) + cfg.beta * (Math.exp(d) - d - 1);
    }),
  );
  return total / logp.length;
}

describe("gradients against float64 finite differences", () => {
  // Sequence ratios inside the window; token ratios over [0.6, 1.5], two of them out of minirl's window.
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

  for (const lossType of ["gspo", "minirl"] as const) {
    it(`${lossType}, β = 0.05`, async () => {
      const cfg: PolicyLossConfig = { epsilon: 0.2, epsilonHigh: 0.3, beta: 0.05, lossType, maxNewTokens: 5 };
      const f = (lp: number[][]) =>
        lossType === "gspo" ? refGspo(lp, old, ref, A, mask, cfg) : refMinirl(lp, logp, old, ref, A, mask, cfg);
      expect(expectGradMatchesFd({ logp, old, ref, A, mask }, cfg, f)).toBeGreaterThanOrEqual(5); // not vacuous
    });
  }
});

describe("log-ratio clamp", () => {
  /** The loss as computed before the clamp (token level, clipped term + k3), for the bit-for-bit check. */
  function unclamped(x: PolicyLossInputs, cfg: PolicyLossConfig): tf.Tensor2D {
    return tf.tidy(() => {
      const on = tf.greater(x.mask, 0);
      const zeros = tf.zerosLike(x.logp);
      const ratio = tf.exp(tf.where(on, tf.sub(x.logp, x.oldLogp), zeros));
      const adv = tf.expandDims(x.advantages, 1);
      let loss = tf.neg(tf.minimum(tf.mul(ratio, adv), tf.mul(tf.clipByValue(ratio, 1 - cfg.epsilon, 1 + cfg.epsilonHigh), adv)));
      const d = tf.where(on, tf.sub(x.refLogp!, x.logp), zeros);
      loss = tf.add(loss, tf.mul(tf.sub(tf.sub(tf.exp(d), d), 1), cfg.beta));
      return tf.where(on, loss, zeros) as tf.Tensor2D;
    });
  }

  it("leaves in-range values bit for bit as they were", async () => {
    const cfg = { ...base, beta: 0.04 };
    const rnd = (s: number) =>
      Array.from({ length: 4 }, (_, n) => Array.from({ length: 6 }, (_, t) => -3 * Math.abs(Math.sin(s + 7 * n + t))));
    const x: PolicyLossInputs = {
      logp: tf.tensor2d(rnd(1)),
      oldLogp: tf.tensor2d(rnd(2)),
      refLogp: tf.tensor2d(rnd(3)),
      advantages: tf.tensor1d([0.7, -1.3, 0, 2]),
      mask: tf.tensor2d(rnd(4).map((r) => r.map((v) => (v < -1 ? 1 : 0)))),
    };
    const now = perTokenLoss(x, cfg);
    const was = unclamped(x, cfg);
    expect(Array.from(now.loss.dataSync())).toEqual(Array.from(was.dataSync()));
    tf.dispose([was, now.loss, now.ratio, now.kl!, now.low, now.high, ...Object.values(x)]);
  });

  it("keeps an outlier token finite (it used to overflow to Inf and stop the run)", async () => {
    // logp − old = 120 and ref − logp = 95: exp overflows f32 (max e^88.7) without the clamp.
    const x = (): PolicyLossInputs => ({
      logp: tf.tensor2d([[-1, -1]]),
      oldLogp: tf.tensor2d([[-1, -121]]),
      refLogp: tf.tensor2d([[-1, 94]]),
      advantages: tf.tensor1d([-1]),
      mask: tf.tensor2d([[1, 1]]),
    });
    const cfg = { ...base, beta: 0.04 };
    const old = unclamped(x(), cfg);
    expect(Number.isFinite(old.dataSync()[1])).toBe(false);
    old.dispose();
    for (const lossType of LOSS_TYPES) {
      const inp = x();
      const g = tf.grad((lp: tf.Tensor) => {
        const out = policyLoss({ ...inp, logp: lp as tf.Tensor2D }, { ...cfg, lossType });
        tf.dispose(Object.values(out.sums));
        return out.loss;
      })(inp.logp);
      expect(Array.from(g.dataSync()).every(Number.isFinite), lossType).toBe(true);
      const r = await run(inp, { ...cfg, lossType });
      expect(Number.isFinite(r.value), lossType).toBe(true);
      g.dispose();
    }
  });

  it("lets a GRPO step through an outlier token that used to stop it", async () => {
    // The adapter moved token 3 after 2 by 100 nats away from the base: ref − logp ≈ 100 there.
    const V = 6;
    const delta = Array.from({ length: V }, () => new Array<number>(V).fill(0));
    delta[2][3] = -100;
    const m = new BigramLM(V, undefined, delta);
    const opt = new AdamW(m.trainableVariables(), { lr: 0.01, weightDecay: 0 });
    const batch: GrpoRollout[] = [
      { ids: [0, 2, 3, 1], lossMask: [0, 1, 1, 1], group: 0, advantage: 1 },
      { ids: [0, 1, 4], lossMask: [0, 1, 1], group: 0, advantage: -1 },
    ];
    const step: GrpoConfig = { ...base, beta: 0.04, numIterations: 1, maxGradNorm: 1, lr: 0.01, microBatchSize: 2 };
    const s = await grpoStep(m, opt, batch, step);
    expect(Number.isFinite(s.loss)).toBe(true);
    expect(s.kl).toBeGreaterThan(1e6); // e^20-ish on one token: large, finite
    expect(opt.step).toBe(1);
    opt.dispose();
    m.dispose();
  });
});

describe("one GRPO step per loss type on a stand-in model", () => {
  const V = 8;
  const init = () => Array.from({ length: V }, (_, i) => Array.from({ length: V }, (_, j) => 0.3 * Math.cos(i * 5 + j * 2)));
  const rollouts = (): GrpoRollout[] => [
    { ids: [0, 1, 2, 3], lossMask: [0, 1, 1, 1], group: 0, advantage: 1 },
    { ids: [0, 4, 5], lossMask: [0, 1, 1], group: 0, advantage: -1 },
    { ids: [6, 7, 1], lossMask: [0, 1, 1], group: 1, advantage: 0.5, truncated: true },
    { ids: [6, 2], lossMask: [0, 1], group: 1, advantage: -0.5 },
  ];
  const step = (lossType: LossType): GrpoConfig => ({
    epsilon: 0.2,
    epsilonHigh: defaultEpsilonHigh(lossType, 0.2),
    beta: 0.04,
    lossType,
    maxNewTokens: 4,
    numIterations: 2,
    maxGradNorm: 1,
    lr: 0.05,
    microBatchSize: 2,
  });

  for (const lossType of LOSS_TYPES) {
    it(`${lossType} changes the adapter and nothing else, without leaking tensors`, async () => {
      const m = new BigramLM(V, init(), init());
      const opt = new AdamW(m.trainableVariables(), { lr: 0.05, weightDecay: 0 });
      const baseBefore = Array.from(m.base.dataSync());
      const deltaBefore = Array.from(m.delta.dataSync());
      const n0 = tf.memory().numTensors;
      const s = await grpoStep(m, opt, rollouts(), step(lossType));
      expect(tf.memory().numTensors).toBe(n0);
      expect(Number.isFinite(s.loss)).toBe(true);
      expect(s.tokens).toBe(8);
      expect(s.gradNorm).toBeGreaterThan(0);
      expect(Array.from(m.base.dataSync())).toEqual(baseBefore);
      const moved = Array.from(m.delta.dataSync()).filter((v, i) => v !== deltaBefore[i]).length;
      expect(moved).toBeGreaterThan(0);
      expect(opt.step).toBe(2);
      opt.dispose();
      m.dispose();
    });
  }

  it("--mask_truncated_completions: a truncated rollout trains like one with an all-zero mask", async () => {
    const go = async (batch: GrpoRollout[], mask: boolean) => {
      const m = new BigramLM(V, init(), init());
      const opt = new AdamW(m.trainableVariables(), { lr: 0.05, weightDecay: 0 });
      const s = await grpoStep(m, opt, batch, { ...step("grpo"), maskTruncatedCompletions: mask });
      const w = Array.from(m.delta.dataSync());
      opt.dispose();
      m.dispose();
      return { s, w };
    };
    const zeroed = rollouts().map((r) => (r.truncated ? { ...r, lossMask: r.lossMask.map(() => 0), truncated: false } : r));
    const masked = await go(rollouts(), true);
    const manual = await go(zeroed, false);
    const trained = await go(rollouts(), false);
    expect(masked.w).toEqual(manual.w);
    expect(masked.s.loss).toBe(manual.s.loss);
    expect(masked.s.tokens).toBe(6);
    expect(masked.s.maskedTruncated).toBe(1);
    expect(trained.w).not.toEqual(masked.w);
    expect(trained.s.tokens).toBe(8);
  });
});
