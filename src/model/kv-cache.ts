/** Qwen2's KV cache for incremental decoding: per layer the keys (stored transposed, so q·kᵀ is a
 *  plain matMul) and values of every position so far, the attention mask over them, and each row's
 *  count of real tokens (its next position id). Rows can be selected (finished rollouts dropped).
 *  On wasm and webgpu a decode step writes its position in place into room held at the end of every
 *  layer's tensors (slot-write.ts), CHUNK positions at a time; attention then reads the whole
 *  capacity, the free slots masked out (zeros under a MASKED bias weigh exactly 0), and its shapes
 *  stay the same between growths (on webgpu: no buffers or shaders of a new size each step). On
 *  cpu, and for several new positions at once, the tensors are exactly as long as the cache and
 *  each step concatenates.
 *  Leaves out: paged or sliding-window caches. */
import * as tf from "@tensorflow/tfjs";
import { inPlaceWritable, slotWrites, writeSlot } from "../kernels/slot-write.ts";
import type { KVCache } from "./types.ts";

/** Positions of room a full cache grows by (one copy of it per ~CHUNK decode steps, against one per
 *  step; attention reads at most CHUNK + 7 masked positions more). A grown capacity is a multiple of
 *  8, so the products over it are whole 8-column panels (no edge columns). */
const CHUNK = 32;

export class Qwen2KVCache implements KVCache {
  constructor(
    public k: tf.Tensor4D[], // per layer [B, nKv, hd, W]  (keys stored transposed for q·kᵀ as a plain matMul)
    public v: tf.Tensor4D[], // per layer [B, nKv, W, hd]; W ≥ length (the capacity; the rest zeros)
    public mask: number[][], // [B][length]
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
    const W = Math.max(...parts.map((p) => p.capacity));
    const join = <T extends tf.Tensor>(ts: T[], axis: number): T =>
      tf.tidy(
        () =>
          tf.concat(
            ts.map((t) => (t.shape[axis] < W ? padTo(t, axis, W) : t)),
            0,
          ) as T,
      );
    return new Qwen2KVCache(
      parts[0].k.map((_, l) =>
        join(
          parts.map((p) => p.k[l]),
          3,
        ),
      ),
      parts[0].v.map((_, l) =>
        join(
          parts.map((p) => p.v[l]),
          2,
        ),
      ),
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
  /** Positions the tensors hold room for (≥ length). */
  get capacity(): number {
    return this.k[0]?.shape[3] ?? 0;
  }
  /** The key width W every layer of a step of T new positions attends over: the capacity where the
   *  step writes in place (one position, wasm or webgpu, room left), a capacity grown by CHUNK (then
   *  up to a multiple of 8) where it must grow or copy first, and exactly length + T where steps
   *  concatenate. */
  width(T: number): number {
    const L = this.length,
      W = this.capacity;
    if (T !== 1 || L === 0 || !slotWrites(this.k[0])) return L + T;
    return W > L && [...this.k, ...this.v].every(inPlaceWritable) ? W : Math.ceil((Math.max(W, L) + CHUNK) / 8) * 8;
  }
  /** Whether a step of one position attending over width W (width(1)) writes layer l in place
   *  without growing: its tensors have room W and are writable in place (then a backend can write
   *  the new key and value into cache.k[l] / cache.v[l] at position length directly). */
  writesInPlace(l: number, W: number): boolean {
    return W > this.length && this.k[l].shape[3] === W && inPlaceWritable(this.k[l]) && inPlaceWritable(this.v[l]);
  }
  /** Layer l's keys (B, nKv, hd, W) and values (B, nKv, W, hd) with the step's kT (B, nKv, hd, T) and
   *  v (B, nKv, T, hd) at positions length…length + T − 1, W = width(T) of this step. The cache's own
   *  tensors when written in place, new ones otherwise (step() swaps them in after the last layer). */
  extend(l: number, kT: tf.Tensor4D, v: tf.Tensor4D, W: number): [tf.Tensor4D, tf.Tensor4D] {
    const L = this.length,
      T = kT.shape[3];
    if (W === L + T && this.k[l].shape[3] === L) return [tf.concat([this.k[l], kT], 3), tf.concat([this.v[l], v], 2)];
    // width() gave the capacity only if every tensor is writable; else a larger W: new tensors of
    // every position so far, then zeros
    const grow = this.k[l].shape[3] !== W,
      keys = grow ? padTo(this.k[l], 3, W) : this.k[l],
      vals = grow ? padTo(this.v[l], 2, W) : this.v[l];
    writeSlot(keys, kT, L, false);
    writeSlot(vals, v, L, true);
    return [keys, vals];
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

/** t with zeros appended along `axis` up to W positions: always a new tensor of its own data. */
function padTo<T extends tf.Tensor>(t: T, axis: number, W: number): T {
  return tf.tidy(() => {
    const shape = t.shape.slice();
    shape[axis] = W - t.shape[axis];
    return tf.concat([t, tf.zeros(shape)], axis) as T;
  });
}
