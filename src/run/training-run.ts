/** One training run's lifecycle, the same for SFT and GRPO (sft-run.ts, grpo-run.ts: their setup and
 *  loop): the folder (output-dir.ts) and --resume; the policy and its optimizer; the safe point before
 *  each step, where Ctrl-C or SIGTERM (shutdown.ts) stops the run and saves it; saves every
 *  --save_steps and after the last step, so a run killed while writing final/ can be finished; the way
 *  out: final/, the closing evaluation (a stop cuts it short, --resume runs it), the report. */
import * as path from "node:path";
import { checkResumable, CheckpointSchedule, configHash, holdsCheckpoint, loadCheckpoint, saveCheckpoint } from "../trainer/checkpoint.ts";
import type { LoadedCheckpoint, TrainerState } from "../trainer/checkpoint.ts";
import { MetricsLogger } from "../trainer/metrics.ts";
import { AdamW } from "../trainer/optimizer.ts";
import { createProgress, type Progress } from "../trainer/progress.ts";
import { lrAt } from "../trainer/schedule.ts";
import { exists } from "../util/fs.ts";
import { heldOutCutsTraining } from "./data.ts";
import type { EvalResult } from "./evaluate.ts";
import { runIdentity, type FlagTable, type OptionsOf } from "./flags.ts";
import type { SftFlags } from "./sft-flags.ts";
import type { trainingFlags } from "./options.ts";
import { discardFailedRun, prepareOutputDir, releaseOutputDir, writeRunConfig } from "./output-dir.ts";
import { openPolicy, savePolicy, trainingPolicy, type Policy } from "./policy.ts";
import { Interrupted, watchInterrupts } from "./shutdown.ts";
import { exportOptimizer, importOptimizer } from "./train-state.ts";

/** What the lifecycle reads of a run's config: the model, LoRA and optimizer flags both runs share. */
export type TrainingConfig = OptionsOf<ReturnType<typeof trainingFlags>> &
  Pick<SftFlags, "resume" | "overwrite" | "dataset" | "eval_samples" | "save_steps"> & { output_dir: string; synthetic?: unknown };

export type TrainingRunResult = { steps: number; finalDir: string; eval: EvalResult | null; seconds: number };

export class TrainingRun {
  held?: { policy: Policy; optimizer: AdamW; full: boolean }; // from `lifetime` on

  private constructor(
    readonly kind: "sft" | "grpo",
    readonly cfg: TrainingConfig,
    readonly identity: Record<string, unknown>,
    readonly log: (line: string) => void,
    readonly checkpoint: LoadedCheckpoint | null,
    private readonly restart: boolean, // --resume found no checkpoint: the folder's files are replaced
  ) {}

  /** With --resume: lock the folder, load its last checkpoint and check it against the config's
   *  identity (the flags not marked free; output_dir is free, so a copied run folder resumes). */
  static async begin(kind: "sft" | "grpo", flags: FlagTable, cfg: TrainingConfig, log: (line: string) => void): Promise<TrainingRun> {
    const dir = cfg.output_dir;
    const cut = heldOutCutsTraining(cfg.dataset) ? { eval_samples: cfg.eval_samples } : {}; // otherwise a free flag
    const identity = { ...runIdentity(flags, cfg), synthetic: cfg.synthetic, ...cut };
    if (cfg.resume) await prepareOutputDir(dir, { resume: true, overwrite: cfg.overwrite, runKind: kind });
    // A run killed before its first checkpoint left nothing to continue: --resume runs it from step 0.
    const restart = !!cfg.resume && !(await holdsCheckpoint(dir));
    if (restart) log(`--resume: ${dir} holds no checkpoint yet (stopped before its first save); running it from step 0`);
    const ckpt = cfg.resume && !restart ? await loadCheckpoint(dir, { checkModel: true }) : null;
    if (ckpt) checkResumable(ckpt, identity, dir);
    return new TrainingRun(kind, cfg, identity, log, ckpt, restart);
  }

  get start(): number {
    return this.checkpoint?.state.global_step ?? 0;
  }

