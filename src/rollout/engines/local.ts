/** --rollout_engine local: rollouts from this process's tfjs model (rollout.ts rolloutGroups), the
 *  trainer's own weights, so there is nothing to publish and the sampled log-probs are the trainer's. */
import { Rng } from "../../util/rng.ts";
import type { CausalLM, Tokenizer } from "../../model/types.ts";
import { rolloutGroups } from "../rollout.ts";
import type { RolloutConfig } from "../types.ts";
import { defineRolloutEngine, type EngineContext, type RolloutEngine, type StepRequest } from "./types.ts";

export const localEngine = defineRolloutEngine({
  name: "local",
  help: "local (this process's tfjs model, op by op)",
  flags: {},
  prepare: async () => async (ctx) => new LocalEngine(ctx),
});

/** A step's rollout settings for the engines that generate in this process (GRPO's flags, the
 *  step's seed, its tools or environments). */
export function stepConfig(ctx: EngineContext, req: StepRequest): RolloutConfig {
  const s = ctx.sampling;
  return {
    samplesPerPrompt: s.samplesPerPrompt,
    maxNewTokens: s.maxNewTokens,
    maxTurns: s.maxTurns,
    temperature: s.temperature,
    topP: s.topP,
    topK: s.topK,
    rng: new Rng(req.seedOf(req.step)),
    tools: ctx.tools,
    toolsInPrompt: s.toolsInPrompt,
    envs: req.envs,
  };
}

/** The local engine's generate on a model of this process (what evaluate and chat default to). */
export const localGenerate =
  (model: CausalLM, tokenizer: Tokenizer): RolloutEngine["generate"] =>
  (prompts, cfg) =>
    rolloutGroups(model, tokenizer, prompts, cfg);

export class LocalEngine implements RolloutEngine {
  readonly name = "local";
  readonly behaviourLogprobs = false;
  readonly offPolicy = false;
  readonly generate: RolloutEngine["generate"];
  constructor(private readonly ctx: EngineContext) {
    this.generate = localGenerate(ctx.model, ctx.tokenizer);
  }

  async rollouts(req: StepRequest) {
    return { trajs: await this.generate(req.prompts(req.step), stepConfig(this.ctx, req)), metrics: {} };
  }

  async close() {}
}
