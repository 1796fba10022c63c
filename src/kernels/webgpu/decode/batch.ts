/** A decode batch on the compiled decoder: what rollout/decode-batch.ts' DecodeBatch does over tfjs'
 *  forward, with the same calls, so the turn loop (rollout/rollout.ts) drives either one.
 *  - Each row owns a KV slot; a row's tokens go to its slot's next position. Rows that are done or
 *    held simply leave the pass (continuous batching: no cache compaction, no padding).
 *  - Rows whose prompts are equal (a GRPO group) share one prefill: the first such row's slot holds
 *    the prompt, the others read its positions from there (PassRow.src) and write only their own.
 *  - Reads many: a row may take several forced tokens in one step (a tool result, the next turn's
 *    header), all in one pass, causal by position.
 *  - One step ahead: when rows draw on the device, the pass that feeds each of them its drawn token
 *    (read from the slot's draw on the device, not from the host) and draws again is submitted before
 *    the host reads this draw. step() then finds those rows already run; a row that finished or waits
 *    for its environment had one extra token computed, which nothing reads (its next token, if any,
 *    overwrites that position). In a steady decode a step is one submit, and the GPU never waits for
 *    the host's turn loop.
 *  - Draws are keyed: the uniform of row r's token at position q is keyedUniform(seed, r, q), the seed
 *    taken once from the caller's rng, so a row draws the same tokens whatever else the batch holds
 *    and whichever pass computes them. Temperature 0 is the argmax, a temperature without top-k/top-p
 *    the whole-vocabulary id walk on the device (vocab.ts' kernel); top-k/top-p read each sampling
 *    row's 64 most likely tokens, found on the device, and draw them in rank order on the host
 *    (sampler.ts), one step at a time. */
import { NonFiniteError } from "../../../util/errors.ts";
import { keyedUniform, type Rng } from "../../../util/rng.ts";
import type { DecodeRows } from "../../../rollout/decode-batch.ts";
import { sampleRow, Scratch, type RowDraw, type SamplingParams } from "../../../rollout/sample-row.ts";
import { candidatesFor, drawCandidates, type SampleResult } from "../../../rollout/sampler.ts";
import { CAND_K } from "./layout.ts";
import { drawsOf, type Decoder, type PassRow } from "./decoder.ts";

/** Prompt tokens a prefill pass takes at most (with the decode rows, the decoder's pass capacity). */
export const PREFILL_ROWS = 256;

/** A pass in flight whose rows' hidden states the next draw reads. */
interface Ahead {
  slots: number[]; // its sampling rows, by slot
  read: Promise<Float32Array>;
  params: SamplingParams;
}

export class CompiledBatch implements DecodeRows {
  rows: number[];
  readonly readsMany = true;
  private readonly next: number[]; // each row's next position
  private readonly src: { slot: number; len: number }[]; // where a row reads its shared prompt
  private pending: PassRow[] = [];
  private hidden: number[]; // row → its pass row in `pending` whose output it samples from, −1: none
  private ahead: Ahead | null = null; // the pass submitted one step ahead
  private fedAhead = false; // the last draw submitted a pass ahead that the next step() has not matched yet
  private fromAhead: boolean[]; // row → its hidden state is in `ahead` (fed its drawn token)
  private drawnAhead = new Map<number, number>(); // row → the token it drew at the last sample
  private seed: number | null = null;

