/** The seam between the trainer and whatever generates its rollouts (verl's BaseRollout): every
 *  rollout engine — this process's tfjs model, an OpenAI-compatible server, llama.cpp in this
 *  process — takes the trainer's current adapter and turns a step's prompts into trajectories, with
 *  the tools or environments run inside. The trainer never asks which engine it has; the table of
 *  engines is index.ts. An engine's file holds its whole contract (`RolloutEngineDef`): its flags and
 *  their help, the checks of its flags, its capabilities, and its failures as EngineError. */
import type { Tool } from "../../agents/types.ts";
import type { ThreadsSpec } from "../../kernels/wasm/threads.ts";
import type { Flag, OptionsOf } from "../../util/flag.ts";
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

/** The engine died, stalled or answered nonsense: GRPO saves the checkpoint of the step it stopped
 *  before and says to continue with --resume once the engine answers. Every engine throws its
 *  failures (not its usage errors) as this; the message names the engine and what failed. */
export class EngineError extends Error {
  constructor(
    message: string,
    readonly kind: "unreachable" | "http" | "malformed" | "timeout" | "died",
  ) {
    super(message);
    this.name = "EngineError";
  }
}

/** One of an engine's flags: merged into every script that takes --rollout_engine (GRPO, eval, chat),
 *  or into GRPO's alone when `training` (it acts on training steps only). */
export type EngineFlag<T> = Flag<T> & { training?: boolean };
export type EngineFlagTable = Record<string, EngineFlag<any>>;

/** The run's flags an engine may read besides its own: GRPO's --tis_cap (0: the update uses no
 *  behaviour log-probs, so an engine may skip reading them), the scripts' --threads (the cores the
 *  tfjs backend uses, one pool at a time) and --env. */
export interface RunFlags {
  rollout_engine: string;
  tis_cap?: number;
  threads?: ThreadsSpec;
  env?: string;
}

/** What prepareEngine takes: a run's options; the engine's flags that are absent take their defaults. */
export type EngineFlags = RunFlags & { [flag: string]: unknown };

/** An engine's contract, in its own file; the table (index.ts) holds one row per engine. */
export interface RolloutEngineDef<F extends EngineFlagTable = EngineFlagTable> {
  /** The value of --rollout_engine. */
  readonly name: string;
  /** Its words in --rollout_engine's help, after its name: "local (this process's tfjs model, op by op)". */
  readonly help: string;
  /** Its own flags (names no other engine or script uses), declared once. */
  readonly flags: F;
  /** Optional: why a run on another engine (`engine`) refuses this engine's flags as given (they would
   *  do nothing there), or null. */
  refuseElsewhere?(f: OptionsOf<F>, engine: string): string | null;
  /** Checks its flags, and that what it needs answers or loads, before anything is written (a
   *  UsageError otherwise); the function returned opens it on the trainer's model. */
  prepare(f: RunFlags & OptionsOf<F>, log: (line: string) => void): Promise<(ctx: EngineContext) => Promise<RolloutEngine>>;
}

/** An engine's row, with its flags' types carried into prepare (`defineRolloutEngine({ name, … })`). */
export const defineRolloutEngine = <F extends EngineFlagTable>(def: RolloutEngineDef<F>): RolloutEngineDef<F> => def;
