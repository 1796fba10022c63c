/** SFT warmup: GSM8K (or synthetic) solutions become tool-calling conversations (datasets/sft.ts),
 *  rendered with the chat template; next-token cross-entropy on the assistant's tokens only, AdamW
 *  with clipping and gradient accumulation, a learning-rate schedule; LoRA on a (quantized) frozen
 *  base, or every weight with `full`. Ends with the trained part in <output_dir>/final (PEFT adapter
 *  or HF folder, plus tokenizer files), metrics.jsonl, report.html and a held-out evaluation. */
import * as path from "node:path";
import { calculatorTool } from "../agents/calculator.ts";
import { toolSchema } from "../agents/types.ts";
import { buildSftConversations } from "../datasets/sft.ts";
import type { SyntheticOptions } from "../datasets/synthetic.ts";
import type { ChatMessage, LoraConfig, LoraTarget, Quantize } from "../model/types.ts";
import { onInterrupt, writeRunConfig } from "../cli.ts";
import { rightPad } from "../trainer/batch.ts";
import { saveCheckpoint, CheckpointSchedule, configHash } from "../trainer/checkpoint.ts";
import { formatStepLine, memoryFields, MetricsLogger, SFT_LINE } from "../trainer/metrics.ts";
import { AdamW } from "../trainer/optimizer.ts";
import { createProgress } from "../trainer/progress.ts";
import { writeReport } from "../trainer/report.ts";
import { lrAt, type ScheduleType } from "../trainer/schedule.ts";
import { sftStep, type SftBatch } from "../trainer/sft.ts";
import { Rng } from "../util/rng.ts";
import { loadExamples } from "./data.ts";
import { finalEvaluation, type EvalResult } from "./evaluate.ts";
import { checkModelSource, openPolicy, savePolicy, withOutputDir } from "./policy.ts";
import { exportOptimizer } from "./train-state.ts";

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
  unpackBase?: boolean; // for the final evaluation's generation (default true)
  overwrite: boolean;
  quiet?: boolean;
}

export interface SftRunResult {
  steps: number;
  finalLoss: number;
  finalDir: string;
  eval: EvalResult | null;
  seconds: number;
}

export async function runSft(cfg: SftRunConfig): Promise<SftRunResult> {
  const t0 = Date.now();
  const log = (line: string) => (cfg.quiet ? undefined : process.stderr.write(line + "\n"));
  // Everything the user named is checked before the run folder is touched.
  await checkModelSource(cfg.modelPath, "--model_path");
  const lora: LoraConfig | undefined = cfg.full ? undefined : { r: cfg.loraR, alpha: cfg.loraAlpha, dropout: cfg.loraDropout, targetModules: cfg.loraTargets };
  const examples = await loadExamples({ dataset: cfg.dataset, purpose: "sft", maxSamples: cfg.maxSamples, synthetic: cfg.synthetic });
  const heldOut = cfg.evalSamples > 0 ? await loadExamples({ dataset: cfg.dataset, purpose: "eval", maxSamples: cfg.evalSamples, synthetic: cfg.synthetic }) : [];
  const policy = await withOutputDir(cfg.outputDir, { overwrite: cfg.overwrite, runKind: "sft" }, () =>
    openPolicy({ modelPath: cfg.modelPath, quantize: cfg.quantize, lora, trainable: cfg.full ? "full" : "lora", seed: cfg.seed, backend: cfg.backend, unpackBase: cfg.unpackBase }),
  );
  const { model, tokenizer } = policy;
  const optimizer = new AdamW(model.trainableVariables(), { lr: cfg.learningRate, weightDecay: cfg.weightDecay });
  try {
    await writeRunConfig(cfg.outputDir, { ...cfg, base: policy.base }, "sft");
    // Conversations: every calculator call re-run, so tool messages show what rollouts will show.
    const built = await buildSftConversations(examples, calculatorTool, { inlineShare: cfg.inlineShare, inlineOps: cfg.inlineOps, seed: cfg.seed });
    const tools = cfg.toolsInPrompt ? [toolSchema(calculatorTool)] : undefined;
    const encoded = built.conversations.map((c) => tokenizer.encodeChat(c, { tools })).filter((e) => e.ids.length <= cfg.maxLength);
    const tooLong = built.conversations.length - encoded.length;
    log(`sft data: ${examples.length} examples → ${encoded.length} conversations (${built.dropped.length} dropped for wrong annotations, ${tooLong} longer than --max_length ${cfg.maxLength})` +
      (built.inlined > 0 ? `; ${built.inlined} of ${built.inlined + countCalls(built.conversations)} calculator steps written inline` : ""));
    if (encoded.length === 0) throw new Error(`no training conversations left (check --max_length ${cfg.maxLength} and --dataset ${cfg.dataset})`);

    const perStep = cfg.batchSize * cfg.gradientAccumulationSteps;
    const stepsPerEpoch = Math.ceil(encoded.length / perStep);
    const totalSteps = stepsPerEpoch * cfg.numEpochs;
    const schedule = { type: cfg.lrScheduler, lr: cfg.learningRate, warmupSteps: Math.floor(cfg.warmupRatio * totalSteps), totalSteps };
    const metrics = new MetricsLogger(path.join(cfg.outputDir, "metrics.jsonl"));
    const saves = new CheckpointSchedule(cfg.saveSteps, totalSteps);
    const padId = tokenizer.padTokenId;
    const rng = new Rng(cfg.seed);
    const progress = createProgress(totalSteps, "sft", { keyMetric: "loss" });
    let step = 0;
    let lastLoss = NaN;
    const saveAt = async (s: number) =>
      saveCheckpoint(cfg.outputDir, {
        saveModel: (dir) => savePolicy(policy, dir, cfg.full),
        state: { global_step: s, epoch: s / stepsPerEpoch, rng_state: { data: rng.getState() }, data_position: (s % stepsPerEpoch) * perStep, config_hash: configHash(cfg), log_history: [] },
        optimizerState: await exportOptimizer(optimizer),
        saveTotalLimit: 2,
      });
    const stopInterrupt = onInterrupt(async () => {
      log(`interrupted: saving checkpoint-${step}`);
      await saveAt(step);
    });
    try {
      for (let epoch = 0; epoch < cfg.numEpochs; epoch++) {
        const order = rng.shuffle(encoded.map((_, i) => i));
        for (let s = 0; s < stepsPerEpoch; s++) {
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
    } finally {
      progress.stop();
      stopInterrupt();
    }
    const finalDir = path.join(cfg.outputDir, "final");
    await savePolicy(policy, finalDir, cfg.full);
    log(`saved ${cfg.full ? "model" : "adapter"} to ${finalDir}`);

    const evalResult = await finalEvaluation(model, tokenizer, heldOut, {
      maxNewTokens: cfg.evalMaxNewTokens, maxTurns: cfg.maxTurns, toolsInPrompt: cfg.toolsInPrompt, seed: cfg.seed, outputDir: cfg.outputDir, metrics, step, log,
    });
    await writeReport(cfg.outputDir, { title: `SFT ${path.basename(policy.base)}` });
    return { steps: step, finalLoss: lastLoss, finalDir, eval: evalResult, seconds: (Date.now() - t0) / 1000 };
  } finally {
    optimizer.dispose();
    model.dispose();
  }
}

function countCalls(conversations: ChatMessage[][]): number {
  return conversations.reduce((n, c) => n + c.reduce((k, m) => k + (m.tool_calls?.length ?? 0), 0), 0);
}
