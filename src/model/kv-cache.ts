/** Qwen2's KV cache for incremental decoding: per layer the keys (stored transposed, so q·kᵀ is a
 *  plain matMul) and values of every position so far, the attention mask over them, and each row's
 *  count of real tokens (its next position id). Rows can be selected (finished rollouts dropped).
 *  Leaves out: paged or sliding-window caches. */
import * as tf from "@tensorflow/tfjs";
import type { KVCache } from "./types.ts";

export class Qwen2KVCache implements KVCache {
  constructor(
    public k: tf.Tensor4D[], // per layer [B, nKv, hd, L]  (keys stored transposed for q·kᵀ as a plain matMul)
    public v: tf.Tensor4D[], // per layer [B, nKv, L, hd]
    public mask: number[][], // [B][L]
    public count: number[], // real tokens seen per row (the next position id)
  ) {}
  /** A cache of `rows` rows and no positions yet. */
  static empty(rows: number): Qwen2KVCache {
    return new Qwen2KVCache(
      [],
      [],
      Array.from({ length: rows }, () => []),
      new Array<number>(rows).fill(0),
    );
  }
  /** The rows of `parts` in order, as one cache (the parts keep theirs; the caller disposes them). */
  static concat(parts: Qwen2KVCache[]): Qwen2KVCache {
    const join = <T extends tf.Tensor>(ts: T[]): T => tf.concat(ts, 0) as T;
    return new Qwen2KVCache(
      parts[0].k.map((_, l) => join(parts.map((p) => p.k[l]))),
      parts[0].v.map((_, l) => join(parts.map((p) => p.v[l]))),
      parts.flatMap((p) => p.mask),
      parts.flatMap((p) => p.count),
    );
  }
  get batchSize(): number {
    return this.mask.length;
  }
  get length(): number {
    return this.mask[0]?.length ?? 0;
  }
  select(rows: number[]): void {
    for (const r of rows)
      if (!(Number.isInteger(r) && r >= 0 && r < this.batchSize))
        throw new Error(`cache select: row ${r} out of range 0..${this.batchSize - 1}`);
    const idx = tf.tensor1d(rows, "int32");
    const pick = <T extends tf.Tensor>(ts: T[]) =>
      ts.map((t) => {
        const g = tf.gather(t, idx, 0) as T;
        t.dispose();
        return g;
      });
    this.k = pick(this.k);
    this.v = pick(this.v);
    idx.dispose();
    this.mask = rows.map((r) => this.mask[r].slice()); // a row selected twice gets a mask of its own
    this.count = rows.map((r) => this.count[r]);
  }
  dispose(): void {
    tf.dispose([...this.k, ...this.v]);
    this.k = [];
    this.v = [];
  }
}
