/** Grouped multi-turn rollouts on an engine that continues a row's token ids up to its next stop
 *  token (a TurnCompleter): an OpenAI-compatible server (engines/openai.ts) or llama.cpp in this
 *  process (engines/llama.ts). The trainer keeps the chat template, the tools and the environments:
 *  a row's ids so far (prompt, the turns before, tool responses, the next assistant header) go to the
 *  completer and its token ids are appended as they are, so nothing is re-tokenized. A turn is judged
 *  as rollout.ts judges it (tool calls run in the loop, their rendered results forced with loss mask
 *  0; a final answer ends the row; the turn and token budgets stop it with "max_turns" / "length";
 *  with environments each turn is an action and the observation is forced), and the completer's
 *  log-probs are kept as the behaviour log-probs (sampleLogprobs). Every row runs its own loop, so a
 *  row whose tool answered asks for its next turn at once and the completer batches whatever rows are
 *  asking (continuous batching); no row waits for the others' turns. Draws come from the completer's
 *  seeded sampler (seed per row and turn), so the tokens differ from a local run of the same seed.
 *  onToken sees a turn's tokens once the turn is back (not one by one); an abort (cfg.signal) stops
 *  every row at its next turn and is handed to the completer, which may cut the turn short. */
import { type Tool } from "../agents/types.ts";
import type { ChatMessage, Tokenizer } from "../model/types.ts";
import { encodePrompts, newTrajectory, stopTokenIds } from "./rollout.ts";
import { ToolResponseRenderer, toolTurn } from "./tool-messages.ts";
import type { FinishReason, RolloutConfig, Trajectory, TurnRecord } from "./types.ts";

export interface TurnSampling {
  maxTokens: number;
  temperature: number;
  topP: number;
  topK: number; // 0: off
  seed: number;
  stopTokenIds: number[];
  signal?: AbortSignal;
}

export interface TurnCompletion {
  ids: number[];
  logprobs: number[]; // of each id under the engine's model (NaN where the engine gave none)
  finishReason: "stop" | "length";
}

/** An engine's side of the turn loop. */
export interface TurnCompleter {
  /** Row `row`'s next tokens after `ids` (everything it holds so far), up to its first stop token or
   *  maxTokens. A row asks again only after its previous answer came. */
  complete(row: number, ids: number[], p: TurnSampling): Promise<TurnCompletion>;
  /** Row `row` is finished: what the engine keeps for it may go. */
  release?(row: number): void;
}

export type TurnRolloutConfig = Omit<RolloutConfig, "rng" | "adapters" | "deviceSampling" | "compactFraction"> & {
  /** Seeds the engine's draws: row r's turn k uses a seed derived from (seed, r, k). */
  seed: number;
  maxPositions: number; // the trainer's model's context: prompt + budget must fit
};

