/** --rollout_engine webgpu: rollouts from the compiled decoder (kernels/webgpu/decode/), this
 *  project's own WGSL programs over the trainer's weight buffers on the device tfjs holds: the
 *  frozen base as it is held (f32 or int8/NF4 codes), the adapter's factors copied from its
 *  variables at each generation, so it samples the policy the trainer has now. The turn loop is
 *  rollout.ts' (the local engine's), with the compiled batch in place of tfjs' forward. Its
 *  log-probs come from its own kernels, so at temperature 1 they are behaviour log-probs
 *  (engine_logprob_gap shows how far they are from the trainer's; TIS corrects for it).
 *  "auto" (the default) is this engine on --backend webgpu and the local engine elsewhere. */
import { Decoder, decoderUnsupported } from "../../kernels/webgpu/decode/decoder.ts";
import { CompiledBatch } from "../../kernels/webgpu/decode/batch.ts";
import { UsageError } from "../../util/errors.ts";
import { rolloutGroups } from "../rollout.ts";
import { rawDistribution } from "./llama.ts";
import { LocalEngine, stepConfig } from "./local.ts";
import { defineRolloutEngine, type EngineContext, type RolloutEngine, type RunFlags, type StepRequest } from "./types.ts";

export const webgpuEngine = defineRolloutEngine({
  name: "webgpu",
  help: "webgpu (the compiled WebGPU decoder over the trainer's own weights: fused kernels, one submit a token, sampling on the device)",
  flags: {},
  async prepare(f) {
    return async (ctx) => {
      const reason = decoderUnsupported(ctx.model);
      if (reason) throw new UsageError(`--rollout_engine webgpu: ${reason}; use --rollout_engine local`);
      return new WebgpuEngine(ctx, f);
    };
  },
});

/** The compiled decoder where it runs (webgpu, a Qwen2 model it reads), the local engine elsewhere. */
export const autoEngine = defineRolloutEngine({
  name: "auto",
  help: "auto (the default: webgpu on --backend webgpu, else local)",
  flags: {},
  async prepare(f) {
    return async (ctx) => (decoderUnsupported(ctx.model) === null ? new WebgpuEngine(ctx, f) : new LocalEngine(ctx));
  },
});

export class WebgpuEngine implements RolloutEngine {
  readonly name = "webgpu";
  readonly behaviourLogprobs: boolean;
  readonly offPolicy = false;
  private readonly decoder: Decoder;

  constructor(
    private readonly ctx: EngineContext,
    f: RunFlags,
  ) {
    this.decoder = new Decoder(ctx.model);
    // its own kernels' log-probs of the sampled tokens, read where the update uses them (T = 1)
    this.behaviourLogprobs = rawDistribution(ctx.sampling) && (f.tis_cap ?? 2) > 0;
  }

  /** The decoder's running figures (bench, tests). */
  get stats() {
    return this.decoder.stats;
  }

  async rollouts(req: StepRequest) {
    return { trajs: await this.generate(req.prompts(req.step), stepConfig(this.ctx, req)), metrics: {} };
  }

  generate: RolloutEngine["generate"] = (prompts, cfg) =>
    rolloutGroups(this.ctx.model, this.ctx.tokenizer, prompts, {
      ...cfg,
      openBatch: (p, o) => new CompiledBatch(this.decoder, p, o),
    });

  async close() {
    this.decoder.dispose();
  }
}
