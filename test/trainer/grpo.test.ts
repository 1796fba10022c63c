import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { grpoStep, type GrpoConfig, type GrpoRollout } from "../../src/trainer/grpo.ts";
import { groupAdvantages } from "../../src/trainer/advantages.ts";
import { AdamW } from "../../src/trainer/optimizer.ts";
import { NonFiniteError } from "../../src/util/errors.ts";
import { BigramLM } from "./helpers/bigram-lm.ts";

beforeAll(async () => {
  await tf.setBackend("cpu");
});

const V = 8;
const cfg: GrpoConfig = {
  beta: 0,
  epsilon: 0.2,
  epsilonHigh: 0.28,
  lossType: "grpo",
  maxNewTokens: 6,
  numIterations: 1,
  maxGradNorm: 1,
  lr: 0.05,
  microBatchSize: 8,
};
const init = () => Array.from({ length: V }, (_, i) => Array.from({ length: V }, (_, j) => 0.3 * Math.cos(i * 5 + j * 2)));

/** Two questions × three rollouts: prompt, completion (mask 1), a tool result (mask 0), more completion. */
function batch(rewards: number[][]): GrpoRollout[] {
  const shapes: { ids: number[]; lossMask: number[] }[][] = [
    [
      { ids: [0, 1, 2, 3, 7], lossMask: [0, 1, 1, 0, 1] },
      { ids: [0, 1, 4, 5], lossMask: [0, 1, 1, 1] },
      { ids: [0, 6, 6, 2, 3, 4, 5], lossMask: [0, 1, 1, 1, 1, 1, 1] },
    ],
    [
      { ids: [7, 3], lossMask: [0, 1] },
      { ids: [7, 5, 4, 3], lossMask: [0, 0, 1, 1] },
      { ids: [7, 2, 1], lossMask: [0, 1, 1] },
    ],
  ];
  const adv = groupAdvantages(rewards, "group");
  return shapes.flatMap((g, q) => g.map((r, i) => ({ ...r, group: q, advantage: adv[q][i] })));
}

