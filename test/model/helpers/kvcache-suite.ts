/** The KV cache's in-place writes (kernels/slot-write.ts), run on each backend that has them: wasm by
 *  test/model/kvcache.test.ts, webgpu by test/kernels/webgpu/kvcache.test.ts. Decoding across the
 *  cache's growth gives the full-recompute logits, a shared cache is copied before it is written,
 *  and writeSlot puts a key column and a value row where they belong. */
import { expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { inPlaceWritable, writeSlot } from "../../../src/kernels/slot-write.ts";
import { Qwen2KVCache } from "../../../src/model/kv-cache.ts";
import type { Qwen2ForCausalLM } from "../../../src/model/qwen2.ts";

/** The last position's logits of a full forward (the recompute a cache must equal). */
export async function lastLogits(model: Qwen2ForCausalLM, ids: number[][], mask: number[][]): Promise<number[][]> {
  const l = model.forward(ids, mask);
  const T = ids[0].length;
  const last = tf.tidy(() => tf.squeeze(tf.slice(l, [0, T - 1, 0], [-1, 1, -1]), [1]));
  const out = (await last.array()) as number[][];
  tf.dispose([l, last]);
  return out;
}
export const maxDiff = (a: number[][], b: number[][]) => Math.max(...a.flatMap((r, i) => r.map((v, j) => Math.abs(v - b[i][j]))));

export function slotWriteTests(getModel: () => Qwen2ForCausalLM): void {
  it("decode steps write their position in place into room grown 32 at a time, and give the recompute logits across growth", async () => {
    const before = tf.memory().numTensors;
    const ids = [
      [0, 56, 61, 139],
      [16, 217, 62, 54],
    ];
    const mask = [
      [0, 1, 1, 1],
      [1, 1, 1, 1],
    ];
    const { logits, cache } = getModel().prefill(ids, mask);
    logits.dispose();
    expect(cache.capacity).toBe(4);
    const seq = ids.map((r) => [...r]),
      m = mask.map((r) => [...r]);
    let worst = 0,
      inPlace = 0;
    for (let s = 0; s < 40; s++) {
      const tokens = [(7 * s + 3) % 250, (11 * s + 5) % 250];
      const k0 = cache.k[0];
      const l = getModel().decodeStep(tokens, cache);
      if (cache.k[0] === k0) inPlace++;
      tokens.forEach((t, b) => (seq[b].push(t), m[b].push(1)));
      if (s % 13 === 0 || s === 39) worst = Math.max(worst, maxDiff((await l.array()) as number[][], await lastLogits(getModel(), seq, m)));
      l.dispose();
      expect(cache.capacity).toBe(s < 36 ? 40 : 72); // grown at the first step (4 + 32, up to a multiple of 8) and when full
      expect(cache.length).toBe(5 + s);
    }
    expect(inPlace).toBe(38); // every step but the two that grew the room
    expect(worst).toBeLessThanOrEqual(1e-4);
    cache.dispose();
    expect(tf.memory().numTensors).toBe(before);
  });

  it("a cache whose tensors share their data with another's is copied before it is written", async () => {
    const part = getModel().prefill([[3, 4, 5]], [[1, 1, 1]]);
    const joined = Qwen2KVCache.concat([part.cache]); // one part: tfjs shares the data
    expect(inPlaceWritable(joined.k[0])).toBe(false);
    const k = Array.from(await part.cache.k[0].data());
    const a = getModel().decodeStep([9], joined);
    expect(Array.from(await part.cache.k[0].data())).toEqual(k); // the part's keys are untouched
    expect(joined.capacity).toBe(40);
    const b = getModel().decodeStep([9], part.cache);
    expect(Array.from(await a.data())).toEqual(Array.from(await b.data()));
    tf.dispose([a, b, part.logits]);
    part.cache.dispose();
    joined.dispose();
  });

  it("writeSlot puts a key column and a value row at a position, and refuses shared data", async () => {
    const keys = tf.zeros([1, 2, 3, 4]) as tf.Tensor4D,
      vals = tf.zeros([1, 2, 4, 3]) as tf.Tensor4D;
    writeSlot(keys, tf.tensor4d([1, 2, 3, 4, 5, 6], [1, 2, 3, 1]), 2, false);
    writeSlot(vals, tf.tensor4d([1, 2, 3, 4, 5, 6], [1, 2, 1, 3]), 1, true);
    expect(Array.from(await keys.data())).toEqual([0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 5, 0, 0, 0, 6, 0]);
    expect(Array.from(await vals.data())).toEqual([0, 0, 0, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 5, 6, 0, 0, 0, 0, 0, 0]);
    const view = tf.reshape(keys, [2, 12]);
    expect(() => writeSlot(keys, tf.zeros([1, 2, 3, 1]), 0, false)).toThrow(/not writable in place/);
    expect(() => writeSlot(vals, tf.zeros([1, 2, 1, 3]), 4, true)).toThrow(/shapes do not match/);
    tf.dispose([keys, vals, view]);
  });
}