  /** Whether --resume has nothing left to do: more than `total` steps ran, or all and the run finished
   *  (final/, eval.json when it has held-out questions, the report; a stopped run has no eval.json). */
  async nothingLeft(total: number, evaluates: boolean): Promise<boolean> {
    if (this.start !== total) return this.start > total;
    const has = (f: string) => exists(path.join(this.cfg.output_dir, f));
    return (await has("final")) && (await has("report.html")) && (!evaluates || (await has("eval.json")));
  }

  /** Open the policy and its AdamW, run `body`; however it ends, run `close`, free them and unlock the
   *  folder. A resumed run continues its checkpoint (the full model saved there, or the recorded base
   *  with its adapter); a new one opens --model_path with `adapter`, a fresh LoRA adapter, or `full`. */
  async lifetime<R>(
    o: { full: boolean; adapter?: string; close?: () => Promise<unknown> | undefined },
    body: (policy: Policy, optimizer: AdamW) => Promise<R>,
  ): Promise<R> {
    const { cfg, checkpoint: ckpt } = this;
    const base = ckpt ? ((ckpt.state.extra?.base as string) ?? cfg.model_path) : cfg.model_path;
    const open = () =>
      openPolicy(
        trainingPolicy(cfg, {
          modelPath: ckpt && o.full ? ckpt.dir : base,
          adapter: ckpt ? (o.full ? undefined : ckpt.dir) : o.adapter,
          full: o.full,
        }),
      );
    // A new run takes its folder first (emptied with --overwrite, or when --resume found no checkpoint)
    // and leaves nothing behind if it fails before its first step (a folder it created included).
    if (!ckpt) await prepareOutputDir(cfg.output_dir, { overwrite: cfg.overwrite || this.restart, runKind: this.kind });
    const policy = await open().catch(async (err: unknown) => {
      if (!ckpt) await discardFailedRun(cfg.output_dir);
      throw err;
    });
    if (ckpt) policy.base = base;
    const optimizer = new AdamW(policy.model.trainableVariables(), { lr: cfg.learning_rate, weightDecay: cfg.weight_decay });
    this.held = { policy, optimizer, full: o.full };
    try {
      return await body(policy, optimizer);
    } catch (err) {
      if (!ckpt) await discardFailedRun(cfg.output_dir); // failed before its first step
      throw err;
    } finally {
      await o.close?.();
      optimizer.dispose();
      policy.model.dispose();
      releaseOutputDir(cfg.output_dir);
    }
  }

  /** A new run writes run.json (`config`, resolved); a resumed one takes its optimizer state back. */
  async record(config: Record<string, unknown>): Promise<void> {
    if (!this.checkpoint) await writeRunConfig(this.cfg.output_dir, config, this.kind);
    else importOptimizer(this.held!.optimizer, this.checkpoint.optimizerState!);
  }

  /** The loop's safe points, saves and logs, from here to the end of the run. */
  loop(o: LoopOptions): RunLoop {
    return new RunLoop(this, o);
  }
}

export interface LoopOptions {
  total: number;
  /** Where the data stands after `step` steps: the checkpoint's epoch and data_position. */
  position: (step: number) => Pick<TrainerState, "epoch" | "data_position">;
  history?: Record<string, unknown>[]; // the log tail a checkpoint keeps
  saveTotalLimit: number;
  keyMetric: string; // the progress bar's metric
  report: () => Promise<unknown>;
  reportOnStop: boolean; // the report is written when the run stops early too, not only at its end
}

export class RunLoop {
  readonly metrics: MetricsLogger;
  readonly progress: Progress;
  private readonly saves: CheckpointSchedule;
  readonly lr: (step: number) => number;
  private savedStep: number; // the last step whose checkpoint is on disk
  private readonly stop = watchInterrupts(); // Ctrl-C / SIGTERM: stop at the next safe point, and save there

