/** GRPO on a tool-using agent (the calculator by default; any tools through --tools, or an AgentGym
 *  environment through --env). Each step: take the next `promptsPerStep` questions, roll out G
 *  multi-turn samples each (tools run in the loop), score them, turn scores into group-relative
 *  advantages, and update the LoRA adapter on the frozen (quantized) base; the KL reference is the
 *  same base with the adapter switched off. Checkpoints hold the adapter, optimizer state and the
 *  position in the data; sampling draws from an Rng seeded by (seed, step), so a resumed run makes
 *  the same rollouts as an uninterrupted one.
 *  Over 400 lines on purpose: the GRPO run reads top to bottom in one file (checks, opening, the
 *  step loop, checkpoints, the closing evaluation), as nanoGPT's train.py does. */
import * as path from "node:path";
import { checkToolsFit, systemPromptFor, toPrompt } from "../agents/prompts.ts";
import { openRunTools, type ToolSet } from "../agents/toolset.ts";
import type { Task } from "../datasets/tasks.ts";
import {
  checkTaskRange,
  defaultTaskRanges,
  environmentTasks,
  episodePrompt,
  expandRanges,
  formatRanges,
  openEnvironmentServer,
  openEpisodes,
} from "../envs/episodes.ts";
import type { EnvironmentFactory } from "../envs/types.ts";
import type { SyntheticOptions } from "../datasets/synthetic.ts";
import type { LoraConfig } from "../model/types.ts";
import { TINY_PROBLEMS } from "../presets/tiny.ts";
import { discardFailedRun, prepareOutputDir, releaseOutputDir, writeRunConfig } from "./cli.ts";
import { UsageError } from "../util/errors.ts";
import { Interrupted, watchInterrupts } from "./shutdown.ts";
import { rolloutGroups, type Trajectory } from "../rollout/rollout.ts";
import { TrajectoryLog } from "../rollout/trajectories.ts";
import { parseRewardWeights, scoreRollout } from "../rollout/rewards.ts";
import { countedGroupAdvantages, groupHasSignal } from "../trainer/advantages.ts";
import { CheckpointSchedule, checkResumable, configHash, loadCheckpoint, saveCheckpoint } from "../trainer/checkpoint.ts";
import { NonFiniteError } from "../util/errors.ts";
import { grpoStep, noUpdateStats, type GrpoRollout } from "../trainer/grpo.ts";
import { formatStepLine, GRPO_LINE, meanStd, memoryFields, MetricsLogger } from "../trainer/metrics.ts";
import { AdamW } from "../trainer/optimizer.ts";
import { defaultEpsilonHigh, importanceLevel } from "../trainer/policy-loss.ts";
import { createProgress } from "../trainer/progress.ts";
import { writeReport } from "../report/report.ts";
import { lrAt } from "../trainer/schedule.ts";
import { collectGarbage } from "../util/gc.ts";
import { Rng } from "../util/rng.ts";
import { heldOutCutsTraining, loadTrainingData } from "./data.ts";
import { finalEvaluation, type EvalResult } from "./evaluate.ts";
import { checkModelSource, openPolicy, runFinished, savePolicy, withOutputDir, type Policy } from "./policy.ts";
import { runIdentity, usage } from "./flags.ts";
import { GRPO_FLAGS, type GrpoFlags } from "./grpo-flags.ts";
import { EngineError, openRemoteRollouts, type RemoteRollouts, type StepRollouts } from "./grpo-remote.ts";
import { defaultOutputDir, loraTargets, toolConfig } from "./options.ts";
import { exportOptimizer, importOptimizer } from "./train-state.ts";
import type { ThreadsSpec } from "../engine/wasm-threads.ts";

/** The run's configuration: the script's flags as parsed (grpo-flags.ts), plus what only a program
 *  passes. run.json holds it; a resumed run must match its `runIdentity`. */
export type GrpoRunConfig = GrpoFlags & {
  synthetic?: Omit<SyntheticOptions, "n" | "seed">; // default: the tiny preset's problems with --preset tiny
  quiet?: boolean;
};

/** A rollout's reward and its parts, in place of the --reward_weights components (a program's own
 *  reward, e.g. one that gives random-weight rollouts a signal). */
export type RolloutScorer = (t: Trajectory, gold: string) => { reward: number; components: Record<string, number> };

export interface GrpoRunResult {
  steps: number;
  finalDir: string;
  eval: EvalResult | null;
  seconds: number;
}

