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
import type { EnvironmentFactory } from "../envs/types.ts";
import type { LoraConfig } from "../model/types.ts";
import { EngineError, prepareEngine, type RolloutEngine, type EngineContext } from "../rollout/engines/index.ts";
import { TrajectoryLog } from "../rollout/trajectories.ts";
import { grpoStep, noUpdateStats } from "../trainer/grpo.ts";
import { formatStepLine, GRPO_LINE } from "../trainer/metrics.ts";
import { writeReport } from "../report/report.ts";
import { collectGarbage } from "../util/gc.ts";
import { NonFiniteError, UsageError } from "../util/errors.ts";
import { annotateRunConfig } from "./output-dir.ts";
import { dataStream, environmentSplit, loadTrainingData } from "./data.ts";
import { finalEvaluation } from "./evaluate.ts";
import { checkModelSource } from "./policy.ts";
import { turnSettings } from "./flags.ts";
import { GRPO_FLAGS, settleGrpoConfig, TINY_GRPO, type GrpoRunConfig } from "./grpo-flags.ts";
import { describeLoss, engineMetrics, engineSampling, ENV_LINE, EnvFailures, grpoConfig, grpoRollouts, lossFields } from "./grpo-step.ts";
import { autoMicroBatchFields, autoMicroBatchNote, rolloutsOf, scoreStep, stepMetrics } from "./grpo-step.ts";
import { environmentServer, toolConfig } from "./options.ts";
import { TrainingRun, type TrainingRunResult } from "./training-run.ts";

export { describeLoss, lossFields, stepMetrics };

export type { GrpoRunConfig };

export type GrpoRunResult = TrainingRunResult;

