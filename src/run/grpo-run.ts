/** GRPO on a tool-using agent (the calculator by default; any tools through --tools). Each step: take the next `promptsPerStep` questions, roll out G
 *  multi-turn samples each (tools run in the loop), score them, turn scores into group-relative
 *  advantages, and update the LoRA adapter on the frozen (quantized) base; the KL reference is the
 *  same base with the adapter switched off. Checkpoints hold the adapter, optimizer state and the
 *  position in the data; sampling draws from an Rng seeded by (seed, step), so a resumed run makes
 *  the same rollouts as an uninterrupted one. */
import * as path from "node:path";
import { systemPromptFor, toPrompt } from "../agents/prompts.ts";
import { openRunTools, type ToolSet } from "../agents/toolset.ts";
import type { Task } from "../datasets/tasks.ts";
import type { Dialect } from "../envs/agentgym.ts";
import { ENV_SYSTEM_PROMPT, openEnvironmentServer, openEpisodes } from "../envs/episodes.ts";
import type { EnvironmentFactory } from "../envs/types.ts";
import type { SyntheticOptions } from "../datasets/synthetic.ts";
import type { LoraConfig, LoraTarget, Quantize } from "../model/types.ts";
import { discardFailedRun, prepareOutputDir, releaseOutputDir, UsageError, writeRunConfig } from "../cli.ts";
import { Interrupted, watchInterrupts } from "../shutdown.ts";
import { rolloutGroups, type Trajectory } from "../rollout/rollout.ts";
import { TrajectoryLog } from "../rollout/trajectories.ts";
import { scoreRollout } from "../rollout/rewards.ts";
import { groupAdvantages, groupHasSignal } from "../trainer/advantages.ts";
import { CheckpointSchedule, checkResumable, configHash, loadCheckpoint, saveCheckpoint } from "../trainer/checkpoint.ts";
import { NonFiniteError } from "../trainer/errors.ts";
import { grpoStep, type GrpoRollout } from "../trainer/grpo.ts";
import { formatStepLine, meanStd, memoryFields, MetricsLogger } from "../trainer/metrics.ts";
import { AdamW } from "../trainer/optimizer.ts";
import type { LossType } from "../trainer/policy-loss.ts";
import { createProgress } from "../trainer/progress.ts";
import { writeReport } from "../trainer/report.ts";
import { lrAt, type ScheduleType } from "../trainer/schedule.ts";
import { Rng } from "../util/rng.ts";
import { loadTrainingData } from "./data.ts";
import { finalEvaluation, type EvalResult } from "./evaluate.ts";
import { checkModelSource, openPolicy, runFinished, savePolicy, withOutputDir, type Policy } from "./policy.ts";
import { exportOptimizer, importOptimizer } from "./train-state.ts";
import type { ThreadsSpec } from "../wasm-threads.ts";

export interface GrpoRunConfig {
  modelPath: string; // SFT output (adapter folder or full folder), HF folder or hub id
  initAdapter?: string; // continue this PEFT adapter (an adapter at modelPath is used by default)
  dataset: string;
  synthetic?: Omit<SyntheticOptions, "n" | "seed">;
  maxSamples?: number;
  totalEpochs: number; // RL steps: each one rollout → train
  promptsPerStep: number;
  samplesPerPrompt: number; // G
  maxNewTokens: number;
  maxTurns: number;
  temperature: number;
  topP: number;
  topK: number;
  beta: number;
  epsilon: number;
  epsilonHigh: number;
  numIterations: number;
  lossType: LossType;
  scaleRewards: "group" | "none";
  rewardWeights: Record<string, number>;
  learningRate: number;
  lrScheduler: ScheduleType;
  warmupRatio: number;
  weightDecay: number;
  maxGradNorm: number;
  microBatchSize: number;
  loraR: number;
  loraAlpha: number;
  loraDropout: number;
  loraTargets: LoraTarget[];
  quantize: Quantize;
  toolsInPrompt: boolean;
  /** Tool specs (agents/toolset.ts): "calculator" (default), "mcp:<command line>", "mcp:<URL>". */
  tools?: string[];
  toolTimeout?: number; // seconds per call (default 30)
  toolMaxChars?: number; // default 4,000
  /** An AgentGym environment server's URL: roll out against it (tasks are its data_idx 0..maxSamples-1,
   *  default 100; tools are not offered; no held-out evaluation). */
  env?: string;
  envDialect?: Dialect;
  saveSteps: number;
  saveTotalLimit: number;
  evalSamples: number;
  seed: number;
  outputDir: string;
  backend: string;
  threads?: ThreadsSpec; // wasm threads (default auto)
  unpackBase?: boolean; // hold a quantized base unpacked while generating (default true)
  overwrite: boolean;
  resume: boolean;
  quiet?: boolean;
  /** Replaces the reward registry (tests use it to give random-weight rollouts a signal). */
  score?: (t: Trajectory, gold: string) => { reward: number; components: Record<string, number> };
}

