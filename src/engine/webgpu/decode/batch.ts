/** A decode batch on the compiled decoder: what rollout/decode-batch.ts' DecodeBatch does over tfjs'
 *  forward, with the same calls, so the turn loop (rollout/rollout.ts) drives either one.
 *  - Each row owns a KV slot; a row's tokens go to its slot's next position. Rows that are done or
 *    held simply leave the pass (continuous batching: no cache compaction, no padding).
 *  - Rows whose prompts are equal (a GRPO group) share one prefill: the first such row's slot holds
 *    the prompt, the others read its positions from there (PassRow.src) and write only their own.
 *  - step() records the rows' tokens; sample() runs them, then the head and the draw, in one pass
 *    (one submit, 8 bytes read back a sampling row). A step nothing samples after is submitted at
 *    the next step() unread.
 *  Draws take sampler.ts' uniforms from the same rng in the same order: temperature 0 is the argmax,
 *  a temperature without top-k/top-p the whole-vocabulary id walk (vocab.ts' kernel); top-k/top-p
 *  read the sampling rows' logits and draw with the host's rank walk (sample-row.ts). */
import { NonFiniteError } from "../../../util/errors.ts";
import type { Rng } from "../../../util/rng.ts";
import type { DecodeRows } from "../../../rollout/decode-batch.ts";
import { sampleRow, Scratch, uniformFor, type SamplingParams } from "../../../rollout/sample-row.ts";
import type { SampleResult } from "../../../rollout/sampler.ts";
import type { Decoder, PassRow } from "./decoder.ts";

/** Prompt tokens a prefill pass takes at most (with the decode rows, the decoder's pass capacity). */
export const PREFILL_ROWS = 256;

export class CompiledBatch implements DecodeRows {
  rows: number[];
  private readonly next: number[]; // each row's next position
  private readonly src: { slot: number; len: number }[]; // where a row reads its shared prompt
  private pending: PassRow[] = [];
  private hidden: number[]; // row → its pass row in `pending` whose output it samples from, −1: none

  constructor(
    private readonly dec: Decoder,
    prompts: number[][],
    o: { adapters?: boolean; maxNewTokens: number },
  ) {
    const N = prompts.length;
    this.rows = prompts.map((_, i) => i);
    const maxPrompt = Math.max(...prompts.map((p) => p.length));
    dec.prepare(N, maxPrompt + o.maxNewTokens, Math.max(N, PREFILL_ROWS), o.adapters ?? true);
    const owner = new Map<string, number>();
    const ownerOf = prompts.map((p, i) => {
      const key = p.join(",");
      if (!owner.has(key)) owner.set(key, i);
      return owner.get(key)!;
    });
    this.src = prompts.map((p, i) => ({ slot: ownerOf[i], len: ownerOf[i] === i ? 0 : p.length }));
    this.next = prompts.map((p) => p.length);
    // every owner's prompt but its last token, in passes of at most PREFILL_ROWS rows
    let chunk: PassRow[] = [];
    for (const i of owner.values())
      for (let t = 0; t < prompts[i].length - 1; t++) {
        chunk.push({ token: prompts[i][t], slot: i, pos: t });
        if (chunk.length === PREFILL_ROWS) {
          dec.submit(chunk);
          chunk = [];
        }
      }
    if (chunk.length > 0) dec.submit(chunk);
    // the last prompt tokens run with the first draw; a group's rows all sample from its owner's
    const at = new Map<number, number>();
    for (const i of owner.values()) {
      at.set(i, this.pending.length);
      this.pending.push({ token: prompts[i][prompts[i].length - 1], slot: i, pos: prompts[i].length - 1 });
    }
    this.hidden = ownerOf.map((i) => at.get(i)!);
  }

  async sample(positions: number[], params: SamplingParams, rng: Rng): Promise<SampleResult> {
    const us = positions.map(() => uniformFor(params, rng)); // row order, as sampler.ts
    const rows = positions.map((p) => {
      const m = this.hidden[p];
      if (m === undefined || m < 0) throw new Error(`CompiledBatch: row ${p} read no token since its last draw; call step() first`);
      return m;
    });
    const pending = this.take();
    const T = params.temperature;
    const onDevice = T === 0 || (!(params.topK ?? 0) && (params.topP ?? 1) === 1);
    if (onDevice) {
      const r = await this.dec.pass(pending, rows, us, T);
      const bad = r.tokens.findIndex((t) => t < 0);
      if (bad >= 0) throw new NonFiniteError("the largest logit of a sampled row", NaN);
      return { tokens: Array.from(r.tokens), logprobs: Array.from(r.logprobs), readFloats: 2 * rows.length };
    }
    const { logits } = await this.dec.pass(pending, rows, [], 0, true);
    const V = logits!.length / rows.length;
    const scratch = new Scratch(V);
    const draws = rows.map((_, k) => sampleRow(logits!.subarray(k * V, (k + 1) * V), params, us[k], scratch, "rank"));
    return { tokens: draws.map((d) => d.token), logprobs: draws.map((d) => d.logprob), readFloats: logits!.length };
  }

  /** The logits of every row that read a token since the last draw, [rows × V] (zeros elsewhere). */
  async read(): Promise<Float32Array> {
    const rows = this.rows.filter((p) => this.hidden[p] >= 0);
    const { logits } = await this.dec.pass(
      this.take(),
      rows.map((p) => this.hidden[p]),
      [],
      0,
      true,
    );
    const V = rows.length > 0 ? logits!.length / rows.length : 0;
    const out = new Float32Array(this.rows.length * V);
    rows.forEach((p, k) => out.set(logits!.subarray(k * V, (k + 1) * V), p * V));
    return out;
  }

  step(feed: number[], done: (row: number) => boolean, hold?: boolean[]): void {
    const unread = this.take();
    if (unread.length > 0) this.dec.submit(unread); // nothing sampled from it: its keys and values still count
    for (const p of this.rows) {
      if (done(p) || hold?.[p]) continue;
      this.hidden[p] = this.pending.length;
      const s = this.src[p];
      this.pending.push({ token: feed[p], slot: p, pos: this.next[p]++, src: s.slot, srcLen: s.len });
    }
  }

  dispose(): void {
    this.pending = [];
  }

  private take(): PassRow[] {
    const p = this.pending;
    this.pending = [];
    this.hidden.fill(-1);
    return p;
  }
}
