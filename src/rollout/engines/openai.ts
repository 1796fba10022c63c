/** GRPO's rollouts on an OpenAI-compatible engine (--rollout_engine openai): the seam between the
 *  trainer and vLLM / scripts/serve-openai.ts. Each step the adapter is saved as a PEFT folder
 *  (<output_dir>/engine-adapters/v<N>, N = optimizer steps taken) and hot-loaded into the engine under
 *  a versioned name; the step's rollouts are generated with it (rollout/remote-rollout.ts).
 *
 *  With --async_rollouts K > 0 the rollouts of the next K steps are requested as soon as a version is
 *  published, so the engine generates them while this process trains: step t trains on rollouts of
 *  version ≥ t − K (never older; the check throws), and the loss corrects with the importance ratio
 *  against the behaviour log-probs the engine returned (trainer/grpo.ts offPolicy). K = 0 generates
 *  each step's rollouts with the current weights, as the local engine does.
 *  Per step it reports policy_version, staleness (steps between the version and the weights trained),
 *  trainer_wait (s the trainer waited for rollouts) and engine_wait (s the engine had nothing to do
 *  since the previous step). Old versions are unloaded, and their folders removed, once no request
 *  in flight uses them. Leaves out: environments (--env), several engines. */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { systemPromptFor, toPrompt } from "../agents/prompts.ts";
import type { Tool } from "../agents/types.ts";
import { UsageError } from "../util/errors.ts";
import type { Task } from "../datasets/tasks.ts";
import type { CausalLM, Tokenizer } from "../model/types.ts";
import { EngineClient, EngineError } from "../rollout/openai-engine.ts";
import { remoteRolloutGroups } from "../rollout/remote-rollout.ts";
import type { Trajectory } from "../rollout/types.ts";

export { EngineError };

export interface RemoteFlags {
  rollout_engine: "local" | "openai";
  rollout_url?: string;
  rollout_model?: string;
  rollout_timeout: number; // seconds per request
  async_rollouts: number;
  env?: string;
}

/** Checks the flags and that the engine answers, before the run folder is touched: a usage error
 *  (one line, exit 2) otherwise. null with the local engine. */
export async function openRemoteRollouts(
  f: RemoteFlags,
  vocabSize: number | null,
  log: (line: string) => void,
): Promise<RemoteRollouts | null> {
  if (f.rollout_engine === "local") {
    if (f.async_rollouts > 0)
      throw new UsageError(
        `--async_rollouts ${f.async_rollouts} needs --rollout_engine openai: the local engine generates in the training process`,
      );
    if (f.rollout_url) throw new UsageError("--rollout_url is only used with --rollout_engine openai");
    return null;
  }
  if (!f.rollout_url) throw new UsageError("--rollout_engine openai needs --rollout_url, e.g. http://127.0.0.1:8001/v1");
  if (f.env) throw new UsageError("--rollout_engine openai rolls out tool-using tasks; --env runs on the local engine");
  if (!/^https?:\/\//.test(f.rollout_url)) throw new UsageError(`--rollout_url ${f.rollout_url}: expected an http(s) URL`);
  const client = new EngineClient(
    { url: f.rollout_url, apiKey: process.env.ROLLOUT_API_KEY, timeoutMs: f.rollout_timeout * 1000 },
    vocabSize ?? Number.MAX_SAFE_INTEGER,
  );
  let models: string[];
  try {
    models = await client.models();
  } catch (err) {
    throw new UsageError(`--rollout_url ${f.rollout_url}: ${(err as Error).message}; start the engine first (README, Scaling out)`);
  }
  const base = f.rollout_model ?? models[0];
  if (!base || !models.includes(base))
    throw new UsageError(`--rollout_model ${f.rollout_model}: the engine at ${f.rollout_url} serves ${models.join(", ") || "nothing"}`);
  log(`rollout engine: ${client.base}/v1, model ${base}${f.async_rollouts > 0 ? `, up to ${f.async_rollouts} step(s) ahead` : ""}`);
  return new RemoteRollouts(client, base, f.async_rollouts);
}

export interface StepRollouts {
  trajs: Trajectory[];
  version: number;
  metrics: Record<string, number>; // policy_version, staleness, trainer_wait, engine_wait
}

/** What a run gives the remote rollouts to work with. */
export interface RemoteRun {
  model: CausalLM;
  tokenizer: Tokenizer;
  tools: Tool[];
  outputDir: string;
  steps: number; // the run's last step (exclusive)
  question: (i: number) => Task;
  cfg: {
    prompts_per_step: number;
    samples_per_prompt: number;
    max_new_tokens: number;
    max_turns: number;
    temperature: number;
    top_p: number;
    top_k: number;
    tools_in_prompt: boolean;
    seed: number;
  };
}

export class RemoteRollouts {
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
  ) {}

  /** Step `step`'s rollouts: publishes the weights as of now (version = step), requests the steps up
   *  to step + K, and waits for this step's. */
  async rollouts(run: RemoteRun, step: number): Promise<StepRollouts> {
    this.client.vocabSize = run.model.config.vocabSize;
    await this.publish(run, step);
    for (let t = step; t < Math.min(run.steps, step + this.ahead + 1); t++) if (!this.launched.has(t)) this.launch(run, t);
    const job = this.launched.get(step)!;
    const t0 = Date.now();
    const trajs = await job.result;
    this.launched.delete(step);
    const staleness = step - job.version;
    if (staleness > this.ahead)
      throw new Error(
        `step ${step + 1}: rollouts of version ${job.version} are ${staleness} versions old; --async_rollouts ${this.ahead} allows ${this.ahead}`,
      );
    const metrics = { policy_version: job.version, staleness, trainer_wait: (Date.now() - t0) / 1000, engine_wait: this.engineWait };
    this.engineWait = 0;
    return { trajs, version: job.version, metrics };
  }

  /** Save the adapter and load it into the engine as version `v`; unload superseded versions no
   *  request uses any more. */
  private async publish(run: RemoteRun, v: number): Promise<void> {
    if (v === this.current) return;
    this.adaptersDir = path.resolve(run.outputDir, "engine-adapters");
    const dir = path.join(this.adaptersDir, `v${v}`);
    await run.model.saveAdapter(dir);
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

  private launch(run: RemoteRun, step: number): void {
    const v = this.current;
    const h = this.versions.get(v)!;
    h.users++;
    if (this.inFlight++ === 0) this.engineWait += (Date.now() - this.idleSince) / 1000;
    const c = run.cfg;
    const prompts = Array.from({ length: c.prompts_per_step }, (_, i) => run.question(step * c.prompts_per_step + i)).map((ex) =>
      toPrompt(ex.question, systemPromptFor(run.tools, ex.answerSchema, ex.scorer)),
    );
    const result = remoteRolloutGroups(this.client, run.tokenizer, prompts, {
      samplesPerPrompt: c.samples_per_prompt,
      maxNewTokens: c.max_new_tokens,
      maxTurns: c.max_turns,
      temperature: c.temperature,
      topP: c.top_p,
      topK: c.top_k,
      tools: run.tools,
      toolsInPrompt: c.tools_in_prompt,
      seed: c.seed * 1_000_003 + step,
      model: h.name,
      maxPositions: run.model.config.maxPositionEmbeddings,
    }).finally(() => {
      h.users--;
      if (--this.inFlight === 0) this.idleSince = Date.now();
    });
    result.catch(() => {}); // awaited by rollouts(); a run that stops first must not see it as unhandled
    this.launched.set(step, { version: v, result });
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