export interface GrpoRunResult {
  steps: number;
  finalDir: string;
  eval: EvalResult | null;
  seconds: number;
}

/** The config fields a resumed run must share with the run it continues. */
function identity(cfg: GrpoRunConfig): Record<string, unknown> {
  // outputDir is left out so a copied run folder resumes.
  const { overwrite, resume, quiet, totalEpochs, saveSteps, saveTotalLimit, evalSamples, backend, threads, unpackBase, score, outputDir, ...rest } = cfg;
  void overwrite, resume, quiet, totalEpochs, saveSteps, saveTotalLimit, evalSamples, backend, threads, unpackBase, score, outputDir;
  return rest;
}

/** The i-th question of an endless stream: the data in a fresh seeded order every pass. */
function dataStream(examples: Task[], seed: number) {
  const orders = new Map<number, number[]>();
  return (i: number): Task => {
    const pass = Math.floor(i / examples.length);
    if (!orders.has(pass)) orders.set(pass, new Rng(seed * 7919 + pass).shuffle(examples.map((_, k) => k)));
    return examples[orders.get(pass)![i % examples.length]];
  };
}

export async function runGrpo(cfg: GrpoRunConfig): Promise<GrpoRunResult> {
  const t0 = Date.now();
  const log = (line: string) => (cfg.quiet ? undefined : process.stderr.write(line + "\n"));
  await checkModelSource(cfg.modelPath, "--model_path", cfg.initAdapter, "--init_adapter");
  if (!(cfg.topP > 0 && cfg.topP <= 1)) throw new UsageError(`--top_p ${cfg.topP}: expected a number above 0 and at most 1`);
  if (!(cfg.epsilon >= 0 && cfg.epsilon < 1)) throw new UsageError(`--epsilon ${cfg.epsilon}: expected a number >= 0 and below 1 (the ratio is clipped to [1 - epsilon, 1 + epsilon_high])`);
  if (cfg.resume) await prepareOutputDir(cfg.outputDir, { resume: true, overwrite: cfg.overwrite, runKind: "grpo" });
  const ckpt = cfg.resume ? await loadCheckpoint(cfg.outputDir) : null;
  if (ckpt) checkResumable(ckpt, identity(cfg), cfg.outputDir);
  const start = ckpt?.state.global_step ?? 0;
  const total = cfg.totalEpochs;
  // A run killed after its last step (while writing final/, evaluating or reporting) is finished by
  // --resume; a finished one only continues with more steps.
  if (start > total || (start === total && (await runFinished(cfg.outputDir))))
    throw new UsageError(`--resume: ${cfg.outputDir} already ran ${start} steps; raise --total_epochs above ${start} to continue`);
  // Tool and environment servers are checked before the run folder is touched: one that does not
  // answer is a usage error.
  const envs = cfg.env ? await openEnvironmentServer(cfg.env, { dialect: cfg.envDialect ?? "id", timeoutMs: (cfg.toolTimeout ?? 30) * 1000, maxChars: cfg.toolMaxChars ?? 4000 }) : null;
  // Held-out questions never include a training row; the split is logged and kept in run.json.
  const { train: examples, heldOut, split } = envs
    ? { train: envTasks(cfg.maxSamples ?? 100), heldOut: [] as Task[], split: `environment ${cfg.env}: data_idx 0-${(cfg.maxSamples ?? 100) - 1}; none held out` }
    : await loadTrainingData({ dataset: cfg.dataset, purpose: "rl", maxSamples: cfg.maxSamples, synthetic: cfg.synthetic }, cfg.evalSamples);
  if (examples.length === 0) throw new UsageError(`--dataset ${cfg.dataset}: no questions to train on`);
  log(`data: ${split}`);
  const toolSet = envs ? { tools: [], close: async () => {} } : await openRunTools(cfg, log);
  try {
    return await train(cfg, { t0, log, ckpt, start, examples, heldOut, split, toolSet, envs });
  } finally {
    await toolSet.close();
  }
}