/** The config fields a resumed run must share with the run it continues (output_dir is free, so a
 *  copied run folder resumes). */
function identity(cfg: GrpoRunConfig): Record<string, unknown> {
  const cut = heldOutCutsTraining(cfg.dataset) ? { eval_samples: cfg.eval_samples } : {}; // otherwise a free flag
  return { ...runIdentity(GRPO_FLAGS, cfg), synthetic: cfg.synthetic, ...cut };
}

/** --env's training and held-out tasks: the held-out ones are the first --eval_samples of
 *  --env_eval_tasks, and the two range lists may not share a data_idx. */
function environmentSplit(env: string, trainSpec: string, heldOutSpec: string, evalSamples: number) {
  const train = expandRanges(trainSpec);
  const heldOut = expandRanges(heldOutSpec);
  const trainSet = new Set(train);
  const shared = heldOut.filter((i) => trainSet.has(i));
  if (shared.length > 0)
    throw new UsageError(
      `--env_tasks ${trainSpec} and --env_eval_tasks ${heldOutSpec} share data_idx ${formatRanges(shared)}; held-out tasks must not be trained on`,
    );
  const evaluated = heldOut.slice(0, evalSamples);
  return {
    train: environmentTasks(train),
    heldOut: environmentTasks(evaluated),
    split: `environment ${env}: train data_idx ${trainSpec}; ${evaluated.length > 0 ? `held out data_idx ${formatRanges(evaluated)}` : "none held out (--eval_samples 0)"}`,
  };
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

export async function runGrpo(options: GrpoRunConfig, score?: RolloutScorer): Promise<GrpoRunResult> {
  const t0 = Date.now();
  // The environment server is checked first, by one real reset (its family also fixes the default
  // task ranges): one that does not answer or refuses its family's requests is a usage error before
  // anything is written.
  const envs = options.env
    ? await openEnvironmentServer(options.env, {
        dialect: options.env_dialect,
        timeoutMs: options.tool_timeout * 1000,
        maxChars: options.tool_max_chars,
        probeIdx: options.env_tasks ? expandRanges(options.env_tasks)[0] : 0,
      })
    : null;
  const ranges = envs ? defaultTaskRanges(envs.family, options.max_samples ?? 100) : null;
  // The values the flags leave open, settled once: what run.json and the resume check see.
  const cfg: GrpoRunConfig & { output_dir: string; epsilon_high: number } = {
    ...options,
    output_dir: options.output_dir ?? defaultOutputDir(options.model_path, "grpo"),
    epsilon_high: options.epsilon_high ?? defaultEpsilonHigh(options.loss_type, options.epsilon),
    importance_sampling_level: importanceLevel({ lossType: options.loss_type, importanceSamplingLevel: options.importance_sampling_level }),
    synthetic: options.synthetic ?? (options.preset === "tiny" ? TINY_PROBLEMS : undefined),
    // With --env, the task ranges as run.json records them (and the resume check compares).
    ...(ranges ? { env_tasks: options.env_tasks ?? ranges.train, env_eval_tasks: options.env_eval_tasks ?? ranges.heldOut } : {}),
  };
  if (envs) {
    checkTaskRange(envs.family, "--env_tasks", cfg.env_tasks!);
    checkTaskRange(envs.family, "--env_eval_tasks", cfg.env_eval_tasks!);
  }
  // With an environment and the default weights, the reward is the environment's.
  const weightSpec = cfg.env && cfg.reward_weights === GRPO_FLAGS.reward_weights.default ? "env=1" : cfg.reward_weights;
  const rewardWeights = usage("--reward_weights", () => parseRewardWeights(weightSpec));
  const log = (line: string) => (cfg.quiet ? undefined : process.stderr.write(line + "\n"));
  await checkModelSource(cfg.model_path, "--model_path", cfg.init_adapter, "--init_adapter");
  if (!(cfg.top_p > 0 && cfg.top_p <= 1)) throw new UsageError(`--top_p ${cfg.top_p}: expected a number above 0 and at most 1`);
  if (!(cfg.epsilon >= 0 && cfg.epsilon < 1))
    throw new UsageError(
      `--epsilon ${cfg.epsilon}: expected a number >= 0 and below 1 (the ratio is clipped to [1 - epsilon, 1 + epsilon_high])`,
    );
  if (cfg.resume) await prepareOutputDir(cfg.output_dir, { resume: true, overwrite: cfg.overwrite, runKind: "grpo" });
  const ckpt = cfg.resume ? await loadCheckpoint(cfg.output_dir) : null;
  if (ckpt) checkResumable(ckpt, identity(cfg), cfg.output_dir);
  const start = ckpt?.state.global_step ?? 0;
  const total = cfg.max_steps;
  // A run killed after its last step (while writing final/, evaluating or reporting) is finished by
  // --resume; a finished one only continues with more steps.
  if (start > total || (start === total && (await runFinished(cfg.output_dir))))
    throw new UsageError(`--resume: ${cfg.output_dir} already ran ${start} steps; raise --max_steps above ${start} to continue`);
  // Tool servers are checked before the run folder is touched (the environment server was, above).
  // Held-out questions never include a training row; the split is logged and kept in run.json.
  const {
    train: examples,
    heldOut,
    split,
  } = envs
    ? environmentSplit(cfg.env!, cfg.env_tasks!, cfg.env_eval_tasks!, cfg.eval_samples)
    : await loadTrainingData(
        { dataset: cfg.dataset, purpose: "rl", maxSamples: cfg.max_samples, synthetic: cfg.synthetic },
        cfg.eval_samples,
      );
  if (examples.length === 0) throw new UsageError(`--dataset ${cfg.dataset}: no questions to train on`);
  log(`data: ${split}`);
  const remote = await openRemoteRollouts(cfg, null, log); // --rollout_engine openai: an engine that does not answer is a usage error
  const toolSet = envs ? { tools: [], close: async () => {} } : await openRunTools(toolConfig(cfg), log);
  try {
    return await train(cfg, { t0, log, ckpt, start, examples, heldOut, split, toolSet, envs, rewardWeights, remote, score });
  } finally {
    await toolSet.close();
    await remote?.close();
  }
}

async function train(
  cfg: GrpoRunConfig & { output_dir: string; epsilon_high: number },
  c: {
    t0: number;
    log: (line: string) => void;
    ckpt: Awaited<ReturnType<typeof loadCheckpoint>> | null;
    start: number;
    examples: Task[];
    heldOut: Task[];
    split: Awaited<ReturnType<typeof loadTrainingData>>["split"];
    toolSet: ToolSet;
    envs: EnvironmentFactory | null;
    rewardWeights: Record<string, number>;
    remote: RemoteRollouts | null;
    score?: RolloutScorer;
  },
): Promise<GrpoRunResult> {
  const { t0, log, ckpt, start, examples, heldOut, split, rewardWeights, score } = c;
  const total = cfg.max_steps;
  const tools = c.toolSet.tools;
  const lora: LoraConfig = {
    r: cfg.lora_r,
    alpha: cfg.lora_alpha,
    dropout: cfg.lora_dropout,
    targetModules: loraTargets(cfg.lora_targets),
  };
  // A resumed run continues the checkpoint's adapter; a new one the given adapter or a fresh one.
  const open = () =>
    openPolicy({
      modelPath: ckpt ? ((ckpt.state.extra?.base as string) ?? cfg.model_path) : cfg.model_path,
      adapter: ckpt ? ckpt.dir : cfg.init_adapter,
      quantize: cfg.quantize,
      lora,
      trainable: "lora",
      seed: cfg.seed,
      backend: cfg.backend,
      threads: cfg.threads,
      unpackBase: cfg.unpack_base,
    });
  const policy: Policy = ckpt ? await open() : await withOutputDir(cfg.output_dir, { overwrite: cfg.overwrite, runKind: "grpo" }, open);
  const { model, tokenizer } = policy;
  const optimizer = new AdamW(model.trainableVariables(), { lr: cfg.learning_rate, weightDecay: cfg.weight_decay });
  try {
    const positions = model.config.maxPositionEmbeddings;
    if (cfg.max_new_tokens >= positions)
      throw new UsageError(
        `--max_new_tokens ${cfg.max_new_tokens}: the model holds ${positions} positions, prompt included; expected fewer`,
      );
    // The system prompt with the tool schemas must leave room for the rollout (chat and eval check the same).
    if (!c.envs && tools.length > 0) checkToolsFit(tokenizer, positions, tools, cfg.max_new_tokens, cfg.tools_in_prompt);
    if (!ckpt) await writeRunConfig(cfg.output_dir, { ...cfg, base: policy.base, adapter: policy.adapterDir, dataSplit: split }, "grpo");
    if (ckpt) importOptimizer(optimizer, ckpt.optimizerState!);
    const question = dataStream(examples, cfg.seed);
    const remoteRun = { model, tokenizer, tools, outputDir: cfg.output_dir, steps: total, question, cfg };
    const schedule = {
      type: cfg.lr_scheduler,
      lr: cfg.learning_rate,
      warmupSteps: Math.floor(cfg.warmup_ratio * total),
      totalSteps: total,
    };
    const metrics = new MetricsLogger(path.join(cfg.output_dir, "metrics.jsonl"), { resumeStep: start });
    const trajectoryLog = new TrajectoryLog(path.join(cfg.output_dir, "trajectories.jsonl"), { resumeStep: start });
    const saves = new CheckpointSchedule(cfg.save_steps, total);
    const history: Record<string, unknown>[] = [...(ckpt?.state.log_history ?? [])];
    // The loss and its settings, on every metrics line (constants, not charted) and in the report.
    const loss = lossFields(cfg);
    let step = start;
    let failedSteps = 0; // steps in a row in which every rollout failed on the environment
    // The last step whose checkpoint is on disk: an interrupt never rewrites a complete checkpoint.
    let savedStep = ckpt ? start : -1;
    const saveAt = async (s: number) => {
      await saveCheckpoint(cfg.output_dir, {
        saveModel: (dir) => savePolicy(policy, dir, false),
        state: {
          global_step: s,
          epoch: (s * cfg.prompts_per_step) / examples.length,
          data_position: s * cfg.prompts_per_step,
          config_hash: configHash(identity(cfg)),
          config: identity(cfg),
          log_history: history,
          extra: { base: policy.base },
        },
        optimizerState: await exportOptimizer(optimizer),
        saveTotalLimit: cfg.save_total_limit,
      });
      savedStep = s;
    };
    // Ctrl-C / SIGTERM: the loop stops at its next safe point (before a step starts, when weights,
    // optimizer state and history all belong to the same step) and saves there.
    const stop = watchInterrupts();
    const stopHere = async (s: number) => {
      if (s !== savedStep) await saveAt(s);
      return new Interrupted(`saved checkpoint-${s} in ${cfg.output_dir}; continue with --resume`);
    };
    const progress = createProgress(total, "grpo", { keyMetric: "reward", start });
    try {
      for (step = start; step < total; step++) {
        if (await stop.poll()) throw await stopHere(step);
        const tStep = Date.now();
        const batch = Array.from({ length: cfg.prompts_per_step }, (_, i) => question(step * cfg.prompts_per_step + i));
        const tRoll = Date.now();
        // With an environment, each task's prompt is its first observation and each row acts in its own instance.
        const episodes = c.envs
          ? await openEpisodes(
              c.envs,
              batch.map((ex) => Number(ex.id)),
              cfg.samples_per_prompt,
            )
          : null;
        let trajs: Trajectory[];
        let remoteStep: StepRollouts | null = null; // --rollout_engine openai: the engine's rollouts and their version
        try {
          const prompts = episodes
            ? episodes.observations.map((o) => episodePrompt(c.envs!, o))
            : batch.map((ex) => toPrompt(ex.question, systemPromptFor(tools, ex.answerSchema, ex.scorer)));
          if (c.remote) {
            remoteStep = await c.remote.rollouts(remoteRun, step);
            trajs = remoteStep.trajs;
          } else
            trajs = await rolloutGroups(model, tokenizer, prompts, {
              samplesPerPrompt: cfg.samples_per_prompt,
              maxNewTokens: cfg.max_new_tokens,
              maxTurns: cfg.max_turns,
              temperature: cfg.temperature,
              topP: cfg.top_p,
              topK: cfg.top_k,
              rng: new Rng(cfg.seed * 1_000_003 + step),
              tools,
              toolsInPrompt: cfg.tools_in_prompt,
              envs: episodes?.envs,
            });
        } finally {
          await episodes?.close();
        }
        const rolloutSeconds = (Date.now() - tRoll) / 1000;
        // A rollout the environment failed scores 0, is kept in the log, trains nothing and is left out
        // of its group's advantages (advantages.ts countedGroupAdvantages).
        const envFailed = (t: Trajectory) => t.finishReason === "env_error";
        for (const t of trajs) {
          const s = score ? score(t, batch[t.promptIndex].gold) : scoreRollout(t, batch[t.promptIndex], rewardWeights);
          t.reward = envFailed(t) ? 0 : s.reward;
          t.rewardComponents = s.components;
        }
        const groups = batch.map((_, p) => trajs.filter((t) => t.promptIndex === p));
        const counted = groups.map((g) => g.map((t) => !envFailed(t)));
        const rewards = groups.map((g) => g.map((t) => t.reward!));
        const adv = countedGroupAdvantages(rewards, counted, cfg.scale_rewards);
        const rollouts: GrpoRollout[] = groups.flatMap((g, p) =>
          g.flatMap((t, i) =>
            !counted[p][i]
              ? []
              : [
                  {
                    ids: [...t.promptIds, ...t.completionIds],
                    lossMask: [...t.promptIds.map(() => 0), ...t.lossMask],
                    advantage: adv[p][i],
                    truncated: t.finishReason === "length" || t.finishReason === "max_turns",
                    // The engine's log-probs of what it sampled: compared with the trainer's, and π_old when off-policy.
                    behaviourLogprobs: remoteStep
                      ? [...t.promptIds.map(() => NaN), ...t.sampleLogprobs.map((x, k) => (t.lossMask[k] ? x : NaN))]
                      : undefined,
                  },
                ],
          ),
        );
        const tTrain = Date.now();
        const lr = lrAt(step, schedule);
        const s =
          rollouts.length === 0
            ? noUpdateStats(0)
            : await grpoStep(model, optimizer, rollouts, {
                beta: cfg.beta,
                epsilon: cfg.epsilon,
                epsilonHigh: cfg.epsilon_high,
                lossType: cfg.loss_type,
                maxNewTokens: cfg.max_new_tokens,
                importanceSamplingLevel: cfg.importance_sampling_level,
                maskTruncatedCompletions: cfg.mask_truncated_completions,
                numIterations: cfg.num_iterations,
                maxGradNorm: cfg.max_grad_norm,
                lr,
                microBatchSize: cfg.micro_batch_size,
                padTokenId: tokenizer.padTokenId,
                offPolicy: cfg.async_rollouts > 0,
              });
        const trainSeconds = (Date.now() - tTrain) / 1000;
        await trajectoryLog.append(step + 1, trajs, tokenizer, remoteStep ? { policyVersion: remoteStep.version } : undefined);
        collectGarbage(); // the step's dead objects go now, not in a sawtooth over many steps (util/gc.ts)
        const m = {
          ...stepMetrics(
            trajs,
            rewards.map((g, p) => g.filter((_, i) => counted[p][i])),
            s,
            { lr, rolloutSeconds, trainSeconds, stepSeconds: (Date.now() - tStep) / 1000 },
          ),
          ...loss,
          ...(remoteStep ? { ...remoteStep.metrics, engine_logprob_gap: s.behaviourGap, engine_logprob_delta: s.behaviourDelta } : {}),
        };
        metrics.log(step + 1, m);
        history.push({ step: step + 1, ...m });
        progress.update(step + 1, m);
        if (!cfg.quiet) progress.log(formatStepLine(step + 1, total, m, c.envs ? ENV_LINE : GRPO_LINE));
        const failures = trajs.filter(envFailed);
        const lastError = (failures[0]?.envError ?? "").replace(/\s+/g, " ");
        if (failures.length > 0 && !cfg.quiet)
          progress.log(`step ${step + 1}: ${failures.length} of ${trajs.length} rollouts failed on the environment: ${lastError}`);
        failedSteps = failures.length === trajs.length ? failedSteps + 1 : 0;
        if (cfg.env_max_failed_steps > 0 && failedSteps >= cfg.env_max_failed_steps) {
          if (savedStep !== step + 1) await saveAt(step + 1);
          throw new Error(
            `environment ${cfg.env}: every rollout failed in ${failedSteps} steps in a row (last: ${lastError}); stopped after step ${step + 1} and saved checkpoint-${step + 1} in ${cfg.output_dir}; continue with --resume once the server answers`,
          );
        }
        if (saves.due(step + 1) && step + 1 < total) await saveAt(step + 1);
      }
      if (await stop.poll()) throw await stopHere(total);
      // The last step is checkpointed before final/ is written, so a run killed after it can be finished.
      if (savedStep !== total) await saveAt(total);
    } catch (err) {
      if (err instanceof EngineError) {
        // The engine died, stalled or answered nonsense before this step trained: its weights are step's.
        if (savedStep !== step) await saveAt(step);
        throw new Error(
          `${err.message}; stopped before step ${step + 1} and saved checkpoint-${step} in ${cfg.output_dir}; continue with --resume once the engine answers`,
        );
      }
      if (err instanceof NonFiniteError)
        throw new Error(
          `${err.message} at step ${step + 1}: stopped; the last good checkpoint is kept in ${cfg.output_dir} (lower --learning_rate or check the data)`,
        );
      throw err;
    } finally {
      progress.stop();
      stop.dispose();
    }
    const finalDir = path.join(cfg.output_dir, "final");
    await savePolicy(policy, finalDir, false);
    log(`saved adapter to ${finalDir}`);
    const evalResult = await finalEvaluation(model, tokenizer, heldOut, {
      maxNewTokens: cfg.max_new_tokens,
      maxTurns: cfg.max_turns,
      toolsInPrompt: cfg.tools_in_prompt,
      seed: cfg.seed,
      tools,
      envs: c.envs ?? undefined,
      outputDir: cfg.output_dir,
      metrics,
      step: total,
      log,
    });
    await writeReport(cfg.output_dir, { title: `GRPO ${path.basename(policy.base)}`, extra: { loss: describeLoss(loss) } });
    return { steps: total, finalDir, eval: evalResult, seconds: (Date.now() - t0) / 1000 };
  } catch (err) {
    if (!ckpt) await discardFailedRun(cfg.output_dir); // failed before its first step: leave nothing behind
    throw err;
  } finally {
    optimizer.dispose();
    model.dispose();
    releaseOutputDir(cfg.output_dir);
  }
}

/** The loss a run trains with and its hyper-parameters, as metrics.jsonl holds them. */
export function lossFields(cfg: GrpoRunConfig & { epsilon_high: number }): Record<string, string | number | boolean> {
  return {
    loss_type: cfg.loss_type,
    importance_sampling_level: cfg.importance_sampling_level,
    epsilon: cfg.epsilon,
    epsilon_high: cfg.epsilon_high,
    beta: cfg.beta,
    mask_truncated_completions: cfg.mask_truncated_completions,
  };
}

/** "minirl (ε 0.2, ε_high 0.3, β 0, token-level ratios, truncated rollouts trained)": the report's line. */
export function describeLoss(f: ReturnType<typeof lossFields>): string {
  return `${f.loss_type} (ε ${f.epsilon}, ε_high ${f.epsilon_high}, β ${f.beta}, ${f.importance_sampling_level}-level ratios, truncated rollouts ${f.mask_truncated_completions ? "masked" : "trained"})`;
}

/** The step line of a run against an environment: the GRPO line with the share of rollouts the
 *  environment failed. */
const ENV_LINE = [...GRPO_LINE.slice(0, -1), { key: "env_error_rate", label: "env err" }, ...GRPO_LINE.slice(-1)];

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
  for (const name of Object.keys(trajs[0]?.rewardComponents ?? {}))
    components[`reward_${name}`] = mean(trajs.map((x) => x.rewardComponents![name]));
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
    completion_len_max: Math.max(0, ...trajs.map((x) => x.completionIds.length)),
    sampled_len: mean(trajs.map((x) => x.lossMask.reduce((a, b) => a + b, 0))),
    tool_calls: mean(trajs.map((x) => x.numToolCalls)),
    tool_error_rate: calls ? failed / calls : 0,
    // Runs against an environment only, so a tool run's metrics stay as they were.
    ...(trajs[0]?.envReward !== undefined ? { env_error_rate: mean(trajs.map((x) => (x.finishReason === "env_error" ? 1 : 0))) } : {}),
    truncated: mean(trajs.map((x) => (x.truncated ? 1 : 0))),
    zero_signal_groups: mean(rewards.map((g) => (groupHasSignal(g) ? 0 : 1))),
    masked_truncated: s.maskedTruncated / Math.max(1, s.rollouts),
    rollout_tokens_per_s: rolloutTokens / t.rolloutSeconds,
    train_tokens_per_s: s.tokens / Math.max(t.trainSeconds, 1e-9),
    rollout_time: t.rolloutSeconds,
    train_time: t.trainSeconds,
    step_time: t.stepSeconds,
    ...memoryFields(),
  };
}
