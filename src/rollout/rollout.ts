/** Batched, grouped, multi-turn rollouts with tools executed inside the decode loop.
 *
 *  B prompts × G samples run as one decode batch over one KV cache (decode-batch.ts, which the
 *  OpenAI server's batcher runs too). Every step each live row advances exactly one token: it either
 *  samples one or consumes the next forced token from its queue (episode.ts holds what a token means:
 *  masks, turn ends, tool calls, limits). The calls of all rows closing a turn in this step run
 *  concurrently. Finished rows leave the cache in bulk (cache.select) once enough of them pile up.
 *  With environments a closed turn is an action: its step runs while the other rows keep decoding,
 *  the row held meanwhile (it reads nothing: ForwardOptions.hold), so the steps of rows that close
 *  their turns at different tokens overlap; the loop waits only when every live row is waiting. Each
 *  row then draws from its own random stream, so which row samples when does not change its tokens.
 *  Leaves out: rewards (rewards.ts), the JSONL log (trajectories.ts), speculative or paged decoding. */
import type { CausalLM, ChatMessage, Tokenizer } from "../model/types.ts";
import { DecodeBatch, type DecodeRows } from "./decode-batch.ts";
import { Episodes, type EpisodeRow } from "./episode.ts";
import { checkSamplingParams, type SampleResult } from "./sampler.ts";
import { Rng } from "../util/rng.ts";
import type { RolloutConfig, Trajectory } from "./types.ts";

export type { RolloutConfig, RolloutStepInfo, Trajectory, TurnRecord, ToolCallRecord, FinishReason } from "./types.ts";
export { encodePrompts, stopTokenIds } from "./episode.ts";

export async function rolloutGroups(
  model: CausalLM,
  tokenizer: Tokenizer,
  prompts: ChatMessage[][],
  cfg: RolloutConfig,
): Promise<Trajectory[]> {
  checkSamplingParams({ temperature: cfg.temperature, topP: cfg.topP, topK: cfg.topK });
  const f = cfg.compactFraction ?? 0.25;
  if (!(f > 0 && f <= 1)) throw new Error(`compactFraction ${f} is invalid; accepted: a number in (0, 1]`);
  const episodes = new Episodes(tokenizer, prompts, cfg, model.config.maxPositionEmbeddings);
  if (episodes.rows.every((r) => r.done)) return episodes.rows.map((r) => r.traj);
  // a decode step then runs no LoRA products: the adapter's deltas are added into the held f32 base
  // (not for a batch of another decoder's, which reads the base as the trainer holds it)
  const release = cfg.openBatch ? undefined : model.unpackBase?.({ mergeAdapter: cfg.adapters ?? true });
  try {
    return await generate(model, tokenizer, episodes, cfg);
  } finally {
    release?.();
  }
}