/** An environment's tasks are its data_idx values; the id holds the index. */
function envTasks(n: number): Task[] {
  return Array.from({ length: n }, (_, i) => ({ id: String(i), question: `task ${i}`, answer: "", gold: "" }));
}

async function train(
  cfg: GrpoRunConfig,
  c: {
    t0: number; log: (line: string) => void; ckpt: Awaited<ReturnType<typeof loadCheckpoint>> | null; start: number; examples: Task[]; heldOut: Task[];
    split: Awaited<ReturnType<typeof loadTrainingData>>["split"]; toolSet: ToolSet; envs: EnvironmentFactory | null;
  },
): Promise<GrpoRunResult> {
  const { t0, log, ckpt, start, examples, heldOut, split } = c;
  const total = cfg.totalEpochs;
  const tools = c.toolSet.tools;
  const lora: LoraConfig = { r: cfg.loraR, alpha: cfg.loraAlpha, dropout: cfg.loraDropout, targetModules: cfg.loraTargets };
  // A resumed run continues the checkpoint's adapter; a new one the given adapter or a fresh one.
  const open = () =>
    openPolicy({
      modelPath: ckpt ? ((ckpt.state.extra?.base as string) ?? cfg.modelPath) : cfg.modelPath,
      adapter: ckpt ? ckpt.dir : cfg.initAdapter,
      quantize: cfg.quantize,
      lora,
      trainable: "lora",
      seed: cfg.seed,
      backend: cfg.backend, threads: cfg.threads,
      unpackBase: cfg.unpackBase,
    });
  const policy: Policy = ckpt ? await open() : await withOutputDir(cfg.outputDir, { overwrite: cfg.overwrite, runKind: "grpo" }, open);
  const { model, tokenizer } = policy;
  const optimizer = new AdamW(model.trainableVariables(), { lr: cfg.learningRate, weightDecay: cfg.weightDecay });
  try {
    const positions = model.config.maxPositionEmbeddings;
    if (cfg.maxNewTokens >= positions) throw new UsageError(`--max_new_tokens ${cfg.maxNewTokens}: the model holds ${positions} positions, prompt included; expected fewer`);
    if (!ckpt) await writeRunConfig(cfg.outputDir, { ...cfg, base: policy.base, adapter: policy.adapterDir, dataSplit: split }, "grpo");
    if (ckpt) importOptimizer(optimizer, ckpt.optimizerState!);
    const question = dataStream(examples, cfg.seed);
    const schedule = { type: cfg.lrScheduler, lr: cfg.learningRate, warmupSteps: Math.floor(cfg.warmupRatio * total), totalSteps: total };
    const metrics = new MetricsLogger(path.join(cfg.outputDir, "metrics.jsonl"), { resumeStep: start });
    const trajectoryLog = new TrajectoryLog(path.join(cfg.outputDir, "trajectories.jsonl"), { resumeStep: start });
    const saves = new CheckpointSchedule(cfg.saveSteps, total);
    const history: Record<string, unknown>[] = [...(ckpt?.state.log_history ?? [])];
    let step = start;
    // The last step whose checkpoint is on disk: an interrupt never rewrites a complete checkpoint.
    let savedStep = ckpt ? start : -1;
    const saveAt = async (s: number) => {
      await saveCheckpoint(cfg.outputDir, {
        saveModel: (dir) => savePolicy(policy, dir, false),
        state: {
          global_step: s, epoch: (s * cfg.promptsPerStep) / examples.length, rng_state: { rollout_seed: cfg.seed }, data_position: s * cfg.promptsPerStep,
          config_hash: configHash(identity(cfg)), config: identity(cfg), log_history: history, extra: { base: policy.base },
        },
        optimizerState: await exportOptimizer(optimizer),
        saveTotalLimit: cfg.saveTotalLimit,
      });
      savedStep = s;
    };
    // Ctrl-C / SIGTERM: the loop stops at its next safe point (before a step starts, when weights,
    // optimizer state and history all belong to the same step) and saves there.
    const stop = watchInterrupts();
    const stopHere = async (s: number) => {
      if (s !== savedStep) await saveAt(s);
      return new Interrupted(`saved checkpoint-${s} in ${cfg.outputDir}; continue with --resume`);
    };
    const progress = createProgress(total, "grpo", { keyMetric: "reward", start });
    try {
      for (step = start; step < total; step++) {
        if (await stop.poll()) throw await stopHere(step);
        const tStep = Date.now();
        const batch = Array.from({ length: cfg.promptsPerStep }, (_, i) => question(step * cfg.promptsPerStep + i));
        const tRoll = Date.now();
        // With an environment, each task's prompt is its first observation and each row acts in its own instance.
        const episodes = c.envs ? await openEpisodes(c.envs, batch.map((ex) => Number(ex.id)), cfg.samplesPerPrompt) : null;
        let trajs: Trajectory[];
        try {
          const prompts = episodes
            ? episodes.observations.map((o) => toPrompt(o, ENV_SYSTEM_PROMPT))
            : batch.map((ex) => toPrompt(ex.question, systemPromptFor(tools, ex.answerSchema, ex.scorer)));
          trajs = await rolloutGroups(model, tokenizer, prompts, {
            samplesPerPrompt: cfg.samplesPerPrompt, maxNewTokens: cfg.maxNewTokens, maxTurns: cfg.maxTurns,
            temperature: cfg.temperature, topP: cfg.topP, topK: cfg.topK, rng: new Rng(cfg.seed * 1_000_003 + step),
            tools, toolsInPrompt: cfg.toolsInPrompt, envs: episodes?.envs,
          });
        } finally {
          await episodes?.close();
        }
        const rolloutSeconds = (Date.now() - tRoll) / 1000;
        for (const t of trajs) {
          const s = cfg.score ? cfg.score(t, batch[t.promptIndex].gold) : scoreRollout(t, batch[t.promptIndex], cfg.rewardWeights);
          t.reward = s.reward;
          t.rewardComponents = s.components;
        }
        const groups = batch.map((_, p) => trajs.filter((t) => t.promptIndex === p));
        const rewards = groups.map((g) => g.map((t) => t.reward!));
        const adv = groupAdvantages(rewards, cfg.scaleRewards);
        const rollouts: GrpoRollout[] = groups.flatMap((g, p) =>
          g.map((t, i) => ({ ids: [...t.promptIds, ...t.completionIds], lossMask: [...t.promptIds.map(() => 0), ...t.lossMask], advantage: adv[p][i] })),
        );
        const tTrain = Date.now();
        const lr = lrAt(step, schedule);
        const s = await grpoStep(model, optimizer, rollouts, {
          beta: cfg.beta, epsilon: cfg.epsilon, epsilonHigh: cfg.epsilonHigh, lossType: cfg.lossType, maxNewTokens: cfg.maxNewTokens,
          numIterations: cfg.numIterations, maxGradNorm: cfg.maxGradNorm, lr, microBatchSize: cfg.microBatchSize, padTokenId: tokenizer.padTokenId,
        });
        const trainSeconds = (Date.now() - tTrain) / 1000;
        await trajectoryLog.append(step + 1, trajs, tokenizer);
        const m = stepMetrics(trajs, rewards, s, { lr, rolloutSeconds, trainSeconds, stepSeconds: (Date.now() - tStep) / 1000 });
        metrics.log(step + 1, m);
        history.push({ step: step + 1, ...m });
        progress.update(step + 1, m);
        if (!cfg.quiet) progress.log(formatStepLine(step + 1, total, m));
        if (saves.due(step + 1) && step + 1 < total) await saveAt(step + 1);
      }
      if (await stop.poll()) throw await stopHere(total);
      // The last step is checkpointed before final/ is written, so a run killed after it can be finished.
      if (savedStep !== total) await saveAt(total);
    } catch (err) {
      if (err instanceof NonFiniteError)
        throw new Error(`${err.message} at step ${step + 1}: stopped; the last good checkpoint is kept in ${cfg.outputDir} (lower --learning_rate or check the data)`);
      throw err;
    } finally {
      progress.stop();
      stop.dispose();
    }
    const finalDir = path.join(cfg.outputDir, "final");
    await savePolicy(policy, finalDir, false);
    log(`saved adapter to ${finalDir}`);
    const evalResult = await finalEvaluation(model, tokenizer, heldOut, {
      maxNewTokens: cfg.maxNewTokens, maxTurns: cfg.maxTurns, toolsInPrompt: cfg.toolsInPrompt, seed: cfg.seed, tools, outputDir: cfg.outputDir, metrics, step: total, log,
    });
    await writeReport(cfg.outputDir, { title: `GRPO ${path.basename(policy.base)}` });
    return { steps: total, finalDir, eval: evalResult, seconds: (Date.now() - t0) / 1000 };
  } catch (err) {
    if (!ckpt) await discardFailedRun(cfg.outputDir); // failed before its first step: leave nothing behind
    throw err;
  } finally {
    optimizer.dispose();
    model.dispose();
    releaseOutputDir(cfg.outputDir);
  }
}

