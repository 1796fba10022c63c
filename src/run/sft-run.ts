/** SFT warmup: GSM8K (or synthetic) solutions become tool-calling conversations (datasets/sft.ts),
 *  rendered with the chat template; next-token cross-entropy on the assistant's tokens only, AdamW
 *  with clipping and gradient accumulation, a learning-rate schedule; LoRA on a (quantized) frozen
 *  base, or every weight with `full`. Ends with the trained part in <output_dir>/final (PEFT adapter
 *  or HF folder, plus tokenizer files), metrics.jsonl, report.html and a held-out evaluation.
 *  Checkpoints (--save_steps, and always the last step) let --resume continue or finish a run. */
import * as path from "node:path";
import { calculatorTool } from "../agents/calculator.ts";
import { toolSchema } from "../agents/types.ts";
import { openTools } from "../agents/toolset.ts";
import { buildSftConversations } from "../datasets/sft.ts";
import type { SyntheticOptions } from "../datasets/synthetic.ts";
import type { ChatMessage, LoraConfig, LoraTarget, Quantize } from "../model/types.ts";
import { discardFailedRun, prepareOutputDir, releaseOutputDir, UsageError, writeRunConfig } from "../cli.ts";
import { Interrupted, watchInterrupts } from "../shutdown.ts";
import { rightPad } from "../trainer/batch.ts";
import { CheckpointSchedule, checkResumable, configHash, loadCheckpoint, saveCheckpoint } from "../trainer/checkpoint.ts";
import { formatStepLine, memoryFields, MetricsLogger, SFT_LINE } from "../trainer/metrics.ts";
import { AdamW } from "../trainer/optimizer.ts";
import { createProgress } from "../trainer/progress.ts";
import { writeReport } from "../trainer/report.ts";
import { lrAt, type ScheduleType } from "../trainer/schedule.ts";
import { sftStep, type SftBatch } from "../trainer/sft.ts";
import { Rng } from "../util/rng.ts";
import { loadTrainingData } from "./data.ts";
import { finalEvaluation, type EvalResult } from "./evaluate.ts";
import { checkModelSource, openPolicy, runFinished, savePolicy, withOutputDir } from "./policy.ts";
import { exportOptimizer, importOptimizer } from "./train-state.ts";
import type { ThreadsSpec } from "../wasm-threads.ts";

export interface SftRunConfig {
  modelPath: string;
  dataset: string;
  synthetic?: Omit<SyntheticOptions, "n" | "seed">;
  maxSamples?: number;
  numEpochs: number;
  batchSize: number; // sequences per micro-batch
  gradientAccumulationSteps: number;
  learningRate: number;
  lrScheduler: ScheduleType;
  warmupRatio: number;
  weightDecay: number;
  maxGradNorm: number;
  maxLength: number; // longer conversations are dropped (counted), not cut: a cut loses the answer
  inlineShare?: number; // share of calculator steps written as plain text instead of a tool call (default 0)
  inlineOps?: string[]; // which steps may be: those using only these operators (default all)
  loraR: number;
  loraAlpha: number;
  loraDropout: number;
  loraTargets: LoraTarget[];
  quantize: Quantize;
  full: boolean;
  toolsInPrompt: boolean;
  evalSamples: number;
  evalMaxNewTokens: number;
  maxTurns: number;
  saveSteps: number; // 0: only the final model
  seed: number;
  outputDir: string;
  backend: string;
  threads?: ThreadsSpec; // wasm threads (default auto)
  unpackBase?: boolean; // for the final evaluation's generation (default true)
  overwrite: boolean;
  resume?: boolean;
  quiet?: boolean;
}

export interface SftRunResult {
  steps: number;
  finalLoss: number;
  finalDir: string;
  eval: EvalResult | null;
  seconds: number;
}

/** The config fields a resumed run must share with the run it continues. */
function identity(cfg: SftRunConfig): Record<string, unknown> {
  // outputDir is left out so a copied run folder resumes.
  const { overwrite, resume, quiet, saveSteps, evalSamples, evalMaxNewTokens, backend, threads, unpackBase, outputDir, ...rest } = cfg;
  void overwrite, resume, quiet, saveSteps, evalSamples, evalMaxNewTokens, backend, threads, unpackBase, outputDir;
  return rest;
}