async function generate(model: CausalLM, tokenizer: Tokenizer, ep: Episodes, cfg: RolloutConfig): Promise<Trajectory[]> {
  const rows = ep.rows;
  const adapters = cfg.adapters ?? true;
  const compactFraction = cfg.compactFraction ?? 0.25;
  const sampling = { temperature: cfg.temperature, topP: cfg.topP, topK: cfg.topK };
  // A row that ended before its first token is prefilled as its last prompt token alone (it is
  // dropped from the cache at the first compaction; its prompt may not even fit the context).
  const inputs = rows.map((r) => (r.done ? r.traj.promptIds.slice(-1) : r.traj.promptIds));
  const pad = tokenizer.padTokenId;
  // Environment rows draw from a stream each (see the header); tool rows share cfg.rng, row order.
  const rowRngs = cfg.envs ? rows.map(() => new Rng(Math.floor(cfg.rng.next() * 2 ** 32))) : null;
  // Rows whose environment step is in flight. Past holdSteps decode steps rows stop riding along held
  // (each held step lengthens the cache by one masked position) and a closing turn is waited for.
  const pending = new Map<EpisodeRow, Promise<void>>();
  const holdSteps = 2 * cfg.maxNewTokens;
  const signal = cfg.signal;
  let onAbort: (() => void) | undefined; // removed at the end: one signal serves a whole run's rollouts
  const aborted = signal
    ? new Promise<void>((resolve) => signal.addEventListener("abort", (onAbort = () => resolve()), { once: true }))
    : null;

  const opts = { pad, adapters, compactFraction, maxNewTokens: cfg.maxNewTokens };
  const batch: DecodeRows = cfg.openBatch ? cfg.openBatch(inputs, opts) : new DecodeBatch(model, inputs, opts); // prefilled
  try {
    for (let step = 0; ; step++) {
      // Let I/O events in: an abort (Ctrl-C), an environment's reply (its row then reads on at once,
      // not when every other row waits too).
      if (cfg.signal || pending.size > 0) await new Promise((resolve) => setImmediate(resolve));
      if (cfg.signal?.aborted) {
        for (const row of rows) if (!row.done) ep.finish(row, "aborted");
        break;
      }
      // No live row can take a token while all of them wait for their environment: wait for one.
      if (pending.size > 0 && rows.every((r) => r.done || pending.has(r))) {
        await Promise.race([...pending.values(), ...(aborted ? [aborted] : [])]);
        if (signal?.aborted) continue; // the check above ends every row
        if (rows.every((r) => r.done)) break;
      }
      // Sample only for rows that are not reading forced tokens or waiting for their environment.
      const cacheRows = batch.rows; // cache position → row index
      const samplers = cacheRows
        .map((r, pos) => (!rows[r].done && rows[r].forced.length === 0 && !pending.has(rows[r]) ? pos : -1))
        .filter((p) => p >= 0);
      const drawIndex = new Array<number>(cacheRows.length).fill(-1); // cache position → row of `drawn`
      samplers.forEach((pos, k) => (drawIndex[pos] = k));
      let drawn: SampleResult | null = null;
      if (samplers.length > 0) {
        let k = 0; // sampleTokens draws one uniform per sampling row, in order
        const rng = rowRngs ? ({ next: () => rowRngs[cacheRows[samplers[k++]]].next() } as unknown as Rng) : cfg.rng;
        drawn = await batch.sample(samplers, sampling, rng, { onDevice: cfg.deviceSampling });
      }

      const feed: (number | number[])[] = [];
      const hold: boolean[] = new Array<boolean>(cacheRows.length).fill(false);
      const closing: EpisodeRow[] = [];
      let nSampled = 0,
        nForced = 0;
      cacheRows.forEach((r, pos) => {
        const row = rows[r];
        if (row.done) return void feed.push(pad); // waits to be dropped from the cache; output ignored
        if (pending.has(row) && row.forced.length === 0) return (void feed.push(pad), void (hold[pos] = true)); // reads nothing this step
        if (row.forced.length > 0) {
          // one forced token a step, or (a batch that reads many) all of them the budget allows at once
          const toks = ep.readForced(row, batch.readsMany ? Infinity : 1);
          nForced += toks.length;
          return void feed.push(toks.length > 1 ? toks : toks[0]);
        }
        const k = drawIndex[pos];
        nSampled++;
        if (ep.sampled(row, drawn!.tokens[k], drawn!.logprobs[k])) closing.push(row);
        feed.push(drawn!.tokens[k]);
      });
      if (cfg.envs) {
        for (const row of closing)
          pending.set(
            row,
            ep.endTurn(row).finally(() => pending.delete(row)),
          );
        if (step >= holdSteps) await Promise.all(pending.values());
      } else await Promise.all(closing.map((row) => ep.endTurn(row)));

      const live = rows.filter((r) => !r.done).length;
      const readFloats = drawn?.readFloats ?? 0;
      cfg.onStep?.({ step, live, total: rows.length, cacheRows: cacheRows.length, sampled: nSampled, forced: nForced, readFloats });
      if (live === 0) break;
      batch.step(feed, (r) => rows[r].done, hold); // finished rows leave the cache once enough pile up
    }
  } finally {
    batch.dispose();
    if (onAbort) signal!.removeEventListener("abort", onAbort);
    await Promise.allSettled(pending.values()); // an aborted row's step still in flight (bounded by its time limit)
  }
  return rows.map((r) => r.traj);
}