/** Everything a step logs, with the names the step line and the report know. */
export function stepMetrics(
  trajs: Trajectory[],
  rewards: number[][],
  s: Awaited<ReturnType<typeof grpoStep>>,
  t: { lr: number; rolloutSeconds: number; trainSeconds: number; stepSeconds: number },
): Record<string, number> {
  const r = meanStd(trajs.map((x) => x.reward!));
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
  const components: Record<string, number> = {};
  for (const name of Object.keys(trajs[0]?.rewardComponents ?? {})) components[`reward_${name}`] = mean(trajs.map((x) => x.rewardComponents![name]));
  const calls = trajs.reduce((a, x) => a + x.numToolCalls + x.numParseErrors, 0);
  const failed = trajs.reduce((a, x) => a + x.numToolErrors + x.numParseErrors, 0);
  const rolloutTokens = trajs.reduce((a, x) => a + x.completionIds.length, 0);
  return {
    reward: r.mean,
    reward_std: r.std,
    accuracy: components.reward_correctness ?? NaN,
    ...components,
    kl: s.kl,
    clip_ratio: s.clipFrac,
    clip_ratio_low: s.clipFracLow,
    clip_ratio_high: s.clipFracHigh,
    entropy: s.entropy,
    loss: s.loss,
    grad_norm: s.gradNorm,
    lr: t.lr,
    completion_len: mean(trajs.map((x) => x.completionIds.length)),
    sampled_len: mean(trajs.map((x) => x.lossMask.reduce((a, b) => a + b, 0))),
    tool_calls: mean(trajs.map((x) => x.numToolCalls)),
    tool_error_rate: calls ? failed / calls : 0,
    truncated: mean(trajs.map((x) => (x.truncated ? 1 : 0))),
    zero_signal_groups: mean(rewards.map((g) => (groupHasSignal(g) ? 0 : 1))),
    rollout_tokens_per_s: rolloutTokens / t.rolloutSeconds,
    train_tokens_per_s: s.tokens / Math.max(t.trainSeconds, 1e-9),
    rollout_time: t.rolloutSeconds,
    train_time: t.trainSeconds,
    step_time: t.stepSeconds,
    ...memoryFields(),
  };
}
