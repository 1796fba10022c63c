/** --rollout_engine openai: GRPO's rollouts on an OpenAI-compatible server (vLLM with --enable-lora,
 *  or scripts/serve-openai.ts). Each step the adapter is saved as a PEFT folder
 *  (<output_dir>/engine-adapters/v<N>, N = optimizer steps taken) and hot-loaded into the server under
 *  a versioned name; the step's rollouts are generated with it (turns.ts over openai-client.ts).
 *
 *  With --async_rollouts K > 0 the rollouts of the next K steps are requested as soon as a version is
 *  published, so the server generates them while this process trains: step t trains on rollouts of
 *  version ≥ t − K (never older; the check throws), and the loss corrects with the importance ratio
 *  against the behaviour log-probs the server returned (trainer/grpo.ts offPolicy). K = 0 generates
 *  each step's rollouts with the current weights, as the local engine does.
 *  Per step it reports policy_version, staleness (steps between the version and the weights trained),
 *  trainer_wait (s the trainer waited for rollouts) and engine_wait (s the server had nothing to do
 *  since the previous step). Old versions are unloaded, and their folders removed, once no request
 *  in flight uses them. Leaves out: environments (--env), several servers. */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import type { ChatMessage } from "../../model/types.ts";
import { UsageError } from "../../util/errors.ts";
import { flag, optional, parseFloatArg, parseIntArg, type OptionsOf } from "../../util/flag.ts";
import { turnRollouts, type TurnCompleter } from "../turns.ts";
import type { RolloutConfig, Trajectory } from "../types.ts";
import { EngineClient } from "./openai-client.ts";
import {
  defineRolloutEngine,
  type EngineContext,
  type RolloutEngine,
  type RunFlags,
  type StepRequest,
  type StepRollouts,
} from "./types.ts";

const FLAGS = {
  rollout_url: optional(
    "--rollout_url <url>",
    "with --rollout_engine openai: the engine's base URL, e.g. http://127.0.0.1:8001/v1 (an API key, if " +
      "it needs one, from ROLLOUT_API_KEY)",
    undefined,
    { free: true },
  ),
  rollout_model: optional(
    "--rollout_model <name>",
    "the engine's name for the base model this run trains on (default: the first of its GET /v1/models)",
    undefined,
    { free: true },
  ),
  rollout_timeout: flag(
    "--rollout_timeout <s>",
    "seconds one engine request may take; a slower or cut-off answer stops the run with a checkpoint",
    parseFloatArg("rollout_timeout", 0.001),
    600,
    { free: true },
  ),
  async_rollouts: {
    ...flag(
      "--async_rollouts <k>",
      "with --rollout_engine openai: the next k steps' rollouts are generated while this step trains (at " +
        "most k versions old; the loss corrects with the ratio to their behaviour log-probs); 0: none",
      parseIntArg("async_rollouts", 0),
      0,
      { free: true },
    ),
    training: true,
  },
};
type OpenAiFlags = RunFlags & OptionsOf<typeof FLAGS>;

export const openaiEngine = defineRolloutEngine({
  name: "openai",
  help:
    "openai (an OpenAI-compatible engine at --rollout_url, e.g. vLLM with --enable-lora or " +
    "scripts/serve-openai.ts; the adapter is hot-loaded into it every step)",
  flags: FLAGS,
  // Given to an engine that generates here, these would do nothing.
  refuseElsewhere(f, engine) {
    if (f.async_rollouts > 0)
      return `--async_rollouts ${f.async_rollouts} needs --rollout_engine openai: the ${engine} engine generates in the training process`;
    return f.rollout_url ? "--rollout_url is only used with --rollout_engine openai" : null;
  },
  async prepare(f, log) {
    const { client, base } = await connect(f, log);
    return async (ctx) => new OpenAiEngine(client, base, f.async_rollouts, ctx);
  },
});

/** Checks the flags and that the server answers, before the run folder is touched: a usage error
 *  (one line, exit 2) otherwise. */
