/** GRPO on a tool-using agent (the calculator by default; any tools through --tools, or an AgentGym
 *  environment through --env). Each step: take the next `promptsPerStep` questions, roll out G
 *  multi-turn samples each (tools run in the loop), score them, turn scores into group-relative
 *  advantages, and update the LoRA adapter on the frozen (quantized) base; the KL reference is the
 *  same base with the adapter switched off. Checkpoints hold the adapter, optimizer state and the
 *  position in the data; sampling draws from an Rng seeded by (seed, step), so a resumed run makes
 *  the same rollouts as an uninterrupted one.
 *  Whatever generates the rollouts is a RolloutEngine (rollout/engines/, --rollout_engine): the loop
 *  never asks which. The step's pieces between rollouts and update are grpo-step.ts. */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { checkToolsFit, systemPromptFor, toPrompt } from "../agents/prompts.ts";
import { noTools, openRunTools, type ToolSet } from "../agents/toolset.ts";
import type { Task } from "../datasets/tasks.ts";
import { expandRanges, openEnvironmentServer } from "../envs/episodes.ts";
import type { EnvironmentFactory } from "../envs/types.ts";
import type { LoraConfig } from "../model/types.ts";
import { prepareEngine, type RolloutEngine, type EngineContext } from "../rollout/engines/index.ts";
import { EngineError } from "../rollout/engines/openai-client.ts";
import { TrajectoryLog } from "../rollout/trajectories.ts";
import { CheckpointSchedule, checkResumable, configHash, holdsCheckpoint, loadCheckpoint, saveCheckpoint } from "../trainer/checkpoint.ts";
import { grpoStep, noUpdateStats } from "../trainer/grpo.ts";
import { formatStepLine, GRPO_LINE, MetricsLogger } from "../trainer/metrics.ts";
import { AdamW } from "../trainer/optimizer.ts";
import { createProgress } from "../trainer/progress.ts";
import { writeReport } from "../report/report.ts";
import { lrAt } from "../trainer/schedule.ts";
import { collectGarbage } from "../util/gc.ts";
import { NonFiniteError, UsageError } from "../util/errors.ts";
import { annotateRunConfig, discardFailedRun, prepareOutputDir, releaseOutputDir, writeRunConfig } from "./output-dir.ts";
import { closingEvaluation, Interrupted, watchInterrupts } from "./shutdown.ts";
import { dataStream, environmentSplit, heldOutCutsTraining, loadTrainingData } from "./data.ts";
import { finalEvaluation, type EvalResult } from "./evaluate.ts";
import { checkModelSource, openPolicy, runFinished, savePolicy, withOutputDir, type Policy } from "./policy.ts";
import { runIdentity, turnSettings } from "./flags.ts";
import { GRPO_FLAGS, settleGrpoConfig, TINY_GRPO, type GrpoRunConfig } from "./grpo-flags.ts";
import { describeLoss, engineMetrics, engineSampling, ENV_LINE, EnvFailures, grpoConfig, grpoRollouts, lossFields } from "./grpo-step.ts";
import { autoMicroBatchFields, autoMicroBatchNote, rolloutsOf, scoreStep, stepMetrics, type RolloutScorer } from "./grpo-step.ts";
import { loraTargets, toolConfig } from "./options.ts";
import { exportOptimizer, importOptimizer } from "./train-state.ts";

export { describeLoss, lossFields, stepMetrics, type RolloutScorer };

export type { GrpoRunConfig };

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
  const { cfg, rewardWeights } = settleGrpoConfig(options, envs);
  const log = (line: string) => (cfg.quiet ? undefined : process.stderr.write(line + "\n"));
  await checkPresetModel(cfg);
  await checkModelSource(cfg.model_path, "--model_path", cfg.init_adapter, "--init_adapter");
  if (cfg.resume) await prepareOutputDir(cfg.output_dir, { resume: true, overwrite: cfg.overwrite, runKind: "grpo" });
  // A run killed before its first checkpoint left nothing to continue: --resume runs it from step 0.
  const restart = cfg.resume && !(await holdsCheckpoint(cfg.output_dir));
  if (restart) log(`--resume: ${cfg.output_dir} holds no checkpoint yet (stopped before its first save); running it from step 0`);
  const ckpt = cfg.resume && !restart ? await loadCheckpoint(cfg.output_dir, { checkModel: true }) : null;
  if (ckpt) checkResumable(ckpt, identity(cfg), cfg.output_dir);
  const start = ckpt?.state.global_step ?? 0;
  const total = cfg.max_steps;
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
  // A run killed after its last step (while writing final/, evaluating or reporting) is finished by
  // --resume; a finished one only continues with more steps.
  if (start > total || (start === total && (await runFinished(cfg.output_dir, heldOut.length > 0))))
    throw new UsageError(`--resume: ${cfg.output_dir} already ran ${start} steps; raise --max_steps above ${start} to continue`);
  log(`data: ${split}`);
  // The rollout engine's flags, and that it answers or loads, are checked before anything is written.
  const openEngine = await prepareEngine(cfg, log);
  const toolSet = envs ? noTools() : await openRunTools(toolConfig(cfg), log);
  try {
    return await train(cfg, { t0, log, ckpt, restart, start, examples, heldOut, split, toolSet, envs, rewardWeights, openEngine, score });
  } finally {
    await toolSet.close();
  }
}