describe("grpoStep on a stand-in model", () => {
  it("moves positive-advantage rollouts up and negative ones down, without leaking tensors", async () => {
    // distinct tokens per rollout so one rollout's update cannot be confused with another's
    const m = new BigramLM(V, undefined, init());
    const opt = new AdamW(m.trainableVariables(), { lr: 0.05, weightDecay: 0 });
    const rollouts: GrpoRollout[] = [
      { ids: [0, 1, 2], lossMask: [0, 1, 1], group: 0, advantage: 0 },
      { ids: [0, 3, 4], lossMask: [0, 1, 1], group: 0, advantage: 0 },
      { ids: [5, 6], lossMask: [0, 1], group: 1, advantage: 0 },
      { ids: [5, 7], lossMask: [0, 1], group: 1, advantage: 0 },
    ];
    const adv = groupAdvantages(
      [
        [1, 0],
        [0, 1],
      ],
      "group",
    );
    [adv[0][0], adv[0][1], adv[1][0], adv[1][1]].forEach((a, i) => (rollouts[i].advantage = a));
    const before = rollouts.map((r) => m.seqLogprob(r.ids, r.lossMask));
    const n0 = tf.memory().numTensors;
    const s = await grpoStep(m, opt, rollouts, cfg);
    expect(tf.memory().numTensors).toBe(n0);
    const after = rollouts.map((r) => m.seqLogprob(r.ids, r.lossMask));
    expect(after[0]).toBeGreaterThan(before[0]);
    expect(after[1]).toBeLessThan(before[1]);
    expect(after[2]).toBeLessThan(before[2]);
    expect(after[3]).toBeGreaterThan(before[3]);
    // one iteration: ρ = 1 exactly, nothing clipped; entropy of rows 0 and 5 near ln 8 for a near-flat table
    expect(s.ratio).toBeCloseTo(1, 6);
    expect(s.clipFrac).toBe(0);
    expect(s.tokens).toBe(6);
    expect(s.entropy).toBeGreaterThan(0.9 * Math.log(V));
    expect(s.entropy).toBeLessThan(Math.log(V) + 1e-6);
    expect(s.gradNorm).toBeGreaterThan(0);
    // ρ = 1 and β = 0: loss = −mean over sequences of A (per-token mean of −A is −A), and Σ A = 0
    expect(s.loss).toBeCloseTo(0, 6);
    opt.dispose();
    m.dispose();
  });

  it("with β > 0 the KL is zero at the start and positive after an update", async () => {
    const m = new BigramLM(V, init()); // adapter (delta) starts at zero: policy = reference
    const opt = new AdamW(m.trainableVariables(), { lr: 0.1, weightDecay: 0 });
    const c = { ...cfg, beta: 0.04 };
    const n0 = tf.memory().numTensors;
    const first = await grpoStep(
      m,
      opt,
      batch([
        [1, 0, 0],
        [0, 1, 1],
      ]),
      c,
    );
    expect(first.kl).toBe(0);
    const second = await grpoStep(
      m,
      opt,
      batch([
        [1, 0, 0],
        [0, 1, 1],
      ]),
      c,
    );
    expect(second.kl).toBeGreaterThan(0);
    expect(tf.memory().numTensors).toBe(n0);
    opt.dispose();
    m.dispose();
  });

  for (const lossType of ["grpo", "bnpo", "dr_grpo"] as const) {
    it(`micro-batching gives the un-micro-batched loss, gradient norm and update (${lossType}, β > 0, 2 iterations)`, async () => {
      const a = new BigramLM(V, init(), init()),
        b = new BigramLM(V, init(), init());
      const oa = new AdamW(a.trainableVariables(), { lr: 0.05 }),
        ob = new AdamW(b.trainableVariables(), { lr: 0.05 });
      const c = { ...cfg, lossType, beta: 0.05, numIterations: 2, epsilon: 0.01, epsilonHigh: 0.01 };
      const rollouts = batch([
        [1, 0, 0.5],
        [0, 2, 1],
      ]);
      const sa = await grpoStep(a, oa, rollouts, { ...c, microBatchSize: 6 });
      const sb = await grpoStep(b, ob, rollouts, { ...c, microBatchSize: 2 });
      for (const k of ["loss", "gradNorm", "kl", "ratio", "entropy", "clipFrac", "tokens"] as const) expect(sb[k]).toBeCloseTo(sa[k], 5);
      // the second iteration ran on a moved policy: ratios left 1 and, with ε = 0.01, some were clipped
      expect(sa.clipFrac).toBeGreaterThan(0);
      expect(oa.step).toBe(2);
      const wa = a.delta.dataSync(),
        wb = b.delta.dataSync();
      wa.forEach((x, i) => expect(wb[i]).toBeCloseTo(x, 5));
      [oa, ob, a, b].forEach((x) => x.dispose());
    });
  }

  it("splits micro-batches where the model's trainRowsFor allows fewer rows, with the same update", async () => {
    const a = new BigramLM(V, init(), init()),
      b = new BigramLM(V, init(), init());
    const oa = new AdamW(a.trainableVariables(), { lr: 0.05 }),
      ob = new AdamW(b.trainableVariables(), { lr: 0.05 });
    const rows: number[] = [];
    const seen = b.tokenLogprobs.bind(b);
    b.tokenLogprobs = (ids, mask, opts) => (rows.push(ids.length), seen(ids, mask, opts));
    (b as BigramLM & { trainRowsFor(length: number): number }).trainRowsFor = (length) => (length >= 5 ? 2 : 8);
    const c = { ...cfg, beta: 0.05, microBatchSize: 6 };
    const rollouts = batch([
      [1, 0, 0.2],
      [0, 2, 1.5],
    ]); // lengths 5, 4, 7, 2, 4, 3: one chunk of 6, longest 7
    expect(rollouts.every((r) => r.advantage !== 0)).toBe(true); // none skipped
    const sa = await grpoStep(a, oa, rollouts, c);
    const sb = await grpoStep(b, ob, rollouts, c);
    expect(rows).toEqual([2, 2, 2, 2, 2, 2]); // the reference pass, then the training pass, in 3 parts each
    for (const k of ["loss", "gradNorm", "kl", "ratio", "entropy", "tokens"] as const) expect(sb[k]).toBeCloseTo(sa[k], 5);
    const wa = a.delta.dataSync(),
      wb = b.delta.dataSync();
    wa.forEach((x, i) => expect(wb[i]).toBeCloseTo(x, 5));
    [oa, ob, a, b].forEach((x) => x.dispose());
  });

  it('"auto" sizes micro-batches by the model\'s autoTrainRows per length (the whole batch without it), with the same update', async () => {
    const a = new BigramLM(V, init(), init()),
      b = new BigramLM(V, init(), init()),
      c = new BigramLM(V, init(), init());
    const [oa, ob, oc] = [a, b, c].map((m) => new AdamW(m.trainableVariables(), { lr: 0.05 }));
    const rows: number[] = [];
    const seen = b.tokenLogprobs.bind(b);
    b.tokenLogprobs = (ids, mask, opts) => (rows.push(ids.length), seen(ids, mask, opts));
    (b as BigramLM & { autoTrainRows(length: number): number }).autoTrainRows = (length) => (length >= 5 ? 2 : 8);
    const rollouts = batch([
      [1, 0, 0.2],
      [0, 2, 1.5],
    ]); // lengths 5, 4, 7, 2, 4, 3
    const sa = await grpoStep(a, oa, rollouts, { ...cfg, microBatchSize: 1 });
    const sb = await grpoStep(b, ob, rollouts, { ...cfg, microBatchSize: "auto" });
    const sc = await grpoStep(c, oc, rollouts, { ...cfg, microBatchSize: "auto" });
    expect(rows).toEqual([2, 2, 2]); // all six are one chunk, its longest row 7 tokens: 2 rows at a time
    expect(sa.microBatch).toEqual({ count: 6, rows: 1, outOfMemory: 0 });
    expect(sb.microBatch).toEqual({ count: 3, rows: 2, outOfMemory: 0 });
    expect(sc.microBatch).toEqual({ count: 1, rows: 6, outOfMemory: 0 });
    for (const s of [sb, sc])
      for (const k of ["loss", "gradNorm", "ratio", "entropy", "tokens"] as const) expect(s[k]).toBeCloseTo(sa[k], 5);
    const wa = a.delta.dataSync();
    for (const m of [b, c]) m.delta.dataSync().forEach((x, i) => expect(x).toBeCloseTo(wa[i], 5));
    [oa, ob, oc, a, b, c].forEach((x) => x.dispose());
  });

  it("skips zero-advantage rollouts yet, with β = 0, equals the loss that keeps them", async () => {
    const a = new BigramLM(V, undefined, init()),
      b = new BigramLM(V, undefined, init());
    const oa = new AdamW(a.trainableVariables(), { lr: 0.05 }),
      ob = new AdamW(b.trainableVariables(), { lr: 0.05 });
    const rollouts = batch([
      [1, 1, 1],
      [0, 1, 1],
    ]); // first group: all equal, no signal
    for (const lossType of ["grpo", "bnpo", "dr_grpo"] as const) {
      const sa = await grpoStep(a, oa, rollouts, { ...cfg, lossType, skipZeroAdvantage: true });
      const sb = await grpoStep(b, ob, rollouts, { ...cfg, lossType, skipZeroAdvantage: false });
      expect(sa.skipped).toBe(3);
      expect(sb.skipped).toBe(0);
      expect(sa.loss).toBeCloseTo(sb.loss, 6);
      expect(sa.gradNorm).toBeCloseTo(sb.gradNorm, 6);
      expect(sa.tokens).toBe(5);
      expect(sb.tokens).toBe(5 + 12); // group 0 holds 3 + 3 + 6 policy tokens
    }
    const wa = a.delta.dataSync(),
      wb = b.delta.dataSync();
    wa.forEach((x, i) => expect(wb[i]).toBeCloseTo(x, 5));
    [oa, ob, a, b].forEach((x) => x.dispose());
  });

  it("a batch with no signal makes no update", async () => {
    const m = new BigramLM(V, undefined, init());
    const opt = new AdamW(m.trainableVariables(), { lr: 0.05 });
    const w = Array.from(m.delta.dataSync());
    const s = await grpoStep(
      m,
      opt,
      batch([
        [1, 1, 1],
        [0, 0, 0],
      ]),
      cfg,
    );
    expect(s.skipped).toBe(6);
    expect(opt.step).toBe(0);
    expect(Array.from(m.delta.dataSync())).toEqual(w);
    opt.dispose();
    m.dispose();
  });

  it("throws NonFiniteError before applying anything, without leaking tensors", async () => {
    const d = init();
    d[0][1] = NaN;
    const m = new BigramLM(V, undefined, d);
    const opt = new AdamW(m.trainableVariables(), { lr: 0.05 });
    const n0 = tf.memory().numTensors;
    const w = Array.from(m.delta.dataSync());
    await expect(
      grpoStep(
        m,
        opt,
        batch([
          [1, 0, 0],
          [0, 1, 1],
        ]),
        { ...cfg, beta: 0.1, numIterations: 2, microBatchSize: 2 },
      ),
    ).rejects.toThrow(NonFiniteError);
    expect(tf.memory().numTensors).toBe(n0);
    expect(Array.from(m.delta.dataSync())).toEqual(w);
    expect(opt.step).toBe(0);
    opt.dispose();
    m.dispose();
  });

  it("rejects bad config and rollouts with clear messages", async () => {
    const m = new BigramLM(V);
    const opt = new AdamW(m.trainableVariables(), { lr: 0.05 });
    const r = batch([
      [1, 0, 0],
      [0, 1, 1],
    ]);
    await expect(grpoStep(m, opt, r, { ...cfg, lossType: "ppo" as "grpo" })).rejects.toThrow(/lossType "ppo" is not one of/);
    await expect(grpoStep(m, opt, r, { ...cfg, numIterations: 0 })).rejects.toThrow(/numIterations 0/);
    await expect(grpoStep(m, opt, [{ ids: [1, 2], lossMask: [1], group: 0, advantage: 1 }], cfg)).rejects.toThrow(
      /rollout 0 has 2 ids but a loss mask of 1/,
    );
    await expect(grpoStep(m, opt, [{ ids: [1, 2], lossMask: [0, 1], group: 0, advantage: NaN }], cfg)).rejects.toThrow(/advantage is NaN/);
    opt.dispose();
    m.dispose();
  });
});

