/** The evaluation run behind scripts/eval.ts: flags → a validated config (nothing written yet) → each
 *  model opened, evaluated on the same held-out questions (or the episodes of an --env environment)
 *  and disposed in turn → eval.json, samples-<name>.jsonl, report.html and a comparison table with
 *  paired improvements. `--preset tiny` compares the tiny base, its SFT output and its GRPO adapter,
 *  each quantized the way it runs in training; with `--model_path` it evaluates that model on the
 *  preset's questions instead. Leaves out: the accuracy math (evaluate.ts, stats.ts) and model loading
 *  (policy.ts), the table and report.html (report/eval-table.ts, report/eval-report.ts). */
import * as path from "node:path";
import { discardFailedRun, prepareOutputDir, releaseOutputDir, writeRunConfig } from "./output-dir.ts";
import { UsageError } from "../util/errors.ts";
import type { Tool } from "../agents/types.ts";
import { noTools, openRunTools } from "../agents/toolset.ts";
import { checkToolsFit } from "../agents/prompts.ts";
import type { SyntheticOptions } from "../datasets/synthetic.ts";
import type { Task } from "../datasets/tasks.ts";
import { checkTaskRange, defaultTaskRanges, environmentTasks, expandRanges } from "../envs/episodes.ts";
import type { EnvironmentFactory } from "../envs/types.ts";
import type { Quantize } from "../model/types.ts";
import { TINY_BASE_DIR, TINY_OUTPUT_DIR, TINY_PROBLEMS } from "../presets/tiny.ts";
import { writeEvalRunReport } from "../report/eval-report.ts";
import { formatEvalTable, formatImprovement, pairedImprovement } from "../report/eval-table.ts";
import { createProgress } from "../trainer/progress.ts";
import type { Interval } from "../trainer/stats.ts";
import { writeFileAtomic, exists } from "../util/fs.ts";
import { checkDataset, loadExamples, type Purpose } from "./data.ts";
import { EVAL_FLAGS, evalCommand, TINY_EVAL_PRESET, type EvalFlags } from "./eval-flags.ts";
import { evaluate, formatEvalLine, type EvalResult } from "./evaluate.ts";
import { defaultsOf, parseFlags, turnSettings } from "./flags.ts";
import { environmentServer, toolConfig } from "./options.ts";
import { checkModelSource, openPolicy } from "./policy.ts";
import { openGenerationEngine } from "./rollout-engine.ts";
import type { RolloutEngine } from "../rollout/engines/index.ts";

export { evalCommand, TINY_EVAL_PRESET };

export interface EvalModelSpec {
  name: string; // used in the table and in samples-<name>.jsonl
  modelPath: string;
  adapter?: string;
  quantize: Quantize;
}

/** The evaluation's configuration: the script's flags as parsed (eval-flags.ts), with what they leave
 *  open settled once: the output folder, the models (from --model_path/--adapter/--baseline or the
 *  preset) and the pairs compared. eval.json and the report hold it as it is. */
export type EvalRunConfig = EvalFlags & {
  output_dir: string;
  models: EvalModelSpec[];
  /** [model, baseline] name pairs: the paired strict-accuracy difference model − baseline. */
  compare: Array<[string, string]>;
  /** Models a preset lists that do not exist (yet): reported, not evaluated. */
  skipped: Array<{ name: string; path: string }>;
  synthetic?: Omit<SyntheticOptions, "n" | "seed">; // the preset's problems with --preset tiny
};

/** The three tiny checkpoints, in training order, each quantized the way it ran: base and SFT in f32,
 *  the GRPO adapter on the NF4 base it was trained against. The SFT model is also evaluated on that
 *  NF4 base ("sft-nf4"), so the RL gain can be read apart from the cost of quantization. */
export const TINY_EVAL_MODELS: ReadonlyArray<EvalModelSpec> = [
  { name: "base", modelPath: TINY_BASE_DIR, quantize: "none" },
  { name: "sft", modelPath: path.join(TINY_OUTPUT_DIR, "sft", "final"), quantize: "none" },
  { name: "rl", modelPath: path.join(TINY_OUTPUT_DIR, "grpo", "final"), quantize: "nf4" },
];