export async function runSft(cfg: SftRunConfig): Promise<SftRunResult> {
  const t0 = Date.now();
  const log = (line: string) => (cfg.quiet ? undefined : process.stderr.write(line + "\n"));
  // Everything the user named is checked before the run folder is touched.
  await checkModelSource(cfg.modelPath, "--model_path");
  if (cfg.resume) await prepareOutputDir(cfg.outputDir, { resume: true, overwrite: cfg.overwrite, runKind: "sft" });
  const ckpt = cfg.resume ? await loadCheckpoint(cfg.outputDir) : null;
  if (ckpt) checkResumable(ckpt, identity(cfg), cfg.outputDir);
  const lora: LoraConfig | undefined = cfg.full ? undefined : { r: cfg.loraR, alpha: cfg.loraAlpha, dropout: cfg.loraDropout, targetModules: cfg.loraTargets };
  // Held-out questions never include a training row; the split is logged and kept in run.json.
  const { train: examples, heldOut, split } = await loadTrainingData({ dataset: cfg.dataset, purpose: "sft", maxSamples: cfg.maxSamples, synthetic: cfg.synthetic }, cfg.evalSamples);
  log(`data: ${split}`);
  // A resumed run continues the checkpoint: the full model saved there, or the base with its adapter.
  const base = ckpt ? ((ckpt.state.extra?.base as string) ?? cfg.modelPath) : cfg.modelPath;
  const open = () =>
    openPolicy({
      modelPath: ckpt && cfg.full ? ckpt.dir : base, adapter: ckpt && !cfg.full ? ckpt.dir : undefined,
      quantize: cfg.quantize, lora, trainable: cfg.full ? "full" : "lora", seed: cfg.seed, backend: cfg.backend, threads: cfg.threads, unpackBase: cfg.unpackBase,
    });
  const policy = ckpt ? await open() : await withOutputDir(cfg.outputDir, { overwrite: cfg.overwrite, runKind: "sft" }, open);
  if (ckpt) policy.base = base;
  const { model, tokenizer } = policy;
  const optimizer = new AdamW(model.trainableVariables(), { lr: cfg.learningRate, weightDecay: cfg.weightDecay });
  // SFT demonstrations are GSM8K's calculator annotations, so SFT knows one tool; the set stops its worker.
  const toolSet = await openTools(["calculator"]);
  try {
    if (!ckpt) await writeRunConfig(cfg.outputDir, { ...cfg, base: policy.base, dataSplit: split }, "sft");
    if (ckpt) importOptimizer(optimizer, ckpt.optimizerState!);
    // Conversations: every calculator call re-run, so tool messages show what rollouts will show.
    const built = await buildSftConversations(examples, calculatorTool, { inlineShare: cfg.inlineShare, inlineOps: cfg.inlineOps, seed: cfg.seed });
    const tools = cfg.toolsInPrompt ? [toolSchema(calculatorTool)] : undefined;
    const encoded = built.conversations.map((c) => tokenizer.encodeChat(c, { tools })).filter((e) => e.ids.length <= cfg.maxLength);
    const tooLong = built.conversations.length - encoded.length;
    log(`sft data: ${examples.length} examples → ${encoded.length} conversations (${built.dropped.length} dropped for wrong annotations, ${tooLong} longer than --max_length ${cfg.maxLength})` +
      (built.inlined > 0 ? `; ${built.inlined} of ${built.inlined + countCalls(built.conversations)} calculator steps written inline` : ""));
    if (encoded.length === 0) throw new UsageError(`no training conversations left (check --max_length ${cfg.maxLength} and --dataset ${cfg.dataset})`);

    const perStep = cfg.batchSize * cfg.gradientAccumulationSteps;
    const stepsPerEpoch = Math.ceil(encoded.length / perStep);
    const totalSteps = stepsPerEpoch * cfg.numEpochs;
    const start = ckpt?.state.global_step ?? 0;
    // A run killed after its last step (while writing final/, evaluating or reporting) is finished here.
    if (start > totalSteps || (start === totalSteps && (await runFinished(cfg.outputDir))))
      throw new UsageError(`--resume: ${cfg.outputDir} already ran ${start} of ${totalSteps} steps; start a new --output_dir to train further`);
    const schedule = { type: cfg.lrScheduler, lr: cfg.learningRate, warmupSteps: Math.floor(cfg.warmupRatio * totalSteps), totalSteps };
    const metrics = new MetricsLogger(path.join(cfg.outputDir, "metrics.jsonl"), { resumeStep: start });
    const saves = new CheckpointSchedule(cfg.saveSteps, totalSteps);
    const padId = tokenizer.padTokenId;
    const rng = new Rng(cfg.seed);
    const progress = createProgress(totalSteps, "sft", { keyMetric: "loss", start });
    let step = start;
    let lastLoss = NaN;
    let savedStep = ckpt ? start : -1;
    const saveAt = async (s: number) => {
      await saveCheckpoint(cfg.outputDir, {
        saveModel: (dir) => savePolicy(policy, dir, cfg.full),
        state: {
          global_step: s, epoch: s / stepsPerEpoch, rng_state: { data: rng.getState() }, data_position: (s % stepsPerEpoch) * perStep,
          config_hash: configHash(identity(cfg)), config: identity(cfg), log_history: [], extra: { base: policy.base },
        },
        optimizerState: await exportOptimizer(optimizer),
        saveTotalLimit: 2,
      });
      savedStep = s;
    };
    // Ctrl-C / SIGTERM: stop before the next step and save there (see shutdown.ts).
    const stop = watchInterrupts();
    const stopHere = async (s: number) => {
      if (s !== savedStep) await saveAt(s);
      return new Interrupted(`saved checkpoint-${s} in ${cfg.outputDir}; continue with --resume`);
    };
    try {
      for (let epoch = 0; epoch < cfg.numEpochs; epoch++) {
        // Every epoch's order is drawn, also those a resumed run skips, so the stream matches.
        const order = rng.shuffle(encoded.map((_, i) => i));
        for (let s = 0; s < stepsPerEpoch; s++) {
          if (epoch * stepsPerEpoch + s < start) continue;
          if (await stop.poll()) throw await stopHere(step);
          const tStep = Date.now();
          const rows = order.slice(s * perStep, (s + 1) * perStep);
          const micro: SftBatch[] = [];
          for (let i = 0; i < rows.length; i += cfg.batchSize) {
            const part = rows.slice(i, i + cfg.batchSize).map((r) => encoded[r]);
            micro.push(rightPad(part.map((e) => e.ids), part.map((e) => e.assistantMask), padId));
          }
          const lr = lrAt(step, schedule);
          const r = await sftStep(model, optimizer, micro, { lr, maxGradNorm: cfg.maxGradNorm });
          step++;
          lastLoss = r.loss;
          const seconds = (Date.now() - tStep) / 1000;
          const tokensSeen = micro.reduce((a, b) => a + b.ids.length * b.ids[0].length, 0);
          const m = { loss: r.loss, lr, grad_norm: r.gradNorm, tokens: r.tokens, tokens_per_s: tokensSeen / seconds, epoch: step / stepsPerEpoch, step_time: seconds, ...memoryFields() };
          metrics.log(step, m);
          progress.update(step, m);
          if (!cfg.quiet && (step % 10 === 0 || step === totalSteps)) progress.log(formatStepLine(step, totalSteps, m, SFT_LINE));
          if (saves.due(step) && step < totalSteps) await saveAt(step);
        }
      }
      if (await stop.poll()) throw await stopHere(step);
      // The last step is checkpointed too, so a run killed while writing final/ can be finished.
      if (savedStep !== step) await saveAt(step);
    } finally {
      progress.stop();
      stop.dispose();
    }
    const finalDir = path.join(cfg.outputDir, "final");
    await savePolicy(policy, finalDir, cfg.full);
    log(`saved ${cfg.full ? "model" : "adapter"} to ${finalDir}`);

    const evalResult = await finalEvaluation(model, tokenizer, heldOut, {
      maxNewTokens: cfg.evalMaxNewTokens, maxTurns: cfg.maxTurns, toolsInPrompt: cfg.toolsInPrompt, seed: cfg.seed, tools: toolSet.tools, outputDir: cfg.outputDir, metrics, step, log,
    });
    await writeReport(cfg.outputDir, { title: `SFT ${path.basename(policy.base)}` });
    return { steps: step, finalLoss: lastLoss, finalDir, eval: evalResult, seconds: (Date.now() - t0) / 1000 };
  } catch (err) {
    if (!ckpt) await discardFailedRun(cfg.outputDir); // failed before its first step: leave nothing behind
    throw err;
  } finally {
    await toolSet.close();
    optimizer.dispose();
    model.dispose();
    releaseOutputDir(cfg.outputDir);
  }
}

function countCalls(conversations: ChatMessage[][]): number {
  return conversations.reduce((n, c) => n + c.reduce((k, m) => k + (m.tool_calls?.length ?? 0), 0), 0);
}