export async function runGrpo(options: GrpoRunConfig): Promise<GrpoRunResult> {
  const t0 = Date.now();
  // The environment server is checked first, by one real reset (its family also fixes the default
  // task ranges): one that does not answer or refuses its family's requests is a usage error before
  // anything is written.
  const envs = await environmentServer(options);
  const { cfg, rewardWeights } = settleGrpoConfig(options, envs);
  const log = (line: string) => (cfg.quiet ? undefined : process.stderr.write(line + "\n"));
  await checkPresetModel(cfg);
  await checkModelSource(cfg.model_path, "--model_path", cfg.init_adapter, "--init_adapter");
  const dir = cfg.output_dir;
  const run = await TrainingRun.begin("grpo", GRPO_FLAGS, cfg, log);
  // Tool servers are checked before the run folder is touched (the environment server was, above).
  // Held-out questions never include a training row; the split is logged and kept in run.json.
  const data = { dataset: cfg.dataset, purpose: "rl" as const, maxSamples: cfg.max_samples, synthetic: cfg.synthetic };
  const sets = envs
    ? environmentSplit(cfg.env!, cfg.env_tasks!, cfg.env_eval_tasks!, cfg.eval_samples)
    : await loadTrainingData(data, cfg.eval_samples);
  if (sets.train.length === 0) throw new UsageError(`--dataset ${cfg.dataset}: no questions to train on`);
  // A finished run only continues with more steps.
  if (await run.nothingLeft(cfg.max_steps, sets.heldOut.length > 0))
    throw new UsageError(`--resume: ${dir} already ran ${run.start} steps; raise --max_steps above ${run.start} to continue`);
  log(`data: ${sets.split}`);
  // The rollout engine's flags, and that it answers or loads, are checked before anything is written.
  const openEngine = await prepareEngine(cfg, log);
  const toolSet = envs ? noTools() : await openRunTools(toolConfig(cfg), log);
  try {
    return await train(cfg, run, { t0, log, sets, toolSet, envs, rewardWeights, openEngine });
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
  run: TrainingRun,
  c: {
    t0: number;
    log: (line: string) => void;
    sets: Awaited<ReturnType<typeof loadTrainingData>>; // the questions to train on, the held-out ones, and the split
    toolSet: ToolSet;
    envs: EnvironmentFactory | null;
    rewardWeights: Record<string, number>;
    openEngine: (ctx: EngineContext) => Promise<RolloutEngine>;
  },
): Promise<GrpoRunResult> {
  const { t0, log, rewardWeights } = c;
  const { train: examples, heldOut, split } = c.sets;
  const { checkpoint: ckpt, start } = run;
  const dir = cfg.output_dir;
  const total = cfg.max_steps;
  const tools = c.toolSet.tools;
  let opened: RolloutEngine | null = null; // closed on the way out
  // A resumed run continues the checkpoint's adapter; a new one the given adapter or a fresh one.
  return run.lifetime({ full: false, adapter: cfg.init_adapter, close: () => opened?.close() }, async (policy, optimizer) => {
    const { model, tokenizer } = policy;
    const positions = model.config.maxPositionEmbeddings;
    if (cfg.max_new_tokens >= positions)
      throw new UsageError(
        `--max_new_tokens ${cfg.max_new_tokens}: the model holds ${positions} positions, prompt included; expected fewer`,
      );
    // The system prompt with the tool schemas must leave room for the rollout (chat and eval check the same).
    if (!c.envs && tools.length > 0) checkToolsFit(tokenizer, positions, tools, cfg.max_new_tokens, cfg.tools_in_prompt);
    await run.record({ ...cfg, base: policy.base, adapter: policy.adapterDir, dataSplit: split });
    const question = dataStream(examples, cfg.seed);
    const questionsOf = (s: number) => Array.from({ length: cfg.prompts_per_step }, (_, i) => question(s * cfg.prompts_per_step + i));
    const engine = await c.openEngine({
      model,
      tokenizer,
      modelDir: policy.base,
      workDir: dir,
      tools,
      sampling: engineSampling(cfg),
      log,
    });
    opened = engine;
    const promptsOf = (s: number) => questionsOf(s).map((ex) => toPrompt(ex.question, systemPromptFor(tools, ex.answerSchema, ex.scorer)));
    const stepRollouts = (e: RolloutEngine, step: number, batch: Task[]) =>
      rolloutsOf(e, { step, steps: total, batch, seed: cfg.seed, envs: c.envs, samples: cfg.samples_per_prompt, promptsOf });
    const trajectoryLog = new TrajectoryLog(path.join(dir, "trajectories.jsonl"), { resumeStep: start });
    const history: Record<string, unknown>[] = [...(ckpt?.state.log_history ?? [])];
    // The loss and its settings, on every metrics line (constants, not charted) and in the report.
    const loss = lossFields(cfg);
    let step = start;
    let autoNoted = false; // --micro_batch_size auto's choice printed (and kept in run.json)
    const envFailures = new EnvFailures(cfg.env_max_failed_steps);
    // A run that stops early (Ctrl-C, the engine gone) still leaves its report of the steps it made.
    const report = () => writeReport(dir, { title: `GRPO ${path.basename(policy.base)}`, extra: { loss: describeLoss(loss) } });
    const loop = run.loop({
      total,
      position: (s) => ({ epoch: (s * cfg.prompts_per_step) / examples.length, data_position: s * cfg.prompts_per_step }),
      history,
      saveTotalLimit: cfg.save_total_limit,
      keyMetric: "reward",
      report,
      reportOnStop: true,
    });
    const { metrics, progress } = loop;
    const stopped = async (err: unknown) => {
      if (err instanceof EngineError)
        // The engine died, stalled or answered nonsense before this step trained: its weights are step's.
        return new Error(
          `${err.message}; stopped before step ${step + 1} and saved ${await loop.saveAndReport(step)}; ` +
            `continue with --resume once the engine answers`,
        );
      if (err instanceof NonFiniteError)
        return new Error(
          `${err.message} at step ${step + 1}: stopped; the last good checkpoint is kept in ${dir} ` +
            `(lower --learning_rate or check the data)`,
        );
    };
    await loop.steps(async () => {
      for (step = start; step < total; step++) {
        await loop.safePoint(step);
        const tStep = Date.now();
        const batch = questionsOf(step);
        const tRoll = Date.now();
        const rolled = await stepRollouts(engine, step, batch);
        const rolloutSeconds = (Date.now() - tRoll) / 1000;
        const scored = scoreStep(rolled.trajs, batch, { rewardWeights, scale: cfg.scale_rewards });
        const rollouts = grpoRollouts(scored, engine.behaviourLogprobs);
        const tTrain = Date.now();
        const lr = loop.lr(step);
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
          if (!autoNoted) await annotateRunConfig(dir, { micro_batch_auto: { step: step + 1, ...auto } });
          autoNoted = true;
        }
        if (env.stop)
          throw new Error(
            `environment ${cfg.env}: ${env.stop}; stopped after step ${step + 1} and saved ${await loop.saveAndReport(step + 1)}; ` +
              `continue with --resume once the server answers`,
          );
        await loop.saveIfDue(step + 1);
      }
    }, stopped);
    const { finalDir, eval: evalResult } = await loop.finish((signal) =>
      finalEvaluation(model, tokenizer, heldOut, {
        generate: (prompts, rc) => engine.generate(prompts, rc), // evaluated as it was trained
        ...turnSettings(cfg),
        seed: cfg.seed,
        tools,
        envs: c.envs ?? undefined,
        outputDir: dir,
        metrics,
        step: total,
        log,
        signal,
      }),
    );
    return { steps: total, finalDir, eval: evalResult, seconds: (Date.now() - t0) / 1000 };
  });
}