/** A name safe in a file name: Qwen/Qwen2.5-0.5B → Qwen2.5-0.5B. */
export function modelName(p: string): string {
  const base = path.basename(path.resolve(p)) === "final" ? path.basename(path.dirname(path.resolve(p))) : path.basename(p);
  return base.replace(/[^\w.-]+/g, "_") || "model";
}

/** argv → a validated config. Writes nothing; every usage error is thrown from here. */
export async function parseEvalArgs(argv: string[]): Promise<EvalRunConfig> {
  const { o, explicit } = parseFlags(evalCommand(), EVAL_FLAGS, argv, { tiny: TINY_EVAL_PRESET });
  return settleEvalConfig(o, explicit);
}

/** The flags with the models, comparisons and output folder settled and every value checked.
 *  `explicit(flag)`: whether the user gave it (default: it differs from the flag's default). */
export async function settleEvalConfig(
  o: EvalFlags,
  explicit: (flag: string) => boolean = (k) => o[k as keyof EvalFlags] !== defaultsOf(EVAL_FLAGS)[k as keyof EvalFlags],
): Promise<EvalRunConfig> {
  toolConfig(o); // a malformed --tools list is a usage error here
  if (o.samples_per_prompt > 1 && o.temperature === 0)
    throw new UsageError(
      `--samples_per_prompt ${o.samples_per_prompt} with --temperature 0: greedy samples are identical; use a temperature > 0 or k = 1`,
    );
  const tiny = o.preset === "tiny" && !explicit("model_path");
  const models: EvalModelSpec[] = [];
  const skipped: EvalRunConfig["skipped"] = [];
  const compare: Array<[string, string]> = [];
  if (tiny) {
    if (o.adapter || o.baseline)
      throw new UsageError(
        `--preset tiny without --model_path evaluates its own base, sft and rl checkpoints; name the model ` +
          `with --model_path to use --adapter/--baseline`,
      );
    for (const m of TINY_EVAL_MODELS) {
      if (!(await exists(m.modelPath))) skipped.push({ name: m.name, path: m.modelPath });
      else models.push({ name: m.name, modelPath: m.modelPath, quantize: explicit("quantize") ? o.quantize : m.quantize });
    }
    if (models.length === 0)
      throw new UsageError(
        `--preset tiny: none of ${TINY_EVAL_MODELS.map((m) => m.modelPath).join(", ")} exists; run ` +
          `make-tiny-base, train-sft or train-gsm8k-agent first`,
      );
    for (let i = 1; i < models.length; i++) compare.push([models[i].name, models[i - 1].name]);
    const sft = models.find((m) => m.name === "sft"),
      rl = models.find((m) => m.name === "rl");
    if (sft && rl && rl.quantize !== sft.quantize) {
      models.splice(models.indexOf(rl), 0, { name: `sft-${rl.quantize}`, modelPath: sft.modelPath, quantize: rl.quantize });
      compare.push(["rl", `sft-${rl.quantize}`]);
    }
  } else {
    await checkModelSource(o.model_path, "--model_path", o.adapter);
    const name = modelName(o.adapter ?? o.model_path);
    if (o.baseline) {
      await checkModelSource(o.baseline, "--baseline");
      let bname = modelName(o.baseline);
      if (bname === name) bname = `${bname}-baseline`;
      models.push({ name: bname, modelPath: o.baseline, quantize: o.quantize });
      compare.push([name, bname]);
    }
    models.push({ name, modelPath: o.model_path, adapter: o.adapter, quantize: o.quantize });
  }
  for (const [n, q] of Object.entries(o.quantize_for ?? {})) {
    const m = models.find((x) => x.name === n);
    if (!m && !skipped.some((s) => s.name === n))
      throw new UsageError(`--quantize_for ${n}=${q}: no model named ${n}; models: ${models.map((x) => x.name).join(", ")}`);
    if (m) m.quantize = q;
  }
  if (o.env && !/^https?:\/\/[^/]/.test(o.env))
    throw new UsageError(`--env ${o.env}: expected an http(s) URL of an AgentGym environment server`);
  if (!o.env) await checkDataset(o.dataset);
  return {
    ...o,
    output_dir: o.output_dir ?? (tiny ? path.join(TINY_OUTPUT_DIR, "eval") : path.join("outputs", models[models.length - 1].name, "eval")),
    models,
    compare,
    skipped,
    synthetic: o.preset === "tiny" ? TINY_PROBLEMS : undefined,
  };
}

