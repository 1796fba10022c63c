/** One decode batch over one KV cache: the loop under both local rollouts (rollout.ts) and the
 *  OpenAI server's batcher (serve/openai/batcher.ts). It owns the cache and each step's logits:
 *  - new DecodeBatch(model, prompts, …) left-pads the prompts (every row's last prompt token at the
 *    same position) and prefills them;
 *  - sample(positions, …) draws a token for the rows at those cache positions (sampler.ts: one
 *    uniform per row, in order); read() hands the whole logits to the host instead (the server draws
 *    each row with its own settings and reports log-probs at temperature 1). Either one frees the
 *    step's logits; a step's logits are read at most once;
 *  - step(feed, done, hold) feeds one token per cache row (or none: hold, ForwardOptions.hold), first
 *    dropping finished rows from the cache once enough of them pile up (cache.select copies the
 *    cache, so not every step).
 *  Rows keep the numbers the caller gave them (their index in `prompts`); `rows` maps cache positions
 *  to them. What a row is (when it samples, what it reads, when it is done) is the caller's.
 *  Leaves out: rows joining a running batch (neither caller needs it: the server decodes whole
 *  requests, one batch at a time, and a row joining would need its prompt prefilled into the cache at
 *  the running length), speculative and paged decoding. */
import type * as tf from "@tensorflow/tfjs";
import { gather } from "@tensorflow/tfjs";
import type { CausalLM, KVCache } from "../model/types.ts";
import type { Rng } from "../util/rng.ts";
import { sampleTokens, type SampleOptions, type SampleResult, type SamplingParams } from "./sampler.ts";

export interface DecodeBatchOptions {
  pad: number; // the token left padding and finished rows read
  adapters?: boolean; // ForwardOptions.adapters; default true
  compactFraction?: number; // drop finished rows once they are this share of the cache rows; default 0.25
}

/** What the turn loop (rollout.ts) and the server's batcher drive: this file's DecodeBatch over the
 *  model's tfjs forward, or the compiled decoder's batch (kernels/webgpu/decode/batch.ts). */
export interface DecodeRows {
  /** Cache position → row (its index in the prompts). */
  rows: number[];
  sample(positions: number[], params: SamplingParams, rng: Rng, opts?: SampleOptions): Promise<SampleResult>;
  read(): Promise<Float32Array>;
  /** feed[pos]: the token the row at that cache position reads; with readsMany, several in order. */
  step(feed: (number | number[])[], done: (row: number) => boolean, hold?: boolean[]): void;
  dispose(): void;
  /** The batch takes several tokens of a row in one step (a tool result read at once). */
  readonly readsMany?: boolean;
}

/** Opens a decode batch on prompts (each row's ids; the rows' own budget of new tokens beside). */
export type OpenDecodeBatch = (prompts: number[][], o: DecodeBatchOptions & { maxNewTokens: number }) => DecodeRows;

export class DecodeBatch implements DecodeRows {
  /** Cache position → row (its index in the prompts). */
  rows: number[];
  private logits: tf.Tensor2D | null; // [rows.length, V]: this step's, until sampled or read
  private readonly cache: KVCache;
  private readonly adapters: boolean;
  private readonly compactFraction: number;

  constructor(
    private readonly model: CausalLM,
    prompts: number[][],
    o: DecodeBatchOptions,
  ) {
    this.adapters = o.adapters ?? true;
    this.compactFraction = o.compactFraction ?? 0.25;
    const maxPrompt = Math.max(...prompts.map((p) => p.length));
    const ids = prompts.map((p) => [...new Array(maxPrompt - p.length).fill(o.pad), ...p]); // [B, maxPrompt]
    const mask = prompts.map((p) => [...new Array(maxPrompt - p.length).fill(0), ...p.map(() => 1)]);
    const prefill = model.prefill(ids, mask, { adapters: this.adapters });
    this.logits = prefill.logits; // [B, V]
    this.cache = prefill.cache;
    this.rows = prompts.map((_, i) => i);
  }

  /** Draw a token for the rows at these cache positions from this step's logits (sampler.ts). */
  async sample(positions: number[], params: SamplingParams, rng: Rng, opts: SampleOptions = {}): Promise<SampleResult> {
    const logits = this.take();
    try {
      const sub = positions.length === this.rows.length ? logits : (gather(logits, positions) as tf.Tensor2D); // [positions, V]
      try {
        return await sampleTokens(sub, params, rng, opts);
      } finally {
        if (sub !== logits) sub.dispose();
      }
    } finally {
      logits.dispose();
    }
  }

  /** This step's logits on the host, [rows.length × V] in cache order. */
  async read(): Promise<Float32Array> {
    const logits = this.take();
    try {
      return (await logits.data()) as Float32Array;
    } finally {
      logits.dispose();
    }
  }

  /** One decode step: feed[pos] is what the row at cache position pos reads (pad for a finished
   *  row: its output is ignored); hold[pos] true: it reads nothing. Rows done(row) says are finished
   *  leave the cache first once they are compactFraction of it. */
  step(feed: number[], done: (row: number) => boolean, hold?: boolean[]): void {
    this.logits?.dispose(); // not sampled this step: no row was drawing
    this.logits = null;
    let ps = this.rows.map((_, p) => p); // the cache positions that read
    const keep = ps.filter((p) => !done(this.rows[p]));
    if (this.rows.length - keep.length >= Math.max(1, this.compactFraction * this.rows.length)) {
      this.cache.select(keep);
      this.rows = keep.map((p) => this.rows[p]);
      ps = keep;
    }
    const held = hold && ps.some((p) => hold[p]) ? { hold: ps.map((p) => hold[p]) } : {};
    this.logits = this.model.decodeStep(
      ps.map((p) => feed[p]),
      this.cache,
      { adapters: this.adapters, ...held },
    );
  }

  dispose(): void {
    this.logits?.dispose();
    this.logits = null;
    this.cache.dispose();
  }

  private take(): tf.Tensor2D {
    if (!this.logits) throw new Error("DecodeBatch: this step's logits were already sampled or read; call step() first");
    const l = this.logits;
    this.logits = null;
    return l;
  }
}