const logprobsOf = (m: BigramLM, ids: number[]) => tf.tidy(() => m.tokenLogprobs([ids], [ids.map(() => 1)]).logprobs.arraySync()[0]);

/** One step on two groups whose behaviour log-probs (an engine's) saw each token e^shift times less
 *  likely than the trainer does (NaN on the prompt); the stats and the log-probs after. */
async function withBehaviour(shift: number, over: Partial<GrpoConfig>) {
  const rollouts = batch([
    [1, 0, 0],
    [0, 1, 1],
  ]);
  const m = new BigramLM(V, undefined, init());
  const opt = new AdamW(m.trainableVariables(), { lr: 0.05, weightDecay: 0 });
  const rs = rollouts.map((r) => ({ ...r, behaviourLogprobs: logprobsOf(m, r.ids).map((x, t) => (t === 0 ? NaN : x - shift)) }));
  const n0 = tf.memory().numTensors;
  const s = await grpoStep(m, opt, rs, { ...cfg, ...over });
  expect(tf.memory().numTensors).toBe(n0);
  const after = rollouts.map((r) => logprobsOf(m, r.ids));
  opt.dispose();
  m.dispose();
  return { s, after };
}

describe("grpoStep with behaviour log-probs (an inference engine's)", () => {
  it("reports their gap to the trainer's, and with offPolicy clips the ratio against them", async () => {
    const run = (shift: number, offPolicy: boolean) => withBehaviour(shift, { offPolicy });
    const onPolicy = await run(0.5, false);
    expect(onPolicy.s.behaviourGap).toBeCloseTo(0.5, 5);
    expect(onPolicy.s.behaviourDelta).toBeCloseTo(0.5, 5);
    expect(onPolicy.s.clipFrac).toBe(0); // π_old is the trainer's own: ρ = 1
    const same = await run(0, true); // behaviour = trainer: the on-policy update exactly
    expect(same.s.behaviourGap).toBeCloseTo(0, 6);
    expect(same.after).toEqual((await run(0, false)).after);
    const stale = await run(0.5, true); // ρ = e^0.5 ≈ 1.65 > 1 + ε_high on every token
    expect(stale.s.ratio).toBeCloseTo(Math.exp(0.5), 4);
    expect(stale.s.clipFrac).toBeGreaterThan(0);
    expect(stale.after).not.toEqual(same.after);
  });
});