type EvalSummaryOnly = Omit<EvalResult, "questions">;

function summaryOf(r: EvalResult): EvalSummaryOnly {
  const { questions: _q, ...rest } = r;
  return rest;
}

/** How questions are asked and answers sampled: everything of an evaluation but the models and data,
 *  under the flags' names (a grading server fixes it per scenario). The rollout engine's flags are
 *  its own (absent ones take their defaults). */
export type EvalProtocol = Pick<
  EvalFlags,
  "samples_per_prompt" | "temperature" | "batch_size" | "max_new_tokens" | "max_turns" | "tools_in_prompt" | "seed" | "backend"
> &
  Partial<Pick<EvalFlags, "tools" | "tool_timeout" | "tool_max_chars" | "threads" | "unpack_base" | "rollout_engine">> &
  Record<string, unknown>;

/** One model opened, evaluated on `examples` and disposed again, so only one is in memory at a time.
 *  `onProgress` runs after each batch; an error it throws abandons the evaluation at that point.
 *  `run.tools` are the run's open tool set (without it the protocol's tools are opened for this call);
 *  with `run.envs` the examples are that environment's tasks and no tools are offered. */
export async function evaluateModel(
  spec: EvalModelSpec,
  examples: Task[],
  p: EvalProtocol,
  onProgress?: (done: number, total: number) => void,
  run: { tools?: Tool[]; envs?: EnvironmentFactory } = {},
): Promise<EvalResult> {
  const own = run.tools || run.envs ? null : await openRunTools(toolConfig(p));
  try {
    const policy = await openPolicy({
      modelPath: spec.modelPath,
      adapter: spec.adapter,
      quantize: spec.quantize,
      seed: p.seed,
      backend: p.backend,
      threads: p.threads,
      unpackBase: p.unpack_base,
    });
    const tools = run.tools ?? own?.tools ?? [];
    let engine: RolloutEngine | null = null;
    try {
      engine = await openGenerationEngine(policy, { ...p, rollout_engine: p.rollout_engine ?? "auto" }, { tools });
      checkToolsFit(policy.tokenizer, policy.model.config.maxPositionEmbeddings, tools, p.max_new_tokens, p.tools_in_prompt);
      return await evaluate(policy.model, policy.tokenizer, examples, {
        generate: engine.generate.bind(engine),
        samplesPerPrompt: p.samples_per_prompt,
        temperature: p.temperature,
        batchSize: p.batch_size,
        ...turnSettings(p),
        seed: p.seed,
        tools,
        envs: run.envs,
        onProgress,
      });
    } finally {
      await engine?.close();
      policy.model.dispose();
    }
  } finally {
    await own?.close();
  }
}

/** samples-<name>.jsonl: one line per question with its gold answer and every sample, judged. */
export function samplesJsonl(result: EvalResult): string {
  const lines = result.questions.map((q) =>
    JSON.stringify({
      id: q.id,
      question: q.question,
      gold: q.gold,
      samples: q.samples.map((s) => ({
        text: s.text,
        finalText: s.finalText,
        strict: s.strict,
        lenient: s.lenient,
        formatValid: s.formatValid,
        toolCalls: s.toolCalls,
        toolErrors: s.toolErrors,
        parseErrors: s.parseErrors,
        truncated: s.truncated,
        turns: s.turns,
        ...(s.envReward !== undefined ? { envReward: s.envReward } : {}),
        ...(s.envError ? { envError: s.envError } : {}),
      })),
    }),
  );
  return lines.join("\n") + "\n";
}

export interface EvalRunOutput {
  results: Array<{ spec: EvalModelSpec; result: EvalResult }>;
  improvements: Array<{ model: string; baseline: string } & Interval & { n: number }>;
}

export interface EvalRunIo {
  out: (line: string) => void; // results (stdout)
  progress?: boolean; // show a progress bar on stderr (default true)
}

