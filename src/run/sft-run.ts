/** SFT warmup: GSM8K (or synthetic) solutions become tool-calling conversations (agents/sft.ts),
 *  rendered with the chat template; next-token cross-entropy on the assistant's tokens only, AdamW
 *  with clipping and gradient accumulation, a learning-rate schedule; LoRA on a (quantized) frozen
 *  base, or every weight with `full`. Ends with the trained part in <output_dir>/final (PEFT adapter
 *  or HF folder, plus tokenizer files), metrics.jsonl, report.html and a held-out evaluation.
 *  Checkpoints (--save_steps, and always the last step) let --resume continue or finish a run. */
import * as path from "node:path";
import { calculatorTool } from "../agents/calculator.ts";
import { toolSchema } from "../agents/types.ts";
import { openTools } from "../agents/toolset.ts";
import { buildSftConversations } from "../agents/sft.ts";
import type { SyntheticOptions } from "../datasets/synthetic.ts";
import type { ChatMessage, LoraConfig } from "../model/types.ts";
import { TINY_PROBLEMS } from "../presets/tiny.ts";
import { discardFailedRun, prepareOutputDir, releaseOutputDir, writeRunConfig } from "./output-dir.ts";
import { UsageError } from "../util/errors.ts";
import { closingEvaluation, Interrupted, watchInterrupts } from "./shutdown.ts";
import { rightPad } from "../trainer/batch.ts";
import { CheckpointSchedule, checkResumable, configHash, holdsCheckpoint, loadCheckpoint, saveCheckpoint } from "../trainer/checkpoint.ts";
import { collectGarbage } from "../util/gc.ts";
import { formatStepLine, memoryFields, MetricsLogger, readMetrics, SFT_LINE } from "../trainer/metrics.ts";
import { AdamW } from "../trainer/optimizer.ts";
import { createProgress } from "../trainer/progress.ts";
import { writeReport } from "../report/report.ts";
import { lrAt } from "../trainer/schedule.ts";
import { sftStep, type SftBatch } from "../trainer/sft.ts";
import { Rng } from "../util/rng.ts";
import { heldOutCutsTraining, loadTrainingData } from "./data.ts";
import { finalEvaluation, type EvalResult } from "./evaluate.ts";
import { checkModelSource, openPolicy, runFinished, savePolicy, withOutputDir } from "./policy.ts";
import { runIdentity, turnSettings } from "./flags.ts";
import { defaultOutputDir, loraTargets } from "./options.ts";
import { SFT_FLAGS, type SftFlags } from "./sft-flags.ts";
import { exportOptimizer, importOptimizer } from "./train-state.ts";
import type { ThreadsSpec } from "../kernels/wasm/threads.ts";

/** The run's configuration: the script's flags as parsed (sft-flags.ts), plus what only a program
 *  passes. run.json holds it; a resumed run must match its `runIdentity`. */
export type SftRunConfig = SftFlags & {
  synthetic?: Omit<SyntheticOptions, "n" | "seed">; // default: the tiny preset's problems with --preset tiny
  quiet?: boolean;
};

export interface SftRunResult {
  steps: number;
  finalLoss: number;
  finalDir: string;
  eval: EvalResult | null;
  seconds: number;
}

/** The config fields a resumed run must share with the run it continues (output_dir is free, so a
 *  copied run folder resumes). */
function identity(cfg: SftRunConfig): Record<string, unknown> {
  const cut = heldOutCutsTraining(cfg.dataset) ? { eval_samples: cfg.eval_samples } : {}; // otherwise a free flag
  return { ...runIdentity(SFT_FLAGS, cfg), synthetic: cfg.synthetic, ...cut };
}