describe("grpoStep with truncated importance sampling (tisCap)", () => {
  // bnpo: the loss is not 0 at ρ = 1, so it shows the weights.
  const run = async (shift: number, tisCap: number | undefined, offPolicy = false) =>
    (await withBehaviour(shift, { lossType: "bnpo", tisCap, offPolicy })).s;

  it("weights each token's policy term by min(π_trainer / π_engine, cap) and reports the share cut", async () => {
    const plain = await run(0.5, undefined);
    expect(plain.tisClipped).toBeNaN(); // off
    expect(plain.loss).not.toBe(0);
    const below = await run(0.5, 2); // weight e^0.5 ≈ 1.65 < 2 everywhere: the loss scales by it
    expect(below.loss / plain.loss).toBeCloseTo(Math.exp(0.5), 4);
    expect(below.tisClipped).toBe(0);
    const capped = await run(1, 2); // e^1 > 2: every weight is cut to the cap
    expect(capped.loss / plain.loss).toBeCloseTo(2, 4);
    expect(capped.tisClipped).toBe(1);
    const under = await run(-1, 2); // the engine found the tokens likelier: weight e^-1
    expect(under.loss / plain.loss).toBeCloseTo(Math.exp(-1), 4);
    expect((await run(0.5, 0)).loss).toBeCloseTo(plain.loss, 6); // 0: off
  });

  it("does nothing when the behaviour log-probs are π_old itself (offPolicy)", async () => {
    const a = await run(0.05, 2, true);
    const b = await run(0.05, undefined, true);
    expect(a.loss).toBeCloseTo(b.loss, 6);
    expect(a.tisClipped).toBeNaN();
  });
});
