/** Batched, grouped, multi-turn rollouts with tools executed inside the decode loop.
 *
 *  B prompts × G samples run as one decode batch over one KV cache (decode-batch.ts, which the
 *  OpenAI server's batcher runs too). Every step each live row advances exactly one token: it either
 *  samples one (loss mask 1, its sampling log-prob kept) or consumes the next forced token from its
 *  queue (mask 0): the rendered tool response plus the template's next assistant header. A sampled
 *  <|im_end|> / <|endoftext|> closes a turn; the turn is parsed for tool calls, the calls of all rows
 *  closing a turn in this step run concurrently, and their rendered results are queued. A turn
 *  without calls or parse errors is the final answer. Finished rows leave the cache in bulk (cache.select)
 *  once enough of them pile up.
 *  With environments a closed turn is an action: its step runs while the other rows keep decoding,
 *  the row held meanwhile (it reads nothing: ForwardOptions.hold), so the steps of rows that close
 *  their turns at different tokens overlap; the loop waits only when every live row is waiting. Each
 *  row then draws from its own random stream, so which row samples when does not change its tokens.
 *  A row whose first observation cannot fit the context with maxNewTokens fails alone (env_error).
 *  Leaves out: rewards (rewards.ts), the JSONL log (trajectories.ts), speculative or paged decoding. */
import { toolSchema, type Tool } from "../agents/types.ts";
import type { CausalLM, ChatMessage, Tokenizer } from "../model/types.ts";
import { DecodeBatch, type DecodeRows } from "./decode-batch.ts";
import { checkSamplingParams, type SampleResult } from "./sampler.ts";
import { ToolResponseRenderer, toolTurn } from "./tool-messages.ts";
import { Rng } from "../util/rng.ts";
import type { FinishReason, RolloutConfig, Trajectory, TurnRecord } from "./types.ts";

export type { RolloutConfig, RolloutStepInfo, Trajectory, TurnRecord, ToolCallRecord, FinishReason } from "./types.ts";

interface Row {
  traj: Trajectory;
  forced: number[]; // queue of tokens the row must read before it samples again
  turnIds: number[]; // tokens sampled in the current turn
  turn: number; // 1-based index of the current assistant turn
  done: boolean;
}

/** A rollout before its first token: the prompt, nothing generated, no calls counted. */
export function newTrajectory(promptIndex: number, sampleIndex: number, promptIds: number[]): Trajectory {
  return {
    promptIndex,
    sampleIndex,
    promptIds,
    completionIds: [],
    lossMask: [],
    sampleLogprobs: [],
    turns: [],
    finalText: "",
    finishReason: "length",
    truncated: false,
    numToolCalls: 0,
    numToolErrors: 0,
    numParseErrors: 0,
    numUnknownTools: 0,
  };
}

/** The tokens that close an assistant turn: <|im_end|> (eos) and <|endoftext|>. */
/** Each prompt as the model reads it: the chat template with the tool schemas (unless toolsInPrompt
 *  is false) and the assistant header, tokenized once. */
export function encodePrompts(
  tokenizer: Tokenizer,
  prompts: ChatMessage[][],
  cfg: Pick<RolloutConfig, "tools" | "toolsInPrompt">,
): number[][] {
  const schemas = cfg.tools.map(toolSchema);
  const tools = (cfg.toolsInPrompt ?? true) && schemas.length > 0 ? schemas : undefined;
  return prompts.map((m) => tokenizer.encode(tokenizer.applyChatTemplate(m, { tools, addGenerationPrompt: true })));
}

export function stopTokenIds(tokenizer: Tokenizer): Set<number> {
  return new Set([tokenizer.eosTokenId, tokenizer.tokenToId("<|endoftext|>") ?? tokenizer.padTokenId]);
}

export async function rolloutGroups(
  model: CausalLM,
  tokenizer: Tokenizer,
  prompts: ChatMessage[][],
  cfg: RolloutConfig,
): Promise<Trajectory[]> {
  checkConfig(prompts, cfg);
  // a decode step then runs no LoRA products: the adapter's deltas are added into the held f32 base
  // (not for a batch of another decoder's, which reads the base as the trainer holds it)
  const release = cfg.openBatch ? undefined : model.unpackBase?.({ mergeAdapter: cfg.adapters ?? true });
  try {
    return await generate(model, tokenizer, prompts, cfg);
  } finally {
    release?.();
  }
}

