/** The rules of an episode, written once for every loop that runs one: the token loop (rollout.ts,
 *  the local and compiled decoders) and the turn loop (turns.ts, the engines that continue a row
 *  up to its next stop token). A loop decides only when a row's tokens come; this file decides what
 *  they mean:
 *  - the rows: prompt p, sample g is row p·G + g, its trajectory carrying its group (promptIndex p,
 *    sampleIndex g) to the update; a row whose environment never started, or whose first
 *    observation cannot fit the context with the budget, fails alone (env_error);
 *  - a sampled token gets loss mask 1 and its log-prob; <|im_end|> / <|endoftext|> closes the turn;
 *  - a closed turn's tool calls are parsed and run (tool-messages.ts), or with environments the turn
 *    is an action and the environment steps; a turn without calls or parse errors is the final
 *    answer ("stop");
 *  - what follows is queued as forced tokens (mask 0, log-prob 0): the rendered tool message or
 *    observation and the template's next assistant header;
 *  - limits: a row that would start turn maxTurns+1 stops ("max_turns"); sampled and forced tokens
 *    count against maxNewTokens alike, and a row whose budget runs out stops ("length", its turn in
 *    progress kept unparsed).
 *  Leaves out: sampling, the KV cache, when rows run (the loops). */
import { toolSchema, type Tool } from "../agents/types.ts";
import type { ChatMessage, Tokenizer } from "../model/types.ts";
import { ToolResponseRenderer, toolTurn } from "./tool-messages.ts";
import type { FinishReason, RolloutConfig, Trajectory, TurnRecord } from "./types.ts";

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