export async function connect(f: OpenAiFlags, log: (line: string) => void): Promise<{ client: EngineClient; base: string }> {
  if (!f.rollout_url) throw new UsageError("--rollout_engine openai needs --rollout_url, e.g. http://127.0.0.1:8001/v1");
  if (f.env) throw new UsageError("--rollout_engine openai rolls out tool-using tasks; --env runs on the local or llama engine");
  if (!/^https?:\/\//.test(f.rollout_url)) throw new UsageError(`--rollout_url ${f.rollout_url}: expected an http(s) URL`);
  const client = new EngineClient(
    { url: f.rollout_url, apiKey: process.env.ROLLOUT_API_KEY, timeoutMs: f.rollout_timeout * 1000 },
    Number.MAX_SAFE_INTEGER,
  );
  let models: string[];
  try {
    models = await client.models();
  } catch (err) {
    throw new UsageError(`--rollout_url ${f.rollout_url}: ${(err as Error).message}; start the engine first (docs/serving.md)`);
  }
  const base = f.rollout_model ?? models[0];
  if (!base || !models.includes(base))
    throw new UsageError(`--rollout_model ${f.rollout_model}: the engine at ${f.rollout_url} serves ${models.join(", ") || "nothing"}`);
  log(`rollout engine: ${client.base}/v1, model ${base}${f.async_rollouts > 0 ? `, up to ${f.async_rollouts} step(s) ahead` : ""}`);
  return { client, base };
}

/** The server as a TurnCompleter: one /v1/completions request per turn, with the named adapter. */
export const serverTurns = (client: EngineClient, model: string): TurnCompleter => ({
  complete: (_row, ids, p) => client.complete(model, ids, p),
});

class OpenAiEngine implements RolloutEngine {
  readonly name = "openai";
  readonly behaviourLogprobs = true;
  readonly offPolicy: boolean;
  private readonly launched = new Map<number, { version: number; result: Promise<Trajectory[]> }>();
  private readonly versions = new Map<number, { name: string; dir: string; users: number }>();
  private current = -1;
  private inFlight = 0;
  private idleSince = Date.now();
  private engineWait = 0;
  private adaptersDir: string | null = null;
  private readonly tag = `${process.pid.toString(36)}${Date.now().toString(36)}`;

  constructor(
    readonly client: EngineClient,
    readonly baseModel: string,
    readonly ahead: number,
    private readonly ctx: EngineContext,
  ) {
    this.offPolicy = ahead > 0;
    this.client.vocabSize = ctx.model.config.vocabSize;
  }

  /** Step `step`'s rollouts: publishes the weights as of now (version = step), requests the steps up
   *  to step + K, and waits for this step's. */
  async rollouts(req: StepRequest): Promise<StepRollouts> {
    const step = req.step;
    await this.publish(step);
    for (let t = step; t < Math.min(req.steps, step + this.ahead + 1); t++) if (!this.launched.has(t)) this.launch(req, t);
    const job = this.launched.get(step)!;
    const t0 = Date.now();
    const trajs = await job.result;
    this.launched.delete(step);
    const staleness = step - job.version;
    if (staleness > this.ahead)
      throw new Error(
        `step ${step + 1}: rollouts of version ${job.version} are ${staleness} versions old; ` +
          `--async_rollouts ${this.ahead} allows ${this.ahead}`,
      );
    const metrics = { policy_version: job.version, staleness, trainer_wait: (Date.now() - t0) / 1000, engine_wait: this.engineWait };
    this.engineWait = 0;
    return { trajs, metrics };
  }

  /** Save the adapter and load it into the engine as version `v`; unload superseded versions no
   *  request uses any more. */
  private async publish(v: number): Promise<void> {
    if (v === this.current) return;
    this.adaptersDir = path.resolve(this.ctx.workDir, "engine-adapters");
    const dir = path.join(this.adaptersDir, `v${v}`);
    await this.ctx.model.saveAdapter(dir);
    const name = `${this.baseModel.replace(/[^\w.-]+/g, "_").slice(-40)}-${this.tag}-v${v}`;
    await this.client.loadAdapter(name, dir);
    this.versions.set(v, { name, dir, users: 0 });
    this.current = v;
    await this.sweep();
  }

  private async sweep(): Promise<void> {
    for (const [v, h] of this.versions) {
      if (v === this.current || h.users > 0) continue;
      this.versions.delete(v);
      await this.client.unloadAdapter(h.name);
      await fs.rm(h.dir, { recursive: true, force: true });
    }
  }

  private launch(req: StepRequest, step: number): void {
    const v = this.current;
    const h = this.versions.get(v)!;
    h.users++;
    if (this.inFlight++ === 0) this.engineWait += (Date.now() - this.idleSince) / 1000;
    const s = this.ctx.sampling;
    const result = this.turns(req.prompts(step), h.name, { ...s, tools: this.ctx.tools, seed: req.seedOf(step) }).finally(() => {
      h.users--;
      if (--this.inFlight === 0) this.idleSince = Date.now();
    });
    result.catch(() => {}); // awaited by rollouts(); a run that stops first must not see it as unhandled
    this.launched.set(step, { version: v, result });
  }

  private turns(prompts: ChatMessage[][], model: string, c: Omit<RolloutConfig, "rng"> & { seed: number }): Promise<Trajectory[]> {
    return turnRollouts(serverTurns(this.client, model), this.ctx.tokenizer, prompts, {
      ...c,
      envs: undefined,
      maxPositions: this.ctx.model.config.maxPositionEmbeddings,
    });
  }

  /** With the adapter as it is now, published first as the next version. */
  async generate(prompts: ChatMessage[][], cfg: RolloutConfig): Promise<Trajectory[]> {
    if (cfg.envs) throw new UsageError("--rollout_engine openai rolls out tool-using tasks; --env runs on the local or llama engine");
    if (this.ctx.model.lora) await this.publish(this.current + 1); // a version of its own: the weights may have moved since
    // A model without an adapter (eval or chat of a base) is the server's base model.
    const model = this.ctx.model.lora ? this.versions.get(this.current)!.name : this.baseModel;
    return this.turns(prompts, model, { ...cfg, seed: Math.floor(cfg.rng.next() * 2 ** 31) });
  }

  /** Unload what this run loaded (best effort: the engine may be gone) and remove the folders. */
  async close(): Promise<void> {
    for (const h of this.versions.values()) {
      await this.client.unloadAdapter(h.name).catch(() => {});
      await fs.rm(h.dir, { recursive: true, force: true });
    }
    if (this.adaptersDir) await fs.rmdir(this.adaptersDir).catch(() => {}); // kept if something else is in it
    this.versions.clear();
  }
}