export async function runSft(options: SftRunConfig): Promise<SftRunResult> {
  const t0 = Date.now();
  // The values the flags leave open, settled once: what run.json and the resume check see.
  const cfg: SftRunConfig & { output_dir: string } = {
    ...options,
    output_dir: options.output_dir ?? defaultOutputDir(options.model_path, "sft"),
    synthetic: options.synthetic ?? (options.preset === "tiny" ? TINY_PROBLEMS : undefined),
  };
  const log = (line: string) => (cfg.quiet ? undefined : process.stderr.write(line + "\n"));
  // Everything the user named is checked before the run folder is touched.
  await checkModelSource(cfg.model_path, "--model_path");
  if (cfg.resume) await prepareOutputDir(cfg.output_dir, { resume: true, overwrite: cfg.overwrite, runKind: "sft" });
  // A run killed before its first checkpoint left nothing to continue: --resume runs it from step 0.
  const restart = cfg.resume && !(await holdsCheckpoint(cfg.output_dir));
  if (restart) log(`--resume: ${cfg.output_dir} holds no checkpoint yet (stopped before its first save); running it from step 0`);
  const ckpt = cfg.resume && !restart ? await loadCheckpoint(cfg.output_dir, { checkModel: true }) : null;
  if (ckpt) checkResumable(ckpt, identity(cfg), cfg.output_dir);
  const lora: LoraConfig | undefined = cfg.full
    ? undefined
    : { r: cfg.lora_r, alpha: cfg.lora_alpha, dropout: cfg.lora_dropout, targetModules: loraTargets(cfg.lora_targets) };
  // Held-out questions never include a training row; the split is logged and kept in run.json.
  const {
    train: examples,
    heldOut,
    split,
  } = await loadTrainingData(
    { dataset: cfg.dataset, purpose: "sft", maxSamples: cfg.max_samples, synthetic: cfg.synthetic },
    cfg.eval_samples,
  );
  log(`data: ${split}`);
  // A resumed run continues the checkpoint: the full model saved there, or the base with its adapter.
  const base = ckpt ? ((ckpt.state.extra?.base as string) ?? cfg.model_path) : cfg.model_path;
  const open = () =>
    openPolicy({
      modelPath: ckpt && cfg.full ? ckpt.dir : base,
      adapter: ckpt && !cfg.full ? ckpt.dir : undefined,
      quantize: cfg.quantize,
      lora,
      trainable: cfg.full ? "full" : "lora",
      seed: cfg.seed,
      backend: cfg.backend,
      threads: cfg.threads,
      unpackBase: cfg.unpack_base,
    });
  const policy = ckpt ? await open() : await withOutputDir(cfg.output_dir, { overwrite: cfg.overwrite || restart, runKind: "sft" }, open);
  if (ckpt) policy.base = base;
  const { model, tokenizer } = policy;
  const optimizer = new AdamW(model.trainableVariables(), { lr: cfg.learning_rate, weightDecay: cfg.weight_decay });
  // SFT demonstrations are GSM8K's calculator annotations, so SFT knows one tool; the set stops its worker.
  const toolSet = await openTools(["calculator"]);
  try {
    if (!ckpt) await writeRunConfig(cfg.output_dir, { ...cfg, base: policy.base, dataSplit: split }, "sft");
    if (ckpt) importOptimizer(optimizer, ckpt.optimizerState!);
    // Conversations: every calculator call re-run, so tool messages show what rollouts will show.
    const built = await buildSftConversations(examples, calculatorTool, {
      inlineShare: cfg.inline_share,
      inlineOps: cfg.inline_ops,
      seed: cfg.seed,
    });
    const tools = cfg.tools_in_prompt ? [toolSchema(calculatorTool)] : undefined;
    const encoded = built.conversations.map((c) => tokenizer.encodeChat(c, { tools })).filter((e) => e.ids.length <= cfg.max_length);
    const tooLong = built.conversations.length - encoded.length;
    log(
      `sft data: ${examples.length} examples → ${encoded.length} conversations (${built.dropped.length} dropped for wrong annotations, ${tooLong} longer than --max_length ${cfg.max_length})` +
        (built.inlined > 0
          ? `; ${built.inlined} of ${built.inlined + countCalls(built.conversations)} calculator steps written inline`
          : ""),
    );
    if (encoded.length === 0)
      throw new UsageError(`no training conversations left (check --max_length ${cfg.max_length} and --dataset ${cfg.dataset})`);

    const perStep = cfg.batch_size * cfg.gradient_accumulation_steps;
    const stepsPerEpoch = Math.ceil(encoded.length / perStep);
    const totalSteps = stepsPerEpoch * cfg.num_epochs;
    const start = ckpt?.state.global_step ?? 0;
    // A run killed after its last step (while writing final/, evaluating or reporting) is finished here.
    if (start > totalSteps || (start === totalSteps && (await runFinished(cfg.output_dir, heldOut.length > 0))))
      throw new UsageError(
        `--resume: ${cfg.output_dir} already ran ${start} of ${totalSteps} steps; start a new --output_dir to train further`,
      );
    const schedule = { type: cfg.lr_scheduler, lr: cfg.learning_rate, warmupSteps: Math.floor(cfg.warmup_ratio * totalSteps), totalSteps };
    const metrics = new MetricsLogger(path.join(cfg.output_dir, "metrics.jsonl"), { resumeStep: start });
    const saves = new CheckpointSchedule(cfg.save_steps, totalSteps);
    const padId = tokenizer.padTokenId;
    const rng = new Rng(cfg.seed);
    const progress = createProgress(totalSteps, "sft", { keyMetric: "loss", start });
    let step = start;
    let lastLoss = await lastLoggedLoss(path.join(cfg.output_dir, "metrics.jsonl"), start); // a resumed run that has no step left
    const report = () => writeReport(cfg.output_dir, { title: `SFT ${path.basename(policy.base)}` });
    let savedStep = ckpt ? start : -1;
    const saveAt = async (s: number) => {
      await saveCheckpoint(cfg.output_dir, {
        saveModel: (dir) => savePolicy(policy, dir, cfg.full),
        state: {
          global_step: s,
          epoch: s / stepsPerEpoch,
          data_position: (s % stepsPerEpoch) * perStep,
          config_hash: configHash(identity(cfg)),
          config: identity(cfg),
          log_history: [],
          extra: { base: policy.base },
        },
        optimizerState: await exportOptimizer(optimizer),
        saveTotalLimit: 2,
      });
      savedStep = s;
    };
    // Ctrl-C / SIGTERM: stop before the next step and save there (see shutdown.ts); during the closing
    // evaluation, stop it, write the report and leave the evaluation to --resume.
    const stop = watchInterrupts();
    const stopHere = async (s: number) => {
      if (s !== savedStep) await saveAt(s);
      return new Interrupted(`saved checkpoint-${s} in ${cfg.output_dir}; continue with --resume`);
    };
    try {
      for (let epoch = 0; epoch < cfg.num_epochs; epoch++) {
        // Every epoch's order is drawn, also those a resumed run skips, so the stream matches.
        const order = rng.shuffle(encoded.map((_, i) => i));
        for (let s = 0; s < stepsPerEpoch; s++) {
          if (epoch * stepsPerEpoch + s < start) continue;
          if (await stop.poll()) throw await stopHere(step);
          const tStep = Date.now();
          const rows = order.slice(s * perStep, (s + 1) * perStep);
          const micro: SftBatch[] = [];
          for (let i = 0; i < rows.length; i += cfg.batch_size) {
            const part = rows.slice(i, i + cfg.batch_size).map((r) => encoded[r]);
            micro.push(
              rightPad(
                part.map((e) => e.ids),
                part.map((e) => e.assistantMask),
                padId,
              ),
            );
          }
          const lr = lrAt(step, schedule);
          const r = await sftStep(model, optimizer, micro, { lr, maxGradNorm: cfg.max_grad_norm });
          step++;
          lastLoss = r.loss;
          collectGarbage(); // the step's dead objects go now, not in a sawtooth over many steps (util/gc.ts)
          const seconds = (Date.now() - tStep) / 1000;
          const tokensSeen = micro.reduce((a, b) => a + b.ids.length * b.ids[0].length, 0);
          const m = {
            loss: r.loss,
            lr,
            grad_norm: r.gradNorm,
            tokens: r.tokens,
            tokens_per_s: tokensSeen / seconds,
            epoch: step / stepsPerEpoch,
            step_time: seconds,
            ...memoryFields(),
          };
          metrics.log(step, m);
          progress.update(step, m);
          if (!cfg.quiet && (step % 10 === 0 || step === totalSteps)) progress.log(formatStepLine(step, totalSteps, m, SFT_LINE));
          if (saves.due(step) && step < totalSteps) await saveAt(step);
        }
      }
      if (await stop.poll()) throw await stopHere(step);
      // The last step is checkpointed too, so a run killed while writing final/ can be finished.
      if (savedStep !== step) await saveAt(step);
    } catch (err) {
      stop.dispose();
      throw err;
    } finally {
      progress.stop();
    }
    const finalDir = path.join(cfg.output_dir, "final");
    let evalResult: EvalResult | null;
    try {
      await savePolicy(policy, finalDir, cfg.full);
      log(`saved ${cfg.full ? "model" : "adapter"} to ${finalDir}`);
      evalResult = await closingEvaluation(stop, finalDir, report, (signal) =>
        finalEvaluation(model, tokenizer, heldOut, {
          ...turnSettings({ ...cfg, max_new_tokens: cfg.eval_max_new_tokens }),
          seed: cfg.seed,
          tools: toolSet.tools,
          outputDir: cfg.output_dir,
          metrics,
          step,
          log,
          signal,
        }),
      );
    } finally {
      stop.dispose();
    }
    await report();
    return { steps: step, finalLoss: lastLoss, finalDir, eval: evalResult, seconds: (Date.now() - t0) / 1000 };
  } catch (err) {
    if (!ckpt) await discardFailedRun(cfg.output_dir); // failed before its first step: leave nothing behind
    throw err;
  } finally {
    await toolSet.close();
    optimizer.dispose();
    model.dispose();
    releaseOutputDir(cfg.output_dir);
  }
}

/** The loss of the last step metrics.jsonl holds up to `step` (NaN when none). */
async function lastLoggedLoss(file: string, step: number): Promise<number> {
  const records = await readMetrics(file).catch(() => []);
  const last = records.filter((r) => r.step <= step && typeof r.loss === "number").at(-1);
  return last ? (last.loss as number) : NaN;
}

function countCalls(conversations: ChatMessage[][]): number {
  return conversations.reduce((n, c) => n + c.reduce((k, m) => k + (m.tool_calls?.length ?? 0), 0), 0);
}