export async function runEval(
  options: EvalRunConfig,
  io: EvalRunIo = { out: (l) => process.stdout.write(l + "\n") },
): Promise<EvalRunOutput> {
  const log = (line: string) => process.stderr.write(line + "\n");
  // Environment and tool servers are checked before the output folder is touched: one that does not
  // answer, or refuses its family's requests (one real reset), is a usage error.
  const envs = (await environmentServer(options)) ?? undefined;
  // With --env, the tasks as run.json records them: by default held out from GRPO's default training
  // tasks, inside the server's size where its family has one.
  const cfg: EvalRunConfig = envs
    ? { ...options, env_tasks: options.env_tasks ?? defaultTaskRanges(envs.family, options.max_samples ?? 100).evaluate }
    : options;
  if (envs) checkTaskRange(envs.family, "--env_tasks", cfg.env_tasks!);
  const purpose: Purpose = cfg.split === "test" ? "eval" : "rl";
  const examples: Task[] = envs
    ? environmentTasks(expandRanges(cfg.env_tasks!))
    : await loadExamples({ dataset: cfg.dataset, purpose, maxSamples: cfg.max_samples, synthetic: cfg.synthetic });
  if (examples.length === 0) throw new UsageError(`--dataset ${cfg.dataset} --split ${cfg.split}: no questions to evaluate`);
  const toolSet = envs ? noTools() : await openRunTools(toolConfig(cfg), log);
  try {
    return await evaluateModels(cfg, io, examples, { tools: toolSet.tools, envs });
  } finally {
    await toolSet.close();
  }
}

async function evaluateModels(
  cfg: EvalRunConfig,
  io: EvalRunIo,
  examples: Task[],
  run: { tools: Tool[]; envs?: EnvironmentFactory },
): Promise<EvalRunOutput> {
  await prepareOutputDir(cfg.output_dir, { overwrite: cfg.overwrite, runKind: "eval", resumable: false });
  // An evaluation cannot be continued: if it fails, what it wrote goes, so the command can be rerun.
  try {
    await writeRunConfig(cfg.output_dir, cfg, "eval");
    for (const s of cfg.skipped) io.out(`note: ${s.name} skipped: ${s.path} does not exist`);

    const results: EvalRunOutput["results"] = [];
    const what = run.envs ? `${examples.length} episodes of ${cfg.env}` : `${examples.length} questions`;
    for (const spec of cfg.models) {
      io.out(
        `${spec.name}: ${spec.modelPath}${spec.adapter ? ` + adapter ${spec.adapter}` : ""}, quantize ` +
          `${spec.quantize}, ${what} × ${cfg.samples_per_prompt}`,
      );
      const bar = io.progress === false ? null : createProgress(examples.length, `eval ${spec.name}`);
      let result: EvalResult;
      try {
        result = await evaluateModel(spec, examples, cfg, (done) => bar?.update(done), run);
      } finally {
        bar?.stop();
      }
      io.out(`${spec.name}: ${formatEvalLine(result)}`);
      // Scores over episodes the environment refused would read as a model's zero: not a result.
      if (result.envErrorRate === 1) {
        const first = result.questions.flatMap((q) => q.samples).find((s) => s.envError)?.envError;
        throw new Error(
          `environment ${cfg.env}: all ${result.strict.total} episodes failed on the environment, none was played (first: ${first})`,
        );
      }
      await writeFileAtomic(path.join(cfg.output_dir, `samples-${spec.name}.jsonl`), samplesJsonl(result));
      results.push({ spec, result });
    }

    const byName = new Map(results.map((r) => [r.spec.name, r.result]));
    const improvements = cfg.compare.map(([m, b]) => ({ model: m, baseline: b, ...pairedImprovement(byName.get(m)!, byName.get(b)!) }));
    io.out("");
    io.out(formatEvalTable(results.map((r) => ({ name: r.spec.name, result: r.result }))));
    for (const d of improvements) io.out(formatImprovement(d.model, d.baseline, d));

    const models = results.map(({ spec, result }) => ({ ...spec, ...summaryOf(result) }));
    await writeFileAtomic(path.join(cfg.output_dir, "eval.json"), JSON.stringify({ config: cfg, models, improvements }, null, 2) + "\n");
    await writeEvalRunReport(
      cfg,
      results.map(({ spec, result }) => ({ spec, summary: summaryOf(result), questions: result.questions })),
      improvements,
    );
    return { results, improvements };
  } catch (err) {
    await discardFailedRun(cfg.output_dir);
    throw err;
  } finally {
    releaseOutputDir(cfg.output_dir);
  }
}