export async function turnRollouts(
  engine: TurnCompleter,
  tokenizer: Tokenizer,
  prompts: ChatMessage[][],
  cfg: TurnRolloutConfig,
): Promise<Trajectory[]> {
  const tools = new Map<string, Tool>(cfg.tools.map((t) => [t.name, t]));
  const renderer = new ToolResponseRenderer(tokenizer);
  const userRenderer = new ToolResponseRenderer(tokenizer, "user");
  const stopIds = stopTokenIds(tokenizer);
  const G = cfg.samplesPerPrompt;
  if (cfg.envs && cfg.envs.length !== prompts.length * G)
    throw new Error(`envs: ${cfg.envs.length} environments for ${prompts.length} prompts × ${G} samples; one per row is needed`);
  const promptIds = encodePrompts(tokenizer, prompts, cfg);
  const rows = promptIds.flatMap((ids, p) =>
    Array.from({ length: G }, (_, g) => ({
      traj: { ...newTrajectory(p, g, ids), ...(cfg.envs ? { envReward: 0 } : {}) },
      turn: 1,
      done: false,
    })),
  );
  type Row = (typeof rows)[number];
  // A row whose environment never started, or whose first observation cannot fit the context with the
  // budget, fails alone (env_error); any other prompt too long for the context is the run's error.
  cfg.envs?.forEach((env, r) => {
    const t = rows[r].traj;
    if (env.failure !== undefined) t.envError = env.failure;
    else if (t.promptIds.length + cfg.maxNewTokens > cfg.maxPositions)
      t.envError = `the first observation makes a prompt of ${t.promptIds.length} tokens; with maxNewTokens ${cfg.maxNewTokens} it passes the model's context of ${cfg.maxPositions} tokens`;
    if (t.envError !== undefined) [rows[r].done, t.finishReason] = [true, "env_error"];
  });
  const longest = Math.max(0, ...rows.filter((r) => !r.done).map((r) => r.traj.promptIds.length));
  if (longest + cfg.maxNewTokens > cfg.maxPositions)
    throw new Error(
      `longest prompt (${longest} tokens) + maxNewTokens ${cfg.maxNewTokens} exceeds the model's ` +
        `max_position_embeddings ${cfg.maxPositions}`,
    );

  const finish = (row: Row, reason: FinishReason, unfinished?: number[]) => {
    row.done = true;
    row.traj.finishReason = reason;
    row.traj.truncated = reason === "length";
    if (unfinished && unfinished.length > 0) {
      const text = tokenizer.decode(unfinished); // the budget ran out inside a turn: kept unparsed
      row.traj.turns.push({ text, content: text, toolCalls: [], parseErrors: [], ended: false });
    }
    row.traj.finalText = row.traj.turns.at(-1)?.content ?? "";
  };

  // Forced tokens (tool responses, observations, the next header) count against the budget like sampled ones.
  const force = (row: Row, ids: number[]) => {
    const room = cfg.maxNewTokens - row.traj.completionIds.length;
    for (const id of ids.slice(0, room)) {
      row.traj.completionIds.push(id);
      row.traj.lossMask.push(0);
      row.traj.sampleLogprobs.push(0);
      cfg.onToken?.(rows.indexOf(row), id, true);
    }
    if (ids.length >= room) finish(row, "length");
  };

  // One closed turn: its tool calls or its environment step, and what the row reads next.
  const endTurn = async (row: Row, r: number, turnIds: number[]) => {
    const text = tokenizer.decode(turnIds.slice(0, -1)); // without the stop token
    let next: string;
    if (cfg.envs) {
      const turn: TurnRecord = { text, content: text, toolCalls: [], parseErrors: [], ended: true };
      row.traj.turns.push(turn);
      try {
        const out = await cfg.envs[r].step(text);
        Object.assign(turn, { action: out.action, observation: out.observation, reward: out.reward });
        row.traj.envReward = out.score;
        row.traj.envSuccess = out.success;
        if (out.done) return finish(row, "stop");
      } catch (err) {
        row.traj.envError = (err as Error).message;
        return finish(row, "env_error");
      }
      next = userRenderer.render([turn.observation!]);
    } else {
      const results = await toolTurn(row.traj, text, tools);
      if (results === null) return finish(row, "stop");
      next = renderer.render(results);
    }
    if (row.turn >= cfg.maxTurns) return finish(row, "max_turns");
    if (row.traj.completionIds.length >= cfg.maxNewTokens) return finish(row, "length");
    force(row, tokenizer.encode(next));
    row.turn++;
  };

  const stops = [...stopIds];
  let failure: { reason: unknown } | null = null; // once a row failed, the others stop at their next turn
  const runRow = async (row: Row, r: number) => {
    while (!row.done && failure === null) {
      if (cfg.signal?.aborted) return finish(row, "aborted");
      const room = cfg.maxNewTokens - row.traj.completionIds.length;
      const out = await engine.complete(r, [...row.traj.promptIds, ...row.traj.completionIds], {
        maxTokens: room,
        temperature: cfg.temperature,
        topP: cfg.topP,
        topK: cfg.topK,
        seed: turnSeed(cfg.seed, r, row.turn),
        stopTokenIds: stops,
        signal: cfg.signal,
      });
      let ids = out.ids.slice(0, room),
        logprobs = out.logprobs.slice(0, room);
      const cut = ids.findIndex((id) => stopIds.has(id)); // a turn ends at its first stop token
      if (cut !== -1) [ids, logprobs] = [ids.slice(0, cut + 1), logprobs.slice(0, cut + 1)];
      else if (out.finishReason === "stop" && ids.length < room) {
        // An engine that stopped without returning its stop token: close the turn with eos (no log-prob).
        ids = [...ids, tokenizer.eosTokenId];
        logprobs = [...logprobs, NaN];
      }
      for (let k = 0; k < ids.length; k++) {
        row.traj.completionIds.push(ids[k]);
        row.traj.lossMask.push(1);
        row.traj.sampleLogprobs.push(logprobs[k]);
        cfg.onToken?.(r, ids[k], false);
      }
      if (cfg.signal?.aborted && !stopIds.has(ids.at(-1)!)) finish(row, "aborted", ids);
      else if (stopIds.has(ids.at(-1)!)) await endTurn(row, r, ids);
      else finish(row, "length", ids); // the budget (or the context) ran out inside the turn
    }
  };
  // No request is left in flight when this returns or throws: the first failure is thrown once every
  // row has stopped.
  await Promise.allSettled(
    rows.map((row, r) =>
      runRow(row, r)
        .catch((reason) => void (failure ??= { reason }))
        .finally(() => engine.release?.(r)),
    ),
  );
  if (failure !== null) throw (failure as { reason: unknown }).reason;
  return rows.map((r) => r.traj);
}

/** The engine's seed for row r's turn k of a step seeded `seed` (32-bit, as vLLM takes it). */
export function turnSeed(seed: number, row: number, turn: number): number {
  let h = (seed >>> 0) ^ 0x9e3779b9;
  for (const x of [row, turn]) h = Math.imul(h ^ x, 0x85ebca6b) >>> 0;
  return h >>> 1; // non-negative int32
}