async function generate(model: CausalLM, tokenizer: Tokenizer, prompts: ChatMessage[][], cfg: RolloutConfig): Promise<Trajectory[]> {
  const G = cfg.samplesPerPrompt;
  const adapters = cfg.adapters ?? true;
  const compactFraction = cfg.compactFraction ?? 0.25;
  const tools = new Map<string, Tool>(cfg.tools.map((t) => [t.name, t]));
  const renderer = new ToolResponseRenderer(tokenizer);
  const userRenderer = new ToolResponseRenderer(tokenizer, "user");
  const stopIds = stopTokenIds(tokenizer);
  const sampling = { temperature: cfg.temperature, topP: cfg.topP, topK: cfg.topK };

  const promptIds = encodePrompts(tokenizer, prompts, cfg);
  const context = model.config.maxPositionEmbeddings;

  const rows: Row[] = [];
  for (let p = 0; p < prompts.length; p++)
    for (let g = 0; g < G; g++)
      rows.push({
        traj: { ...newTrajectory(p, g, promptIds[p]), ...(cfg.envs ? { envReward: 0 } : {}) },
        forced: [],
        turnIds: [],
        turn: 1,
        done: false,
      });

  const finish = (row: Row, reason: FinishReason) => {
    row.done = true;
    row.traj.finishReason = reason;
    row.traj.truncated = reason === "length";
    if (row.turnIds.length > 0) {
      // The budget ran out inside a turn: keep what was written, unparsed.
      const text = tokenizer.decode(row.turnIds);
      row.traj.turns.push({ text, content: text, toolCalls: [], parseErrors: [], ended: false });
      row.turnIds = [];
    }
    const last = row.traj.turns[row.traj.turns.length - 1];
    row.traj.finalText = last ? last.content : "";
  };

  // With environments, a closed turn is an action: the row's environment reads it from the turn and
  // steps; its observation is queued. The episode's score is the environment's own (envs/families.ts).
  const envTurn = async (row: Row, r: number, text: string) => {
    const turn: TurnRecord = { text, content: text, toolCalls: [], parseErrors: [], ended: true };
    row.traj.turns.push(turn);
    try {
      const out = await cfg.envs![r].step(text);
      if (row.done) return; // aborted while the step ran
      Object.assign(turn, { action: out.action, observation: out.observation, reward: out.reward });
      row.traj.envReward = out.score;
      row.traj.envSuccess = out.success;
      if (out.done) return finish(row, "stop");
    } catch (err) {
      if (row.done) return;
      row.traj.envError = (err as Error).message;
      return finish(row, "env_error");
    }
    if (row.turn >= cfg.maxTurns) return finish(row, "max_turns");
    if (row.traj.completionIds.length >= cfg.maxNewTokens) return finish(row, "length");
    row.forced = tokenizer.encode(userRenderer.render([turn.observation!]));
    row.turn++;
  };

  // A sampled stop token closed the row's current turn: parse it, run its calls, decide what follows.
  const endTurn = async (row: Row) => {
    const text = tokenizer.decode(row.turnIds.slice(0, -1)); // without the stop token
    row.turnIds = [];
    if (cfg.envs) return envTurn(row, rows.indexOf(row), text);
    const results = await toolTurn(row.traj, text, tools);
    if (results === null) return finish(row, "stop");
    if (row.turn >= cfg.maxTurns) return finish(row, "max_turns");
    if (row.traj.completionIds.length >= cfg.maxNewTokens) return finish(row, "length");
    row.forced = tokenizer.encode(renderer.render(results));
    row.turn++;
  };

  // A row whose environment never started (envs/types.ts failedEnvironment) ends before its first token.
  cfg.envs?.forEach((env, i) => {
    if (env.failure === undefined) return;
    rows[i].traj.envError = env.failure;
    finish(rows[i], "env_error");
  });
  // An observation is the environment's text, not the run's configuration: a row it makes too long
  // for the context fails alone, as a row whose environment failed does.
  if (cfg.envs)
    for (const r of rows)
      if (!r.done && r.traj.promptIds.length + cfg.maxNewTokens > context) {
        r.traj.envError = `the first observation makes a prompt of ${r.traj.promptIds.length} tokens; with maxNewTokens ${cfg.maxNewTokens} it passes the model's context of ${context} tokens`;
        finish(r, "env_error");
      }
  if (rows.every((r) => r.done)) return rows.map((r) => r.traj);

  // A row that ended before its first token is prefilled as its last prompt token alone (it is
  // dropped from the cache at the first compaction; its prompt may not even fit the context).
  const inputs = rows.map((r) => (r.done ? r.traj.promptIds.slice(-1) : r.traj.promptIds));
  const maxPrompt = Math.max(...inputs.map((p) => p.length));
  if (maxPrompt + cfg.maxNewTokens > context)
    throw new Error(
      `longest prompt (${maxPrompt} tokens) + maxNewTokens ${cfg.maxNewTokens} exceeds the model's max_position_embeddings ${context}`,
    );
  const pad = tokenizer.padTokenId;
  // Environment rows draw from a stream each (see the header); tool rows share cfg.rng, row order.
  const rowRngs = cfg.envs ? rows.map(() => new Rng(Math.floor(cfg.rng.next() * 2 ** 32))) : null;
  // Rows whose environment step is in flight. Past holdSteps decode steps rows stop riding along held
  // (each held step lengthens the cache by one masked position) and a closing turn is waited for.
  const pending = new Map<Row, Promise<void>>();
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
        for (const row of rows) if (!row.done) finish(row, "aborted");
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
      const closing: Row[] = [];
      let nSampled = 0,
        nForced = 0;
      cacheRows.forEach((r, pos) => {
        const row = rows[r];
        if (row.done) return void feed.push(pad); // waits to be dropped from the cache; output ignored
        if (pending.has(row) && row.forced.length === 0) return (void feed.push(pad), void (hold[pos] = true)); // reads nothing this step
        const t = row.traj;
        let tok: number;
        if (row.forced.length > 0) {
          // one forced token a step, or (a batch that reads many) all of them the budget allows at once
          const n = batch.readsMany ? Math.min(row.forced.length, cfg.maxNewTokens - t.completionIds.length) : 1;
          const toks = row.forced.splice(0, n);
          for (const f of toks) {
            t.completionIds.push(f);
            t.lossMask.push(0);
            t.sampleLogprobs.push(0); // the tool or template wrote it
            nForced++;
            cfg.onToken?.(r, f, true);
          }
          if (n > 1) {
            feed.push(toks);
            if (t.completionIds.length >= cfg.maxNewTokens) finish(row, "length");
            return;
          }
          tok = toks[0];
        } else {
          const k = drawIndex[pos];
          tok = drawn!.tokens[k];
          t.completionIds.push(tok);
          t.lossMask.push(1);
          t.sampleLogprobs.push(drawn!.logprobs[k]);
          row.turnIds.push(tok);
          nSampled++;
          cfg.onToken?.(r, tok, false);
          if (stopIds.has(tok)) closing.push(row);
        }
        feed.push(tok);
        // A closing turn is judged in endTurn: a final answer on the last budgeted token is a "stop".
        if (closing[closing.length - 1] !== row && t.completionIds.length >= cfg.maxNewTokens) finish(row, "length");
      });
      if (cfg.envs) {
        for (const row of closing)
          pending.set(
            row,
            endTurn(row).finally(() => pending.delete(row)),
          );
        if (step >= holdSteps) await Promise.all(pending.values());
      } else await Promise.all(closing.map(endTurn));

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

function checkConfig(prompts: ChatMessage[][], cfg: RolloutConfig): void {
  if (prompts.length === 0) throw new Error("rolloutGroups needs at least one prompt; got 0");
  const int = (name: string, v: number, min: number) => {
    if (!(Number.isInteger(v) && v >= min)) throw new Error(`${name} ${v} is invalid; accepted: an integer >= ${min}`);
  };
  int("samplesPerPrompt", cfg.samplesPerPrompt, 1);
  int("maxNewTokens", cfg.maxNewTokens, 1);
  int("maxTurns", cfg.maxTurns, 1);
  checkSamplingParams({ temperature: cfg.temperature, topP: cfg.topP, topK: cfg.topK });
  const f = cfg.compactFraction ?? 0.25;
  if (!(f > 0 && f <= 1)) throw new Error(`compactFraction ${f} is invalid; accepted: a number in (0, 1]`);
  if (cfg.envs && cfg.envs.length !== prompts.length * cfg.samplesPerPrompt)
    throw new Error(
      `envs: ${cfg.envs.length} environments for ${prompts.length} prompts × ${cfg.samplesPerPrompt} samples; one per row is needed`,
    );
  const names = cfg.tools.map((t) => t.name);
  const dup = names.find((n, i) => names.indexOf(n) !== i);
  if (dup !== undefined) throw new Error(`tool name "${dup}" appears twice; accepted: unique tool names`);
}
