/** What a rollout is configured with and what it produces: one Trajectory per (prompt, sample).
 *  Types only; the rules of a turn are in episode.ts, the loops in rollout.ts and turns.ts, the JSONL
 *  log in trajectories.ts. */
import type { Tool } from "../agents/types.ts";
import type { Environment } from "../envs/types.ts";
import type { Rng } from "../util/rng.ts";
import type { OpenDecodeBatch } from "./decode-batch.ts";

export interface RolloutConfig {
  /** G: samples per prompt (the GRPO group size). */
  samplesPerPrompt: number;
  /** Budget of new tokens per rollout over all turns, sampled + forced (tool responses, headers). */
  maxNewTokens: number;
  /** Assistant turns per rollout; a rollout that would start turn maxTurns+1 stops ("max_turns"). */
  maxTurns: number;
  temperature: number;
  topP: number;
  /** 0 = off. */
  topK: number;
  rng: Rng;
  tools: Tool[];
  /** Roll out against environments instead of tools: envs[p·G + g] for sample g of prompt p, already
   *  reset (the prompt holds its first observation). Each assistant turn is an action (the
   *  environment's client reads it from the turn); the observation comes back as a user message with
   *  loss mask 0; the episode ends on `done`, the turn limit or the token budget; envReward is the
   *  episode's score. A failing step, an environment that never started (its `failure` set) or a
   *  first observation too long for the context ends that row with "env_error". */
  envs?: Environment[];
  /** Render the tool schemas into the system prompt through the chat template's `tools`. Default true. */
  toolsInPrompt?: boolean;
  /** false = sample from the base with LoRA switched off. Default true. */
  adapters?: boolean;
  /** Sample from candidates computed on the device (rollout/sampler.ts); same draws either way.
   *  Default: the backend profile's choice (webgpu yes, wasm/cpu no). */
  deviceSampling?: boolean;
  /** What runs the decode batch: default the model's tfjs forward (decode-batch.ts DecodeBatch, with
   *  the base unpacked for generation); the compiled decoder's engine passes its own. */
  openBatch?: OpenDecodeBatch;
  /** Drop finished rows from the KV cache once this fraction of its rows has finished. Default 0.25. */
  compactFraction?: number;
  onStep?: (info: RolloutStepInfo) => void;
  /** Every token a row takes, as it is taken (streaming in the chat REPL). forced: a tool response or
   *  template token the row was made to read, not one it sampled. */
  onToken?: (row: number, tokenId: number, forced: boolean) => void;
  /** Once aborted, every live row stops before its next token (finishReason "aborted"). The loop then
   *  yields to the event loop each step, so an abort from an I/O event (Ctrl-C) gets through. */
  signal?: AbortSignal;
}

export interface RolloutStepInfo {
  step: number;
  /** Rows still generating after this step. */
  live: number;
  total: number;
  /** Rows the next decode step runs (live + finished rows not yet dropped from the cache). */
  cacheRows: number;
  sampled: number;
  forced: number;
  /** Floats the sampler read back from the backend this step (rollout/sampler.ts readFloats). */
  readFloats: number;
}

/** aborted: RolloutConfig.signal fired; the turn in progress is kept unparsed, as for "length". */
export type FinishReason = "stop" | "length" | "max_turns" | "aborted" | "env_error";

export interface ToolCallRecord {
  name: string;
  arguments: Record<string, unknown>;
  result: string;
  /** Unknown tool, a tool that threw, or a tool result starting with "Error". */
  error: boolean;
}

export interface TurnRecord {
  /** The assistant's text for this turn, without the closing stop token. */
  text: string;
  /** Text outside <tool_call> blocks (the whole text for a final answer or an unfinished turn). */
  content: string;
  toolCalls: ToolCallRecord[];
  parseErrors: string[];
  /** false when the token budget ran out inside this turn. */
  ended: boolean;
  /** With an environment: the action taken from this turn, and what the environment answered. */
  action?: string;
  observation?: string;
  reward?: number;
}

export interface Trajectory {
  /** The row's group, from the engine to the update: the task (its prompt's index in the call) and
   *  the sample within the task's group. Scoring and the update read these, not the rows' order. */
  promptIndex: number;
  sampleIndex: number;
  promptIds: number[];
  /** Everything after the prompt, in order: sampled tokens and forced ones (tool responses, headers). */
  completionIds: number[];
  /** 1 on tokens the policy sampled, 0 on forced tokens. Same length as completionIds. */
  lossMask: number[];
  /** log-prob of each sampled token under the distribution it was drawn from; 0 on forced tokens. */
  sampleLogprobs: number[];
  turns: TurnRecord[];
  /** Content of the last assistant turn. */
  finalText: string;
  finishReason: FinishReason;
  truncated: boolean;
  numToolCalls: number;
  numToolErrors: number;
  numParseErrors: number;
  /** Well-formed calls naming a tool the rollout does not have (also counted in numToolErrors). */
  numUnknownTools: number;
  /** With an environment: the episode's score by the environment's own rule (envs/families.ts; the
   *  summed reward for the generic dialects), whether it succeeded, and the error that ended it. */
  envReward?: number;
  envSuccess?: boolean;
  envError?: string;
  /** Filled by the caller after scoring. */
  reward?: number;
  rewardComponents?: Record<string, number>;
}
