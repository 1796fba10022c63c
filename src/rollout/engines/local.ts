/** --rollout_engine local: rollouts from this process's tfjs model (rollout.ts rolloutGroups), the
 *  trainer's own weights, so there is nothing to publish and the sampled log-probs are the trainer's. */
import { UsageError } from "../../util/errors.ts";
import { Rng } from "../../util/rng.ts";
import { rolloutGroups } from "../rollout.ts";
import type { RolloutConfig } from "../types.ts";
import type { EngineContext, EngineEntry, RolloutEngine, StepRequest } from "./types.ts";

export const localEngine: EngineEntry = {
  help: "local (this process's model)",
  async prepare(f) {
    if (f.async_rollouts > 0)
      throw new UsageError(
        `--async_rollouts ${f.async_rollouts} needs --rollout_engine openai: the local engine generates in the training process`,
      );
    if (f.rollout_url) throw new UsageError("--rollout_url is only used with --rollout_engine openai");
    return async (ctx) => new LocalEngine(ctx);
  },
};

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

export class LocalEngine implements RolloutEngine {
  readonly name = "local";
  readonly behaviourLogprobs = false;
  readonly offPolicy = false;
  constructor(private readonly ctx: EngineContext) {}

  async rollouts(req: StepRequest) {
    return { trajs: await this.generate(req.prompts(req.step), stepConfig(this.ctx, req)), metrics: {} };
  }

  generate: RolloutEngine["generate"] = (prompts, cfg) => rolloutGroups(this.ctx.model, this.ctx.tokenizer, prompts, cfg);

  async close() {}
}
