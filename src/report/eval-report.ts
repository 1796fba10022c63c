/** report.html of an evaluation folder: written when an evaluation ends (run/eval-run.ts) and again
 *  from the folder's eval.json and samples-<model>.jsonl (rewriteEvalReport, scripts/report.ts). */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { UsageError } from "../util/errors.ts";
import type { ModelQuestions } from "./eval-questions.ts";
import { f3, formatImprovement, type EvalFigures, type Improvement } from "./eval-table.ts";
import { writeEvalReport, type EvalRow } from "./report.ts";

/** A model as an evaluation names it (run/eval-run.ts EvalModelSpec). */
export interface EvaluatedModel {
  name: string;
  modelPath: string;
  adapter?: string;
  quantize: string;
}

/** What the report reads of an evaluation's config (run/eval-run.ts EvalRunConfig); the page shows all of it. */
export interface EvalReportConfig {
  dataset: string;
  split: string;
  env?: string;
  models: EvaluatedModel[];
  compare: Array<[string, string]>;
  output_dir: string;
}

/** report.html of an evaluation: the accuracy table and chart, and every model's transcripts per
 *  question with a filter for each compared pair. */
export async function writeEvalRunReport(
  cfg: EvalReportConfig,
  results: Array<{ spec: EvaluatedModel; summary: EvalFigures; questions: ModelQuestions["questions"] }>,
  improvements: Improvement[],
): Promise<string> {
  const rows: EvalRow[] = results.map(({ spec, summary: r }) => ({
    name: spec.name,
    n: r.strict.total,
    correct: r.strict.correct,
    interval: r.strict,
    passAtK: { [r.k]: r.passAtK },
    extra: {
      lenient: Number(f3(r.lenient.value)),
      format: Number(f3(r.formatValid)),
      "tools/rollout": Number(r.toolCallsPerRollout.toFixed(2)),
      ...(r.envReward !== undefined ? { "env reward": Number(f3(r.envReward)), "env errors": Number(f3(r.envErrorRate ?? 0)) } : {}),
      quantize: spec.quantize,
    },
  }));
  return writeEvalReport(path.join(cfg.output_dir, "report.html"), {
    title: cfg.env ? `Evaluation on the environment ${cfg.env}` : `Evaluation on ${cfg.dataset} (${cfg.split})`,
    rows,
    questions: results.map(({ spec, questions }) => ({ name: spec.name, questions })),
    compare: cfg.compare,
    config: {
      ...cfg,
      models: cfg.models.map((m) => `${m.name}: ${m.modelPath}${m.adapter ? " + " + m.adapter : ""} (${m.quantize})`).join("; "),
      compare: improvements.map((d) => formatImprovement(d.model, d.baseline, d)).join("; "),
    } as unknown as Record<string, unknown>,
  });
}

/** Write report.html again from an evaluation folder's eval.json and samples-<model>.jsonl. */
export async function rewriteEvalReport(dir: string): Promise<string> {
  const file = path.join(dir, "eval.json");
  const text = await fs.readFile(file, "utf8").catch(() => {
    throw new UsageError(`${file} not found: expected a folder written by scripts/eval.ts`);
  });
  const saved = JSON.parse(text) as {
    config: EvalReportConfig;
    models: Array<EvaluatedModel & EvalFigures>;
    improvements: Improvement[];
  };
  const results = [];
  for (const m of saved.models) {
    const lines = (await fs.readFile(path.join(dir, `samples-${m.name}.jsonl`), "utf8").catch(() => ""))
      .split("\n")
      .filter((l) => l.trim());
    results.push({ spec: m, summary: m, questions: lines.map((l) => JSON.parse(l) as ModelQuestions["questions"][number]) });
  }
  return writeEvalRunReport({ ...saved.config, output_dir: dir }, results, saved.improvements);
}
