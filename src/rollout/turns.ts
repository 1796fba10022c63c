/** Grouped multi-turn rollouts on an engine that continues a row's token ids up to its next stop
 *  token (a TurnCompleter): an OpenAI-compatible server (engines/openai.ts) or llama.cpp in this
 *  process (engines/llama.ts). The trainer keeps the chat template, the tools and the environments:
 *  a row's ids so far (prompt, the turns before, tool responses, the next assistant header) go to the
 *  completer and its token ids are appended as they are, so nothing is re-tokenized. A turn is judged
 *  by episode.ts, as the token loop (rollout.ts) judges it, and the completer's log-probs are kept as
 *  the behaviour log-probs (sampleLogprobs). Every row runs its own loop, so a row whose tool answered
 *  asks for its next turn at once and the completer batches whatever rows are asking (continuous
 *  batching); no row waits for the others' turns. Draws come from the completer's seeded sampler
 *  (seed per row and turn), so the tokens differ from a local run of the same seed. onToken sees a
 *  turn's tokens once the turn is back (not one by one); an abort (cfg.signal) stops every row at its
 *  next turn and is handed to the completer, which may cut the turn short. */
import type { ChatMessage, Tokenizer } from "../model/types.ts";
import { Episodes, type EpisodeRow } from "./episode.ts";
import type { RolloutConfig, Trajectory } from "./types.ts";

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
  const ep = new Episodes(tokenizer, prompts, cfg, cfg.maxPositions);
  const stops = [...ep.stopIds];
  let failure: { reason: unknown } | null = null; // once a row failed, the others stop at their next turn
  const runRow = async (row: EpisodeRow) => {
    while (!row.done && failure === null) {
      if (cfg.signal?.aborted) return ep.finish(row, "aborted");
      const room = ep.room(row);
      const out = await engine.complete(row.index, [...row.traj.promptIds, ...row.traj.completionIds], {
        maxTokens: room,
        temperature: cfg.temperature,
        topP: cfg.topP,
        topK: cfg.topK,
        seed: turnSeed(cfg.seed, row.index, row.turn),
        stopTokenIds: stops,
        signal: cfg.signal,
      });
      let ids = out.ids.slice(0, room),
        logprobs = out.logprobs.slice(0, room);
      const cut = ids.findIndex((id) => ep.stopIds.has(id)); // a turn ends at its first stop token
      if (cut !== -1) [ids, logprobs] = [ids.slice(0, cut + 1), logprobs.slice(0, cut + 1)];
      else if (out.finishReason === "stop" && ids.length < room) {
        // An engine that stopped without returning its stop token: close the turn with eos (no log-prob).
        ids = [...ids, tokenizer.eosTokenId];
        logprobs = [...logprobs, NaN];
      }
      let closed = false;
      ids.forEach((id, k) => (closed = ep.sampled(row, id, logprobs[k])));
      if (closed) {
        await ep.endTurn(row);
        if (!row.done) ep.readForced(row, Infinity); // the tool response and the next header, at once
      } else if (!row.done) ep.finish(row, cfg.signal?.aborted ? "aborted" : "length"); // the context ran out
    }
  };
  // No request is left in flight when this returns or throws: the first failure is thrown once every
  // row has stopped.
  await Promise.allSettled(
    ep.rows.map((row) =>
      runRow(row)
        .catch((reason) => void (failure ??= { reason }))
        .finally(() => engine.release?.(row.index)),
    ),
  );
  if (failure !== null) throw (failure as { reason: unknown }).reason;
  return ep.rows.map((r) => r.traj);
}

/** The engine's seed for row r's turn k of a step seeded `seed` (32-bit, as vLLM takes it). */
export function turnSeed(seed: number, row: number, turn: number): number {
  let h = (seed >>> 0) ^ 0x9e3779b9;
  for (const x of [row, turn]) h = Math.imul(h ^ x, 0x85ebca6b) >>> 0;
  return h >>> 1; // non-negative int32
}
