import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { countTokens, sftLoss, sftStep, type SftBatch } from "../../src/trainer/sft.ts";
import { AdamW } from "../../src/trainer/optimizer.ts";
import { NonFiniteError } from "../../src/util/errors.ts";
import { rightPad } from "../../src/trainer/batch.ts";
import { BigramLM } from "./helpers/bigram-lm.ts";

beforeAll(async () => {
  await tf.setBackend("cpu");
});

const V = 6;
// Prompt tokens (mask 0) then answer tokens (mask 1); padded with id 0.
const seqs = [
  [1, 2, 3, 4],
  [1, 5, 3],
  [2, 3, 4, 5, 1],
];
const masks = [
  [0, 0, 1, 1],
  [0, 1, 1],
  [0, 1, 1, 1, 1],
];
const full = (): SftBatch => rightPad(seqs, masks, 0);

describe("sftLoss", () => {
  it("is ln V under a uniform model and the hand-computed NLL otherwise", () => {
    const m = new BigramLM(V);
    const l = sftLoss(m, full());
    expect(l.dataSync()[0]).toBeCloseTo(Math.log(V), 5);
    l.dispose();
    // delta[2][3] = 2: p(3|2) = e²/(e²+5); tokens counted: 3|2 (row 0), 4|3, 5|1 (row 1), 3|5,
    // 3|2 (row 2), 4|3, 5|4, 1|5 — 8 tokens, two of them are 3|2.
    const d = Array.from({ length: V }, () => new Array(V).fill(0));
    d[2][3] = 2;
    const m2 = new BigramLM(V, undefined, d);
    const p32 = Math.exp(2) / (Math.exp(2) + 5);
    const want = (-2 * Math.log(p32) + 6 * Math.log(V)) / 8;
    expect(countTokens(full())).toBe(8);
    const l2 = sftLoss(m2, full());
    expect(l2.dataSync()[0]).toBeCloseTo(want, 5);
    tf.dispose([l2]);
    m.dispose();
    m2.dispose();
  });

  it("never counts position 0 and rejects a batch with nothing to learn", () => {
    const m = new BigramLM(V);
    expect(countTokens({ ids: [[1, 2]], attentionMask: [[1, 1]], lossMask: [[1, 0]] })).toBe(0);
    expect(() => sftLoss(m, { ids: [[1, 2]], attentionMask: [[1, 1]], lossMask: [[1, 0]] })).toThrow(/0 tokens with lossMask 1/);
    expect(() => sftLoss(m, { ids: [[1, 2]], attentionMask: [[1]], lossMask: [[1, 1]] })).toThrow(
      /attentionMask\[0\] has 1 columns; expected 2/,
    );
    m.dispose();
  });
});