  constructor(
    private readonly dec: Decoder,
    prompts: number[][],
    o: { adapters?: boolean; maxNewTokens: number },
  ) {
    const N = prompts.length;
    this.rows = prompts.map((_, i) => i);
    const maxPrompt = Math.max(...prompts.map((p) => p.length));
    dec.prepare(N, maxPrompt + o.maxNewTokens + 1, Math.max(N, PREFILL_ROWS), o.adapters ?? true); // + 1: the token ahead
    const owner = new Map<string, number>();
    const ownerOf = prompts.map((p, i) => {
      const key = p.join(",");
      if (!owner.has(key)) owner.set(key, i);
      return owner.get(key)!;
    });
    this.src = prompts.map((p, i) => ({ slot: ownerOf[i], len: ownerOf[i] === i ? 0 : p.length }));
    this.next = prompts.map((p) => p.length);
    this.fromAhead = prompts.map(() => false);
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
    const T = params.temperature;
    if (T > 0) this.seed ??= Math.floor(rng.next() * 2 ** 32);
    const onDevice = T === 0 || (!(params.topK ?? 0) && (params.topP ?? 1) === 1);
    const u = (p: number, q: number) => (T === 0 ? 0 : keyedUniform(this.seed!, p, q));
    const ahead = this.ahead;
    this.ahead = null;
    // rows whose hidden state the pass ahead holds, and whose draw there used these settings
    const early = positions.filter((p) => this.fromAhead[p]);
    if (early.length > 0 && (!ahead || !onDevice || !sameParams(ahead.params, params)))
      throw new Error("CompiledBatch: a row fed ahead is drawn with other settings than the pass ahead drew it with");
    const late = positions.filter((p) => !this.fromAhead[p]);
    let rows: number[] = [];
    const pending = this.take((hidden) => {
      rows = late.map((p) => {
        const m = hidden[p];
        if (m === undefined || m < 0) throw new Error(`CompiledBatch: row ${p} read no token since its last draw; call step() first`);
        return m;
      });
    });
    if (!onDevice) return this.onHost(pending, positions, rows, params, u);
    // this step's pass (rows that read forced tokens or start: their draws), then the pass ahead
    const read =
      pending.length > 0
        ? this.dec.submit(
            pending,
            rows,
            late.map((p, k) => u(p, pending[rows[k]].pos + 1)),
            T,
            false,
            late,
            this.rows.length,
          )
        : null;
    const nextRows = positions.map((p) => ({ token: -1, slot: p, pos: this.next[p], ...this.srcOf(p) }));
    this.ahead = {
      slots: positions,
      read: this.dec.submit(
        nextRows,
        positions.map((_, k) => k),
        positions.map((p) => u(p, this.next[p] + 1)),
        T,
        false,
        positions,
        this.rows.length,
      )!,
      params,
    };
    this.fedAhead = true;
    // the draws: the rows fed ahead from the earlier pass ahead's read, the others from this step's
    const byRow = new Map<number, { token: number; logprob: number }>();
    const take = (data: Float32Array, slots: number[]) => {
      const d = drawsOf(data, slots);
      slots.forEach((p, k) => byRow.set(p, { token: d.tokens[k], logprob: d.logprobs[k] }));
    };
    if (early.length > 0) take(await ahead!.read, early);
    else ahead?.read.catch(() => {}); // its draws were not needed (rows that went on to read forced tokens)
    if (read) take(await read, late);
    const tokens = positions.map((p) => byRow.get(p)!.token);
    if (tokens.some((t) => t < 0)) throw new NonFiniteError("the largest logit of a sampled row", NaN);
    this.drawnAhead = new Map(positions.map((p, k) => [p, tokens[k]]));
    return { tokens, logprobs: positions.map((p) => byRow.get(p)!.logprob), readFloats: 2 * this.rows.length * (read ? 2 : 1) };
  }

  /** top-k/top-p: each row's K most likely tokens found on the device and read back (at most 520
   *  bytes a row), drawn by the host in rank order (sampler.ts drawCandidates); a row they cannot
   *  decide (a flat row, ties at the K-th value) has its logits read and drawn by the rank walk
   *  (sample-row.ts), as sampler.ts' candidate path does. */
  private async onHost(
    pending: PassRow[],
    positions: number[],
    rows: number[],
    params: SamplingParams,
    u: (p: number, q: number) => number,
  ): Promise<SampleResult> {
    const V = this.dec.vocabSize;
    const us = rows.map((m, k) => u(positions[k], pending[m].pos + 1));
    const K = candidatesFor(params, V);
    let draws: (RowDraw | null)[] = rows.map(() => null);
    let floats = 0;
    if (K <= CAND_K) {
      const data = (await this.dec.submit(pending, rows, [], params.temperature, false, undefined, undefined, K))!;
      const W = 2 + 2 * CAND_K,
        packed = new Float32Array(rows.length * (2 + 2 * K));
      rows.forEach((_, k) => packed.set(data.subarray(k * W, k * W + 2 + 2 * K), k * (2 + 2 * K)));
      draws = drawCandidates(packed, K, V, params, us);
      floats = data.length;
    } else await this.dec.pass(pending, rows, [], 0, true); // more candidates than a row reads back: whole rows
    const rest = draws.flatMap((d, k) => (d === null ? [k] : []));
    if (rest.length > 0) {
      const logits = await this.dec.readLogits(rest);
      const scratch = new Scratch(V);
      rest.forEach((k, i) => (draws[k] = sampleRow(logits.subarray(i * V, (i + 1) * V), params, us[k], scratch, "rank")));
      floats += logits.length;
    }
    const done = draws as RowDraw[];
    return { tokens: done.map((d) => d.token), logprobs: done.map((d) => d.logprob), readFloats: floats };
  }

