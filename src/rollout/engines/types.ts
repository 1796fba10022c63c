/** The seam between the trainer and whatever generates its rollouts (verl's BaseRollout): every
 *  rollout engine — this process's tfjs model, an OpenAI-compatible server, llama.cpp in this
 *  process — takes the trainer's current adapter and turns a step's prompts into trajectories, with
 *  the tools or environments run inside. The trainer never asks which engine it has; the table of
 *  engines is index.ts. Types only. */
import type { Tool } from "../../agents/types.ts";
import type { Environment } from "../../envs/types.ts";
import type { CausalLM, ChatMessage, Tokenizer } from "../../model/types.ts";
import type { RolloutConfig, Trajectory } from "../types.ts";

/** How a run samples its rollouts (the GRPO flags of the same names). */
export type EngineSampling = Pick<RolloutConfig, "samplesPerPrompt" | "maxNewTokens" | "maxTurns" | "temperature" | "topP" | "topK"> & {
  toolsInPrompt: boolean;
};

/** What an engine is opened with: the trainer's model (its adapter is what the engine samples). */
export interface EngineContext {
  model: CausalLM;
  tokenizer: Tokenizer;
  /** The base model's folder (config and tokenizer files), for engines that load the model themselves. */
  modelDir: string;
  /** A folder the engine may keep files in (published adapters): the run folder. */
  workDir: string;
  tools: Tool[];
  sampling: EngineSampling;
  log: (line: string) => void;
}

/** One GRPO step's rollouts. */
export interface StepRequest {
  step: number;
  /** The run's last step (exclusive): an engine that works ahead stops there. */
  steps: number;
  /** The chat prompts of step s (an engine that works ahead asks for later steps' too). */
  prompts: (s: number) => ChatMessage[][];
  /** With --env: one reset environment per row of this step (prompt p, sample g at p·G + g). */
  envs?: Environment[];
  /** Step s's seed (from the run's seed and s, so a resumed run draws alike). */
  seedOf: (s: number) => number;
}

export interface StepRollouts {
  trajs: Trajectory[];
  /** The engine's own figures for the step's metrics line (adapter_swap_time, policy_version, …). */
  metrics: Record<string, number>;
}

export interface RolloutEngine {
  readonly name: string;
  /** The engine samples with other code than the trainer's forward, so its log-probs of the sampled
   *  tokens are the behaviour policy's: the step logs their gap to the trainer's
   *  (engine_logprob_gap) and corrects for it (truncated importance sampling). */
  readonly behaviourLogprobs: boolean;
  /** Rollouts may come from weights older than the trainer's (asynchronous rollouts): π_old is then
   *  the behaviour policy. */
  readonly offPolicy: boolean;
  /** The step's rollouts, sampled with the trainer's adapter as it is now. */
  rollouts(req: StepRequest): Promise<StepRollouts>;
  /** Rollouts of any prompts with the trainer's adapter as it is now (evaluation, chat). */
  generate(prompts: ChatMessage[][], cfg: RolloutConfig): Promise<Trajectory[]>;
  close(): Promise<void>;
}

/** An engine's flags (the GRPO, eval, chat and serve scripts share them). */
export interface EngineFlags {
  rollout_engine: string;
  rollout_url?: string;
  rollout_model?: string;
  rollout_timeout: number; // seconds per request
  async_rollouts: number;
  engine_weights: "f32" | "f16" | "q8_0";
  engine_gpu: "auto" | "cuda" | "vulkan" | "metal" | "off";
  /** GRPO's TIS cap (0: off); an engine may skip reading log-probs nothing uses. */
  tis_cap?: number;
  /** CPU threads (the scripts' --threads: the same cores the tfjs backend uses, one pool at a time). */
  threads?: number | "auto";
  env?: string;
}

/** One row of the engine table: checks its flags (and that what it needs answers or loads) before
 *  anything is written, then opens on the trainer's model. */
export interface EngineEntry {
  help: string;
  prepare(flags: EngineFlags, log: (line: string) => void): Promise<(ctx: EngineContext) => Promise<RolloutEngine>>;
}
