/** KV-cache decoding equals full recomputation, rows can be dropped, and nothing leaks. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { loadModel } from "../../src/model/load.ts";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { distinctRows } from "../../src/model/generation.ts";
import { Qwen2KVCache } from "../../src/model/kv-cache.ts";
import { attentionBias, MASKED, positionIds } from "../../src/model/attention.ts";
import { lastLogits, maxDiff, slotWriteTests } from "./helpers/kvcache-suite.ts";

const FIX = "test/fixtures/qwen2-tiny";

describe("mask helpers", () => {
  it("position ids follow cumsum(mask)−1 with pads at 1, continuing from the past", () => {
    expect(
      positionIds([
        [0, 0, 1, 1, 1],
        [1, 1, 1, 1, 1],
      ]),
    ).toEqual([
      [1, 1, 0, 1, 2],
      [0, 1, 2, 3, 4],
    ]);
    expect(positionIds([[1], [1]], [3, 5])).toEqual([[3], [5]]);
  });
  it("bias allows j ≤ i on real keys only", () => {
    const b = attentionBias([[0, 1, 1]], 3);
    expect(Array.from(b).map((v) => (v === 0 ? 1 : v === Math.fround(MASKED) ? 0 : NaN))).toEqual([0, 0, 0, 0, 1, 0, 0, 1, 1]);
    expect(Array.from(attentionBias([[1, 0, 1, 1]], 1)).map((v) => (v === 0 ? 1 : 0))).toEqual([1, 0, 1, 1]);
    // a cache's free room (keys 4…5 of width 6) is masked
    expect(Array.from(attentionBias([[1, 0, 1, 1]], 1, 6)).map((v) => (v === 0 ? 1 : v === Math.fround(MASKED) ? 0 : NaN))).toEqual([
      1, 0, 1, 1, 0, 0,
    ]);
  });
});

describe("KV cache (wasm)", () => {
  let model: Qwen2ForCausalLM;
  beforeAll(async () => {
    await initBackend("wasm");
    model = await loadModel(FIX, { adapter: `${FIX}/lora` });
  });

  it("prefill + decode steps give the full-recompute logits for left-padded rows", async () => {
    const ids = [
      [0, 0, 0, 56, 61, 139],
      [16, 217, 62, 54, 40, 191],
      [0, 7, 8, 9, 10, 11],
    ];
    const mask = [
      [0, 0, 0, 1, 1, 1],
      [1, 1, 1, 1, 1, 1],
      [0, 1, 1, 1, 1, 1],
    ];
    const { logits, cache } = model.prefill(ids, mask);
    let worst = maxDiff((await logits.array()) as number[][], await lastLogits(model, ids, mask));
    logits.dispose();
    const seq = ids.map((r) => [...r]),
      m = mask.map((r) => [...r]);
    for (const step of [
      [5, 6, 7],
      [100, 200, 3],
      [42, 43, 44],
    ]) {
      const l = model.decodeStep(step, cache);
      step.forEach((t, b) => {
        seq[b].push(t);
        m[b].push(1);
      });
      worst = Math.max(worst, maxDiff((await l.array()) as number[][], await lastLogits(model, seq, m)));
      l.dispose();
    }
    expect(cache.length).toBe(9);
    // drop the middle row: the remaining rows keep decoding correctly
    cache.select([2, 0]);
    const l = model.decodeStep([1, 2], cache);
    const want = await lastLogits(
      model,
      [
        [...seq[2], 1],
        [...seq[0], 2],
      ],
      [
        [...m[2], 1],
        [...m[0], 1],
      ],
    );
    worst = Math.max(worst, maxDiff((await l.array()) as number[][], want));
    l.dispose();
    cache.dispose();
    console.log(`KV cache vs recompute max |Δ| ${worst.toExponential(2)}`);
    expect(worst).toBeLessThanOrEqual(1e-4);
  });

  it("a prefill in row groups (bounded activation memory) gives the same bits as one pass, and decodes on", async () => {
    const ids = [
      [0, 0, 0, 56, 61, 139],
      [16, 217, 62, 54, 40, 191],
      [0, 7, 8, 9, 10, 11],
      [3, 4, 5, 6, 7, 8],
      [0, 0, 9, 9, 9, 9],
    ];
    const mask = ids.map((r) => r.map((t, i) => (t === 0 && (i === 0 || r[i - 1] === 0) ? 0 : 1)));
    const read = async (p: { logits: tf.Tensor2D; cache: { k: tf.Tensor[]; v: tf.Tensor[]; mask: number[][]; count: number[] } }) => ({
      logits: Array.from(await p.logits.data()),
      k: await Promise.all(p.cache.k.map(async (t) => ({ shape: t.shape, d: Array.from(await t.data()) }))),
      v: await Promise.all(p.cache.v.map(async (t) => ({ shape: t.shape, d: Array.from(await t.data()) }))),
      mask: p.cache.mask,
      count: p.cache.count,
    });
    const before = tf.memory().numTensors;
    const whole = model.prefill(ids, mask);
    const saved = model.prefillBytes;
    model.prefillBytes = 1; // one row at a time
    const grouped = model.prefill(ids, mask);
    model.prefillBytes = saved;
    expect(await read(grouped)).toEqual(await read(whole));
    const [a, b] = [model.decodeStep([5, 6, 7, 8, 9], whole.cache), model.decodeStep([5, 6, 7, 8, 9], grouped.cache)];
    expect(Array.from(await b.data())).toEqual(Array.from(await a.data()));
    tf.dispose([a, b, whole.logits, grouped.logits]);
    whole.cache.dispose();
    grouped.cache.dispose();
    expect(tf.memory().numTensors).toBe(before);
  });

  it("a prefill with repeated rows (a GRPO group) runs each distinct row once: the same bits as row by row, and decodes on", async () => {
    const p0 = [0, 0, 7, 8, 9, 10],
      p1 = [16, 217, 62, 54, 40, 191];
    const ids = [p0, p1, p0, p0, p1, [0, 7, 8, 9, 10, 11]]; // the last differs from p0 only in its mask
    const mask = ids.map((r) => r.map((t, i) => (t === 0 && (i === 0 || r[i - 1] === 0) ? 0 : 1)));
    mask[5][0] = 1;
    expect(distinctRows(ids, mask)).toEqual({ unique: [0, 1, 5], of: [0, 1, 0, 0, 1, 2] });
    const read = async (logits: tf.Tensor2D, cache: Qwen2KVCache) => ({
      logits: Array.from(await logits.data()),
      k: await Promise.all(cache.k.map(async (t) => ({ shape: t.shape, d: Array.from(await t.data()) }))),
      v: await Promise.all(cache.v.map(async (t) => ({ shape: t.shape, d: Array.from(await t.data()) }))),
      mask: cache.mask,
      count: cache.count,
    });
    const before = tf.memory().numTensors;
    const shared = model.prefill(ids, mask);
    const alone = ids.map((r, i) => model.prefill([r], [mask[i]]));
    const cache = Qwen2KVCache.concat(alone.map((a) => a.cache));
    const logits = tf.concat(alone.map((a) => a.logits)) as tf.Tensor2D;
    alone.forEach((a) => (a.cache.dispose(), a.logits.dispose()));
    expect(await read(shared.logits, shared.cache)).toEqual(await read(logits, cache));
    const tokens = [5, 6, 7, 8, 9, 10];
    const [a, b] = [model.decodeStep(tokens, shared.cache), model.decodeStep(tokens, cache)];
    expect(Array.from(await a.data())).toEqual(Array.from(await b.data()));
    tf.dispose([a, b, logits, shared.logits]);
    shared.cache.dispose();
    cache.dispose();
    expect(tf.memory().numTensors).toBe(before);
  });

  it("a held row reads nothing: its next logits are those of the same context without the held steps", async () => {
    // Row 0 is held for two steps (a rollout row waiting for its environment) while row 1 decodes on.
    const { logits, cache } = model.prefill(
      [
        [0, 56, 61, 139],
        [16, 217, 62, 54],
      ],
      [
        [0, 1, 1, 1],
        [1, 1, 1, 1],
      ],
    );
    logits.dispose();
    const steps: [number[], boolean[] | undefined][] = [
      [[5, 6], undefined],
      [
        [0, 7],
        [true, false],
      ],
      [
        [0, 8],
        [true, false],
      ],
      [[9, 10], undefined],
    ];
    let l: tf.Tensor2D | null = null;
    for (const [tokens, hold] of steps) {
      l?.dispose();
      l = model.decodeStep(tokens, cache, hold ? { hold } : {});
    }
    const got = (await l!.array()) as number[][];
    l!.dispose();
    cache.dispose();
    const want0 = await lastLogits(model, [[0, 56, 61, 139, 5, 9]], [[0, 1, 1, 1, 1, 1]]);
    const want1 = await lastLogits(model, [[16, 217, 62, 54, 6, 7, 8, 10]], [[1, 1, 1, 1, 1, 1, 1, 1]]);
    expect(maxDiff([got[0]], want0)).toBeLessThanOrEqual(1e-4);
    expect(maxDiff([got[1]], want1)).toBeLessThanOrEqual(1e-4);
    expect(() => model.decodeStep([1, 2], model.prefill([[1], [2]], [[1], [1]]).cache, { hold: [true] })).toThrow(
      /1 hold flags for 2 rows/,
    );
  });

  it("50 decode steps leave the tensor count unchanged", async () => {
    const before = tf.memory().numTensors;
    const { logits, cache } = model.prefill(
      [
        [1, 2, 3],
        [0, 4, 5],
      ],
      [
        [1, 1, 1],
        [0, 1, 1],
      ],
    );
    let lg = logits;
    for (let s = 0; s < 50; s++) {
      const am = tf.argMax(lg, 1);
      const next = Array.from((await am.data()) as Int32Array);
      tf.dispose([am, lg]);
      lg = model.decodeStep(next, cache);
    }
    lg.dispose();
    cache.dispose();
    expect(tf.memory().numTensors).toBe(before);
  });

  slotWriteTests(() => model);
});