  /** The logits of every row that read a token since the last draw, [rows × V] (zeros elsewhere). */
  async read(): Promise<Float32Array> {
    if (this.ahead) throw new Error("CompiledBatch: read() after an on-device draw; a batch either draws or reads");
    const rows = this.rows.filter((p) => this.hidden[p] >= 0);
    let at: number[] = [];
    const pending = this.take((hidden) => (at = rows.map((p) => hidden[p])));
    const { logits } = await this.dec.pass(pending, at, [], 0, true);
    const V = rows.length > 0 ? logits!.length / rows.length : 0;
    const out = new Float32Array(this.rows.length * V);
    rows.forEach((p, k) => out.set(logits!.subarray(k * V, (k + 1) * V), p * V));
    return out;
  }

  /** feed[p]: the token row p reads, or (readsMany) the tokens it reads in order. */
  step(feed: (number | number[])[], done: (row: number) => boolean, hold?: boolean[]): void {
    const unread = this.take();
    if (unread.length > 0) this.dec.submit(unread); // nothing sampled from it: its keys and values still count
    // the rows the last draw's pass ahead fed (a step nothing drew in has none)
    const fed = this.fedAhead;
    this.fedAhead = false;
    for (const p of this.rows) {
      this.fromAhead[p] = false;
      if (done(p) || hold?.[p]) continue;
      let toks = typeof feed[p] === "number" ? [feed[p] as number] : (feed[p] as number[]);
      const drew = fed ? this.drawnAhead.get(p) : undefined;
      if (drew !== undefined) {
        // the pass ahead fed this row the token it drew: that is its first token here
        if (toks[0] !== drew)
          throw new Error(`CompiledBatch: row ${p} was fed ${toks[0]} where it drew ${drew}; a drawing row reads its draw first`);
        this.next[p]++;
        toks = toks.slice(1);
        if (toks.length === 0) {
          this.fromAhead[p] = true;
          continue;
        }
      }
      const s = this.srcOf(p);
      for (const token of toks) {
        this.hidden[p] = this.pending.length;
        this.pending.push({ token, slot: p, pos: this.next[p]++, ...s });
      }
    }
  }

  dispose(): void {
    this.pending = [];
    this.ahead?.read.catch(() => {}); // its read frees its buffer when it lands
    this.ahead = null;
    this.fedAhead = false;
  }

  private srcOf(p: number): { src: number; srcLen: number } {
    return { src: this.src[p].slot, srcLen: this.src[p].len };
  }

  /** The rows read since the last draw, for one pass; `hidden` is cleared. Where they are more than a
   *  pass holds (tool results read at once), the rows nothing is drawn from go first in passes of
   *  their own (a slot's tokens keep their order: its last token is the one drawn from), and `hidden`
   *  is renumbered into what is returned first, so a caller maps its rows before it takes. */
  private take(map?: (hidden: number[]) => void): PassRow[] {
    let rows = this.pending;
    this.pending = [];
    const cap = this.dec.rowsCapacity;
    if (rows.length > cap) {
      const drawn = new Set(this.hidden.filter((m) => m >= 0));
      const early = rows.filter((_, m) => !drawn.has(m));
      for (let i = 0; i < early.length; i += cap) this.dec.submit(early.slice(i, i + cap));
      const kept = rows.flatMap((_, m) => (drawn.has(m) ? [m] : []));
      const at = new Map(kept.map((m, i) => [m, i]));
      this.hidden = this.hidden.map((m) => (m >= 0 ? at.get(m)! : -1));
      rows = kept.map((m) => rows[m]);
    }
    map?.(this.hidden);
    this.hidden.fill(-1);
    return rows;
  }
}

const sameParams = (a: SamplingParams, b: SamplingParams) =>
  a.temperature === b.temperature && (a.topP ?? 1) === (b.topP ?? 1) && (a.topK ?? 0) === (b.topK ?? 0);