  constructor(
    private readonly run: TrainingRun,
    private readonly o: LoopOptions,
  ) {
    const { cfg, start } = run;
    this.metrics = new MetricsLogger(path.join(cfg.output_dir, "metrics.jsonl"), { resumeStep: start });
    this.progress = createProgress(o.total, run.kind, { keyMetric: o.keyMetric, start });
    this.saves = new CheckpointSchedule(cfg.save_steps, o.total);
    const warmupSteps = Math.floor(cfg.warmup_ratio * o.total);
    const schedule = { type: cfg.lr_scheduler, lr: cfg.learning_rate, warmupSteps, totalSteps: o.total };
    this.lr = (step) => lrAt(step, schedule);
    this.savedStep = run.checkpoint ? start : -1;
  }

  /** Before each step: after an interrupt, save here and end the run as Interrupted. */
  async safePoint(step: number): Promise<void> {
    if (await this.stop.poll()) throw new Interrupted(`saved ${await this.saveAndReport(step)}; continue with --resume`);
  }

  /** After a step: its checkpoint when --save_steps asks for one (the last step's is written by `steps`). */
  async saveIfDue(step: number): Promise<void> {
    if (this.saves.due(step) && step < this.o.total) await this.save(step);
  }

  /** Stopping early: step `step`'s checkpoint and (reportOnStop) the report. Says what it wrote, for the
   *  message that ends the run: "checkpoint-3 and report.html in <dir>". */
  async saveAndReport(step: number): Promise<string> {
    await this.save(step);
    const wrote = !this.o.reportOnStop
      ? ""
      : await this.o.report().then(
          () => " and report.html",
          (err: Error) => (this.run.log(`note: report.html could not be written: ${err.message.split("\n")[0]}`), ""),
        );
    return `checkpoint-${step}${wrote} in ${this.run.cfg.output_dir}`;
  }

  /** The loop, then the last step's checkpoint. An error ends the run here (signals exit at once
   *  again); `stopped` may turn it into the error to throw, after saving what it can. */
  async steps(loop: () => Promise<void>, stopped?: (err: unknown) => Promise<Error | undefined>): Promise<void> {
    try {
      await loop();
      await this.safePoint(this.o.total);
      await this.save(this.o.total); // before final/ is written, so a run killed after it can be finished
    } catch (err) {
      this.stop.dispose();
      throw (await stopped?.(err)) ?? err;
    } finally {
      this.progress.stop();
    }
  }

  /** final/, the closing evaluation, the report. A stop during the evaluation (Ctrl-C, the engine or an
   *  environment gone) ends its rollouts at their next decode step; the report is written and the run
   *  ends as Interrupted, saying that --resume runs the evaluation. */
  async finish(evaluate: (signal: AbortSignal) => Promise<EvalResult | null>): Promise<{ finalDir: string; eval: EvalResult | null }> {
    const { policy, full } = this.run.held!;
    const finalDir = path.join(this.run.cfg.output_dir, "final");
    let result: EvalResult | null;
    try {
      await savePolicy(policy, finalDir, full);
      this.run.log(`saved ${full ? "model" : "adapter"} to ${finalDir}`);
      result = await evaluate(this.stop.abortSignal);
      if (this.stop.requested) {
        await this.o.report();
        throw new Interrupted(
          `saved ${finalDir} and report.html; the closing evaluation was cut short: --resume runs it and writes eval.json`,
        );
      }
    } finally {
      this.stop.dispose();
    }
    await this.o.report();
    return { finalDir, eval: result };
  }

  private async save(step: number): Promise<void> {
    if (step === this.savedStep) return;
    const { cfg, identity } = this.run;
    const { policy, optimizer, full } = this.run.held!;
    await saveCheckpoint(cfg.output_dir, {
      saveModel: (dir) => savePolicy(policy, dir, full),
      state: {
        global_step: step,
        ...this.o.position(step),
        config_hash: configHash(identity),
        config: identity,
        log_history: this.o.history ?? [],
        extra: { base: policy.base },
      },
      optimizerState: await exportOptimizer(optimizer),
      saveTotalLimit: this.o.saveTotalLimit,
    });
    this.savedStep = step;
  }
}