describe("sftStep", () => {
  it("overfits a small set: the loss falls, tensors do not leak", async () => {
    const m = new BigramLM(V);
    const opt = new AdamW(m.trainableVariables(), { lr: 0.1, weightDecay: 0 });
    const before = tf.memory().numTensors;
    const losses: number[] = [];
    for (let i = 0; i < 30; i++) losses.push((await sftStep(m, opt, [full()], { maxGradNorm: 1, lr: 0.1 })).loss);
    expect(tf.memory().numTensors).toBe(before);
    expect(losses[0]).toBeCloseTo(Math.log(V), 5);
    expect(losses[29]).toBeLessThan(0.5 * losses[0]);
    expect(losses.every((x, i) => i === 0 || x <= losses[i - 1] + 1e-6)).toBe(true);
    opt.dispose();
    m.dispose();
  });

  it("accumulating micro-batches weighted by tokens equals one big batch", async () => {
    const init = Array.from({ length: V }, (_, i) => Array.from({ length: V }, (_, j) => Math.sin(i * 7 + j * 3)));
    const a = new BigramLM(V, undefined, init),
      b = new BigramLM(V, undefined, init);
    const oa = new AdamW(a.trainableVariables(), { lr: 0.05 }),
      ob = new AdamW(b.trainableVariables(), { lr: 0.05 });
    const mbs = [rightPad(seqs.slice(0, 1), masks.slice(0, 1), 0), rightPad(seqs.slice(1), masks.slice(1), 0)];
    // micro-batches hold 2 and 6 tokens: a plain mean of their means would weigh them 1:1, not 2:6
    expect(mbs.map(countTokens)).toEqual([2, 6]);
    for (let i = 0; i < 2; i++) {
      const ra = await sftStep(a, oa, [full()], { maxGradNorm: 0.5, lr: 0.05 });
      const rb = await sftStep(b, ob, mbs, { maxGradNorm: 0.5, lr: 0.05 });
      expect(rb.tokens).toBe(ra.tokens);
      expect(rb.loss).toBeCloseTo(ra.loss, 5);
      expect(rb.gradNorm).toBeCloseTo(ra.gradNorm, 5);
    }
    const wa = a.delta.dataSync(),
      wb = b.delta.dataSync();
    wa.forEach((x, i) => expect(wb[i]).toBeCloseTo(x, 5));
    [oa, ob, a, b].forEach((x) => x.dispose());
  });

  it("runs a micro-batch in parts where the model's trainRowsFor allows fewer rows, with the same update", async () => {
    const init = Array.from({ length: V }, (_, i) => Array.from({ length: V }, (_, j) => Math.cos(i * 3 + j * 5)));
    const a = new BigramLM(V, undefined, init),
      b = new BigramLM(V, undefined, init);
    const oa = new AdamW(a.trainableVariables(), { lr: 0.05 }),
      ob = new AdamW(b.trainableVariables(), { lr: 0.05 });
    const rows: number[] = [];
    const seen = b.tokenLogprobs.bind(b);
    b.tokenLogprobs = (ids, mask, opts) => (rows.push(ids.length), seen(ids, mask, opts));
    (b as BigramLM & { trainRowsFor(length: number): number }).trainRowsFor = (length) => (length >= 5 ? 2 : 8);
    const short = rightPad(
      [
        [1, 2],
        [3, 4],
      ],
      [
        [0, 1],
        [0, 1],
      ],
      0,
    ); // length 2: stays whole
    for (let i = 0; i < 2; i++) {
      const ra = await sftStep(a, oa, [full(), short], { maxGradNorm: 0.5, lr: 0.05 });
      const rb = await sftStep(b, ob, [full(), short], { maxGradNorm: 0.5, lr: 0.05 });
      expect(rb.tokens).toBe(ra.tokens);
      expect(rb.loss).toBeCloseTo(ra.loss, 5);
      expect(rb.gradNorm).toBeCloseTo(ra.gradNorm, 5);
    }
    expect(rows).toEqual([2, 1, 2, 2, 1, 2]); // full() (3 rows of 5 tokens) as 2 + 1, then short whole
    const wa = a.delta.dataSync(),
      wb = b.delta.dataSync();
    wa.forEach((x, i) => expect(wb[i]).toBeCloseTo(x, 5));
    [oa, ob, a, b].forEach((x) => x.dispose());
  });

  it("throws NonFiniteError on a NaN loss and leaves the weights alone", async () => {
    const d = Array.from({ length: V }, () => new Array(V).fill(0));
    d[1][2] = NaN;
    const m = new BigramLM(V, undefined, d);
    const opt = new AdamW(m.trainableVariables(), { lr: 0.1 });
    const before = tf.memory().numTensors;
    const w = Array.from(m.delta.dataSync());
    await expect(sftStep(m, opt, [full()], { maxGradNorm: 1, lr: 0.1 })).rejects.toThrow(NonFiniteError);
    expect(tf.memory().numTensors).toBe(before);
    expect(Array.from(m.delta.dataSync())).toEqual(w);
    expect(opt.step).toBe(0);
    opt.dispose();
    m.dispose();
  });
});
