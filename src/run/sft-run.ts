/** SFT warmup: GSM8K (or synthetic) solutions become tool-calling conversations (agents/sft.ts),
 *  rendered with the chat template; next-token cross-entropy on the assistant's tokens only, AdamW
 *  with clipping and gradient accumulation, a learning-rate schedule; LoRA on a (quantized) frozen
 *  base, or every weight with `full`. Ends with the trained part in <output_dir>/final (PEFT adapter
 *  or HF folder, plus tokenizer files), metrics.jsonl, report.html and a held-out evaluation.
 *  Checkpoints (--save_steps, and always the last step) let --resume continue or finish a run. */
import * as path from "node:path";
import { calculatorTool } from "../agents/calculator.ts";
import { openTools, type ToolSet } from "../agents/toolset.ts";
import { encodeSftConversations } from "../agents/sft.ts";
import type { SyntheticOptions } from "../datasets/synthetic.ts";
import type { ChatMessage } from "../model/types.ts";
import { TINY_PROBLEMS } from "../presets/tiny.ts";
import { UsageError } from "../util/errors.ts";
import { collectGarbage } from "../util/gc.ts";
import { formatStepLine, memoryFields, readMetrics, SFT_LINE } from "../trainer/metrics.ts";
import { writeReport } from "../report/report.ts";
import { sftMicroBatches, sftStep } from "../trainer/sft.ts";
import { Rng } from "../util/rng.ts";
import { loadTrainingData } from "./data.ts";
import { finalEvaluation } from "./evaluate.ts";
import { checkModelSource } from "./policy.ts";
import { turnSettings } from "./flags.ts";
import { defaultOutputDir } from "./options.ts";
import { SFT_FLAGS, type SftFlags } from "./sft-flags.ts";
import { TrainingRun, type TrainingRunResult } from "./training-run.ts";

/** The run's configuration: the script's flags as parsed (sft-flags.ts), plus what only a program
 *  passes. run.json holds it; a resumed run must match its `runIdentity`. */
export type SftRunConfig = SftFlags & {
  synthetic?: Omit<SyntheticOptions, "n" | "seed">; // default: the tiny preset's problems with --preset tiny
  quiet?: boolean;
};

export type SftRunResult = TrainingRunResult & { finalLoss: number };

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
  const dir = cfg.output_dir;
  const run = await TrainingRun.begin("sft", SFT_FLAGS, cfg, log);
  // Held-out questions never include a training row; the split is logged and kept in run.json.
  const data = { dataset: cfg.dataset, purpose: "sft" as const, maxSamples: cfg.max_samples, synthetic: cfg.synthetic };
  const { train: examples, heldOut, split } = await loadTrainingData(data, cfg.eval_samples);
  log(`data: ${split}`);
  let opened: ToolSet | undefined; // closed on the way out
  return run.lifetime({ full: cfg.full, close: () => opened?.close() }, async (policy, optimizer) => {
    const { model, tokenizer } = policy;
    // SFT demonstrations are GSM8K's calculator annotations, so SFT knows one tool; the set stops its worker.
    const toolSet = await openTools(["calculator"]);
    opened = toolSet;
    await run.record({ ...cfg, base: policy.base, dataSplit: split });
    // Conversations: every calculator call re-run, so tool messages show what rollouts will show.
    const { built, encoded } = await encodeSftConversations(examples, calculatorTool, tokenizer, {
      inlineShare: cfg.inline_share,
      inlineOps: cfg.inline_ops,
      seed: cfg.seed,
      toolsInPrompt: cfg.tools_in_prompt,
      maxLength: cfg.max_length,
    });
    const tooLong = built.conversations.length - encoded.length;
    log(
      `sft data: ${examples.length} examples → ${encoded.length} conversations (${built.dropped.length} dropped for wrong ` +
        `annotations, ${tooLong} longer than --max_length ${cfg.max_length})` +
        (built.inlined > 0
          ? `; ${built.inlined} of ${built.inlined + countCalls(built.conversations)} calculator steps written inline`
          : ""),
    );
    if (encoded.length === 0)
      throw new UsageError(`no training conversations left (check --max_length ${cfg.max_length} and --dataset ${cfg.dataset})`);

    const perStep = cfg.batch_size * cfg.gradient_accumulation_steps;
    const stepsPerEpoch = Math.ceil(encoded.length / perStep);
    const totalSteps = stepsPerEpoch * cfg.num_epochs;
    const start = run.start;
    if (await run.nothingLeft(totalSteps, heldOut.length > 0))
      throw new UsageError(`--resume: ${dir} already ran ${start} of ${totalSteps} steps; start a new --output_dir to train further`);
    const padId = tokenizer.padTokenId;
    const rng = new Rng(cfg.seed);
    let step = start;
    let lastLoss = await lastLoggedLoss(path.join(dir, "metrics.jsonl"), start); // a resumed run that has no step left
    // A stop leaves the report to the finished run (or to --resume).
    const report = () => writeReport(dir, { title: `SFT ${path.basename(policy.base)}` });
    const loop = run.loop({
      total: totalSteps,
      position: (s) => ({ epoch: s / stepsPerEpoch, data_position: (s % stepsPerEpoch) * perStep }),
      saveTotalLimit: 2,
      keyMetric: "loss",
      report,
      reportOnStop: false,
    });
    const { metrics, progress } = loop;
    await loop.steps(async () => {
      for (let epoch = 0; epoch < cfg.num_epochs; epoch++) {
        // Every epoch's order is drawn, also those a resumed run skips, so the stream matches.
        const order = rng.shuffle(encoded.map((_, i) => i));
        for (let s = 0; s < stepsPerEpoch; s++) {
          if (epoch * stepsPerEpoch + s < start) continue;
          await loop.safePoint(step);
          const tStep = Date.now();
          const rows = order.slice(s * perStep, (s + 1) * perStep);
          const micro = sftMicroBatches(rows, encoded, cfg.batch_size, padId);
          const lr = loop.lr(step);
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
          await loop.saveIfDue(step);
        }
      }
    });
    const { finalDir, eval: evalResult } = await loop.finish((signal) =>
      finalEvaluation(model, tokenizer, heldOut, {
        ...turnSettings({ ...cfg, max_new_tokens: cfg.eval_max_new_tokens }),
        seed: cfg.seed,
        tools: toolSet.tools,
        outputDir: dir,
        metrics,
        step,
        log,
        signal,
      }),
    );
    return { steps: step, finalLoss: lastLoss, finalDir, eval: evalResult, seconds: (Date.now() - t0) / 1000 };
  });
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