/** --preset tiny trains from the tiny SFT model, quickstart step 1's output: when that is not there
 *  yet, say which command makes it rather than only that the folder is missing. */
async function checkPresetModel(cfg: GrpoRunConfig): Promise<void> {
  if (cfg.preset !== "tiny" || path.normalize(cfg.model_path) !== TINY_GRPO.model_path) return;
  if (
    await fs.stat(path.join(cfg.model_path, "config.json")).then(
      () => true,
      () => false,
    )
  )
    return;
  throw new UsageError(
    `--preset tiny: GRPO starts from the tiny SFT model, ${cfg.model_path}, which is not there yet; run ` +
      `quickstart step 1 first: npx tsx scripts/train-sft.ts --preset tiny`,
  );
}

async function train(
  cfg: GrpoRunConfig & { output_dir: string; epsilon_high: number },
  c: {
    t0: number;
    log: (line: string) => void;
    ckpt: Awaited<ReturnType<typeof loadCheckpoint>> | null;
    restart: boolean; // --resume of a folder without a checkpoint: its files are replaced
    start: number;
    examples: Task[];
    heldOut: Task[];
    split: Awaited<ReturnType<typeof loadTrainingData>>["split"];
    toolSet: ToolSet;
    envs: EnvironmentFactory | null;
    rewardWeights: Record<string, number>;
    openEngine: (ctx: EngineContext) => Promise<RolloutEngine>;
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
  const policy: Policy = ckpt
    ? await open()
    : await withOutputDir(cfg.output_dir, { overwrite: cfg.overwrite || c.restart, runKind: "grpo" }, open);
  const { model, tokenizer } = policy;
  const optimizer = new AdamW(model.trainableVariables(), { lr: cfg.learning_rate, weightDecay: cfg.weight_decay });
  let engine: RolloutEngine | null = null;
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
    const questionsOf = (s: number) => Array.from({ length: cfg.prompts_per_step }, (_, i) => question(s * cfg.prompts_per_step + i));
    engine = await c.openEngine({
      model,
      tokenizer,
      modelDir: policy.base,
      workDir: cfg.output_dir,
      tools,
      sampling: engineSampling(cfg),
      log,
    });
    const promptsOf = (s: number) => questionsOf(s).map((ex) => toPrompt(ex.question, systemPromptFor(tools, ex.answerSchema, ex.scorer)));
    const stepRollouts = (e: RolloutEngine, step: number, batch: Task[]) =>
      rolloutsOf(e, { step, steps: total, batch, seed: cfg.seed, envs: c.envs, samples: cfg.samples_per_prompt, promptsOf });
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
    let autoNoted = false; // --micro_batch_size auto's choice printed (and kept in run.json)
    const envFailures = new EnvFailures(cfg.env_max_failed_steps);
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
    // A run that stops early (Ctrl-C, the engine gone) still leaves its report of the steps it made.
    const report = () => writeReport(cfg.output_dir, { title: `GRPO ${path.basename(policy.base)}`, extra: { loss: describeLoss(loss) } });
    const reportOnTheWayOut = () =>
      report().then(
        () => " and report.html",
        (err: Error) => (log(`note: report.html could not be written: ${err.message.split("\n")[0]}`), ""),
      );
    const stopHere = async (s: number) => {
      if (s !== savedStep) await saveAt(s);
      return new Interrupted(`saved checkpoint-${s}${await reportOnTheWayOut()} in ${cfg.output_dir}; continue with --resume`);
    };
    const progress = createProgress(total, "grpo", { keyMetric: "reward", start });
    try {
      for (step = start; step < total; step++) {
        if (await stop.poll()) throw await stopHere(step);
        const tStep = Date.now();
        const batch = questionsOf(step);
        const tRoll = Date.now();
        const rolled = await stepRollouts(engine, step, batch);
        const rolloutSeconds = (Date.now() - tRoll) / 1000;
        const scored = scoreStep(rolled.trajs, batch, { rewardWeights, scale: cfg.scale_rewards, score });
        const rollouts = grpoRollouts(scored, engine.behaviourLogprobs);
        const tTrain = Date.now();
        const lr = lrAt(step, schedule);
        const s =
          rollouts.length === 0
            ? noUpdateStats(0)
            : await grpoStep(model, optimizer, rollouts, grpoConfig(cfg, lr, tokenizer.padTokenId, engine));
        const trainSeconds = (Date.now() - tTrain) / 1000;
        const trajs = scored.trajs;
        const version = rolled.metrics.policy_version;
        await trajectoryLog.append(step + 1, trajs, tokenizer, version !== undefined ? { policyVersion: version } : undefined);
        collectGarbage(); // the step's dead objects go now, not in a sawtooth over many steps (util/gc.ts)
        const seconds = { lr, rolloutSeconds, trainSeconds, stepSeconds: (Date.now() - tStep) / 1000 };
        const auto = cfg.micro_batch_size === "auto" ? autoMicroBatchFields(s) : {};
        const m = { ...stepMetrics(trajs, scored.rewards, s, seconds), ...auto, ...loss, ...engineMetrics(rolled.metrics, s, engine) };
        metrics.log(step + 1, m);
        history.push({ step: step + 1, ...m });
        progress.update(step + 1, m);
        if (!cfg.quiet) progress.log(formatStepLine(step + 1, total, m, c.envs ? ENV_LINE : GRPO_LINE));
        const env = envFailures.see(trajs); // a note when rollouts failed on the environment; stop after too many steps of it
        if (env.note && !cfg.quiet) progress.log(`step ${step + 1}: ${env.note}`);
        const mbNote = cfg.micro_batch_size === "auto" ? autoMicroBatchNote(s, !autoNoted) : null;
        if (mbNote) {
          if (!cfg.quiet) progress.log(`step ${step + 1}: ${mbNote}`);
          if (!autoNoted) await annotateRunConfig(cfg.output_dir, { micro_batch_auto: { step: step + 1, ...auto } });
          autoNoted = true;
        }
        if (env.stop) {
          if (savedStep !== step + 1) await saveAt(step + 1);
          const wrote = await reportOnTheWayOut();
          throw new Error(
            `environment ${cfg.env}: ${env.stop}; stopped after step ${step + 1} and saved ` +
              `checkpoint-${step + 1}${wrote} in ${cfg.output_dir}; continue with --resume once the server answers`,
          );
        }
        if (saves.due(step + 1) && step + 1 < total) await saveAt(step + 1);
      }
      if (await stop.poll()) throw await stopHere(total);
      // The last step is checkpointed before final/ is written, so a run killed after it can be finished.
      if (savedStep !== total) await saveAt(total);
    } catch (err) {
      stop.dispose(); // the run ends here: signals exit at once again
      if (err instanceof EngineError) {
        // The engine died, stalled or answered nonsense before this step trained: its weights are step's.
        if (savedStep !== step) await saveAt(step);
        const wrote = await reportOnTheWayOut();
        throw new Error(
          `${err.message}; stopped before step ${step + 1} and saved checkpoint-${step}${wrote} in ` +
            `${cfg.output_dir}; continue with --resume once the engine answers`,
        );
      }
      if (err instanceof NonFiniteError)
        throw new Error(
          `${err.message} at step ${step + 1}: stopped; the last good checkpoint is kept in ${cfg.output_dir} ` +
            `(lower --learning_rate or check the data)`,
        );
      throw err;
    } finally {
      progress.stop();
    }
    const finalDir = path.join(cfg.output_dir, "final");
    let evalResult: EvalResult | null;
    try {
      await savePolicy(policy, finalDir, false);
      log(`saved adapter to ${finalDir}`);
      evalResult = await closingEvaluation(stop, finalDir, report, (signal) =>
        finalEvaluation(model, tokenizer, heldOut, {
          generate: (prompts, rc) => engine!.generate(prompts, rc), // evaluated as it was trained
          ...turnSettings(cfg),
          seed: cfg.seed,
          tools,
          envs: c.envs ?? undefined,
          outputDir: cfg.output_dir,
          metrics,
          step: total,
          log,
          signal,
        }),
      );
    } finally {
      stop.dispose();
    }
    await report();
    return { steps: total, finalDir, eval: evalResult, seconds: (Date.now() - t0) / 1000 };
  } catch (err) {
    if (!ckpt) await discardFailedRun(cfg.output_dir); // failed before its first step: leave nothing behind
    throw err;
  } finally {
    await engine?.close();
    optimizer.dispose();
    model.dispose();
    releaseOutputDir(cfg.output_dir);
  }
}