/** The tokens that close an assistant turn: <|im_end|> (eos) and <|endoftext|>. */
export function stopTokenIds(tokenizer: Tokenizer): Set<number> {
  return new Set([tokenizer.eosTokenId, tokenizer.tokenToId("<|endoftext|>") ?? tokenizer.padTokenId]);
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

/** One row of a batch of episodes. */
export interface EpisodeRow {
  readonly index: number; // p·G + g: its environment, its onToken number, its engine row
  readonly traj: Trajectory;
  turn: number; // 1-based index of the current assistant turn
  done: boolean;
  turnIds: number[]; // tokens sampled in the current turn
  forced: number[]; // tokens the row must read before it samples again
}

export type EpisodeConfig = Pick<
  RolloutConfig,
  "samplesPerPrompt" | "maxNewTokens" | "maxTurns" | "tools" | "toolsInPrompt" | "envs" | "onToken"
>;

/** The episodes of B prompts × G samples. `context`: the model's max_position_embeddings, which every
 *  prompt with the budget must fit. */
export class Episodes {
  readonly rows: EpisodeRow[];
  readonly stopIds: Set<number>;
  private readonly tools: Map<string, Tool>;
  private readonly renderer: ToolResponseRenderer;
  private readonly userRenderer: ToolResponseRenderer;

  constructor(
    private readonly tokenizer: Tokenizer,
    prompts: ChatMessage[][],
    private readonly cfg: EpisodeConfig,
    context: number,
  ) {
    checkConfig(prompts, cfg);
    this.tools = new Map(cfg.tools.map((t) => [t.name, t]));
    this.renderer = new ToolResponseRenderer(tokenizer);
    this.userRenderer = new ToolResponseRenderer(tokenizer, "user");
    this.stopIds = stopTokenIds(tokenizer);
    const G = cfg.samplesPerPrompt;
    this.rows = encodePrompts(tokenizer, prompts, cfg).flatMap((ids, p) =>
      Array.from({ length: G }, (_, g) => ({
        index: p * G + g,
        traj: { ...newTrajectory(p, g, ids), ...(cfg.envs ? { envReward: 0 } : {}) },
        turn: 1,
        done: false,
        turnIds: [],
        forced: [],
      })),
    );
    // An observation is the environment's text, not the run's configuration: a row it makes too long
    // for the context fails alone, as a row whose environment never started does.
    cfg.envs?.forEach((env, r) => {
      const t = this.rows[r].traj;
      if (env.failure !== undefined) t.envError = env.failure;
      else if (t.promptIds.length + cfg.maxNewTokens > context)
        t.envError =
          `the first observation makes a prompt of ${t.promptIds.length} tokens; with maxNewTokens ${cfg.maxNewTokens} ` +
          `it passes the model's context of ${context} tokens`;
      if (t.envError !== undefined) this.finish(this.rows[r], "env_error");
    });
    const longest = Math.max(0, ...this.rows.filter((r) => !r.done).map((r) => r.traj.promptIds.length));
    if (longest + cfg.maxNewTokens > context)
      throw new Error(
        `longest prompt (${longest} tokens) + maxNewTokens ${cfg.maxNewTokens} exceeds the model's max_position_embeddings ${context}`,
      );
  }

  /** Tokens the row may still take. */
  room(row: EpisodeRow): number {
    return this.cfg.maxNewTokens - row.traj.completionIds.length;
  }

  /** A token the policy sampled (mask 1, its log-prob kept). true: it closed the turn (endTurn
   *  judges it). A token that fills the budget inside a turn ends the row ("length"). */
  sampled(row: EpisodeRow, id: number, logprob: number): boolean {
    const t = row.traj;
    t.completionIds.push(id);
    t.lossMask.push(1);
    t.sampleLogprobs.push(logprob);
    row.turnIds.push(id);
    this.cfg.onToken?.(row.index, id, false);
    if (this.stopIds.has(id)) return true;
    if (this.room(row) <= 0) this.finish(row, "length");
    return false;
  }

  /** Up to `max` of the row's queued forced tokens, as many as the budget allows (mask 0, log-prob
   *  0: the tool or the template wrote them); a row whose budget they fill ends ("length"). */
  readForced(row: EpisodeRow, max: number): number[] {
    const ids = row.forced.splice(0, Math.min(max, this.room(row)));
    for (const id of ids) {
      row.traj.completionIds.push(id);
      row.traj.lossMask.push(0);
      row.traj.sampleLogprobs.push(0);
      this.cfg.onToken?.(row.index, id, true);
    }
    if (this.room(row) <= 0) this.finish(row, "length");
    return ids;
  }

  /** The row's turn closed (its last sampled token a stop token): run its calls or its environment
   *  step, then end the row or queue what it reads next. */
  async endTurn(row: EpisodeRow): Promise<void> {
    const text = this.tokenizer.decode(row.turnIds.slice(0, -1)); // without the stop token
    row.turnIds = [];
    let next: string;
    if (this.cfg.envs) {
      const turn: TurnRecord = { text, content: text, toolCalls: [], parseErrors: [], ended: true };
      row.traj.turns.push(turn);
      try {
        const out = await this.cfg.envs[row.index].step(text);
        if (row.done) return; // aborted while the step ran
        Object.assign(turn, { action: out.action, observation: out.observation, reward: out.reward });
        row.traj.envReward = out.score;
        row.traj.envSuccess = out.success;
        if (out.done) return this.finish(row, "stop");
      } catch (err) {
        if (row.done) return;
        row.traj.envError = (err as Error).message;
        return this.finish(row, "env_error");
      }
      next = this.userRenderer.render([turn.observation!]);
    } else {
      const results = await toolTurn(row.traj, text, this.tools);
      if (results === null) return this.finish(row, "stop");
      next = this.renderer.render(results);
    }
    if (row.turn >= this.cfg.maxTurns) return this.finish(row, "max_turns");
    if (this.room(row) <= 0) return this.finish(row, "length");
    row.forced = this.tokenizer.encode(next);
    row.turn++;
  }

  /** The row ends; a turn in progress (the budget ran out, or an abort) is kept unparsed. */
  finish(row: EpisodeRow, reason: FinishReason): void {
    const t = row.traj;
    row.done = true;
    t.finishReason = reason;
    t.truncated = reason === "length";
    if (row.turnIds.length > 0) {
      const text = this.tokenizer.decode(row.turnIds);
      t.turns.push({ text, content: text, toolCalls: [], parseErrors: [], ended: false });
      row.turnIds = [];
    }
    t.finalText = t.turns.at(-1)?.content ?? "";
  }
}

function checkConfig(prompts: ChatMessage[][], cfg: EpisodeConfig): void {
  if (prompts.length === 0) throw new Error("a rollout needs at least one prompt; got 0");
  const int = (name: string, v: number, min: number) => {
    if (!(Number.isInteger(v) && v >= min)) throw new Error(`${name} ${v} is invalid; accepted: an integer >= ${min}`);
  };
  int("samplesPerPrompt", cfg.samplesPerPrompt, 1);
  int("maxNewTokens", cfg.maxNewTokens, 1);
  int("maxTurns", cfg.maxTurns, 1);
  if (cfg.envs && cfg.envs.length !== prompts.length * cfg.samplesPerPrompt)
    throw new Error(
      `envs: ${cfg.envs.length} environments for ${prompts.length} prompts × ${cfg.samplesPerPrompt} samples; one per row is needed`,
    );
  const names = cfg.tools.map((t) => t.name);
  const dup = names.find((n, i) => names.indexOf(n) !== i);
  if (dup !== undefined) throw new Error(`tool name "${dup}" appears twice; accepted: unique tool names`);
}

/** The rows by the group they carry: groups[p][g] is task p's sample g, whatever order they came in. */
export function byGroup(trajs: Trajectory[], tasks: number): Trajectory[][] {
  const groups: Trajectory[][] = Array.from({ length: tasks }, () => []);
  for (const t of trajs) {
    const g = groups[t.promptIndex];
    if (g === undefined || !Number.isInteger(t.sampleIndex) || t.sampleIndex < 0 || g[t.sampleIndex] !== undefined)
      throw new Error(`the rollout of task ${t.promptIndex}, sample ${t.sampleIndex} has no place of its own among ${tasks} tasks`);
    g[t.sampleIndex] = t;
  }
  const gap = groups.findIndex((g) => g.length === 0 || Object.keys(g).length !== g.length);
  if (gap >= 0) throw new Error(`task ${gap} is missing rollouts: it has samples [${Object.keys(groups[gap]).join(", ")}]`);
  return groups;
}
