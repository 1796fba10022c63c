/** Self-contained HTML reports, assembled here from the pieces in report/: `report.html` of a
 *  training run (metric curves with the reward first and flat metrics as one line each, final values,
 *  the rollout browser when the run logged trajectories, held-out transcripts from the closing
 *  evaluation, the run config) and the evaluation report (accuracies with 95% intervals, pass@k, and
 *  every model's transcript per question with filters). No scripts, fonts or external assets, so the
 *  file opens anywhere and can be attached as is. Every string from a run (config values, names, and
 *  any model- or tool-written text) is HTML-escaped. */
import * as path from "node:path";
import { promises as fs } from "node:fs";
import { writeFileAtomic, exists } from "../util/fs.ts";
import { readMetrics, type MetricsRecord } from "../trainer/metrics.ts";
import { formatDuration } from "../trainer/progress.ts";
import { wilsonInterval, type Interval } from "../trainer/stats.ts";
import { chartedKeys, chartsSection } from "./charts.ts";
import { renderQuestionBrowser, type ModelQuestions, type QuestionLimits, type QuestionSample } from "./eval-questions.ts";
import { cell, escapeHtml, keyValueTable, page } from "./html.ts";
import { readRolloutSample, renderRolloutBrowser, type RolloutLimits, type RolloutSample } from "./rollouts.ts";
import { renderTurns, renderPlain, TRANSCRIPT_LEGEND } from "./transcript.ts";

export { chartedKeys, lineChartSvg, niceTicks, type Series } from "./charts.ts";
export { escapeHtml } from "./html.ts";

export interface TrainReportInput {
  title: string;
  records: MetricsRecord[];
  config?: unknown;
  /** More rows for the summary table (for example final eval accuracy). */
  extra?: Record<string, unknown>;
  /** GRPO: the rollout browser's sample of trajectories.jsonl. */
  rollouts?: RolloutSample;
  /** The closing evaluation's questions (eval.json `samples`): a few are shown at the end. */
  heldOut?: HeldOutQuestion[];
}

export interface HeldOutQuestion {
  id: string;
  question: string;
  gold: string;
  samples: QuestionSample[];
}

/** Records sorted by step, the last one kept when a step was logged twice (a run resumed from an
 *  earlier checkpoint without dropping the later lines). */
function byStep(records: MetricsRecord[]): MetricsRecord[] {
  const last = new Map<number, MetricsRecord>();
  for (const r of records) last.set(r.step, { ...last.get(r.step), ...r });
  return [...last.values()].sort((a, b) => a.step - b.step);
}

const num = (v: unknown) => (typeof v === "number" && Number.isFinite(v) ? v : null);

/** A few held-out transcripts: the first `perKind` right and the first `perKind` wrong answers. */
function heldOutSection(questions: HeldOutQuestion[], perKind = 3): string {
  const right = questions.filter((q) => q.samples[0]?.strict).slice(0, perKind);
  const wrong = questions.filter((q) => q.samples[0] && !q.samples[0].strict).slice(0, perKind);
  const card = (q: HeldOutQuestion) => {
    const s = q.samples[0];
    const tags =
      (s.strict ? `<span class="tag ok">right</span>` : `<span class="tag bad">wrong</span>`) +
      (s.formatValid ? "" : `<span class="tag warn">format failure</span>`);
    const body = Array.isArray(s.turns)
      ? renderTurns(s.turns, { maxChars: 2000, source: "eval.json" })
      : renderPlain(String(s.text ?? ""), { maxChars: 2000, source: "eval.json" });
    return (
      `<div class="ro"><div class="meta">${tags}<code>${escapeHtml(q.id)}</code> · gold <b>${escapeHtml(q.gold)}</b></div>` +
      `<div class="q">${escapeHtml(q.question)}</div>${body}</div>`
    );
  };
  const shown = [...right, ...wrong];
  if (shown.length === 0) return "";
  return (
    `<h2 id="held-out">Held-out transcripts</h2><p class="sub">From the closing greedy evaluation: the first ${right.length} right ` +
    `and the first ${wrong.length} wrong of the ${questions.length} questions in eval.json.</p>` +
    `${TRANSCRIPT_LEGEND}<div class="rollouts">${shown.map(card).join("")}</div>\n`
  );
}

export function renderTrainReport(input: TrainReportInput): string {
  const records = byStep(input.records);
  const finals: string[] = [];
  for (const k of chartedKeys(records)) {
    const vals = records.map((r) => num(r[k])).filter((v): v is number => v !== null);
    const lastRec = [...records].reverse().find((r) => num(r[k]) !== null)!;
    finals.push(
      `<tr><th>${escapeHtml(k)}</th>${cell(vals[vals.length - 1])}<td class="n">${lastRec.step}</td>` +
        `${cell(Math.min(...vals))}${cell(Math.max(...vals))}</tr>`,
    );
  }
  const first = records[0],
    last = records[records.length - 1];
  const span = records.length ? `${records.length} logged steps, step ${first.step} to ${last.step}` : "no metrics logged yet";
  const minutes = records.length > 1 ? `, ${formatDuration(last.time - first.time)} wall time` : "";
  let body = chartsSection(records);
  if (input.extra && Object.keys(input.extra).length) body += `<h2>Summary</h2>${keyValueTable(input.extra)}\n`;
  if (input.rollouts) body += renderRolloutBrowser(input.rollouts);
  if (input.heldOut?.length) body += heldOutSection(input.heldOut);
  body += `<h2>Final values</h2><table><tr><th>metric</th><th>last</th><th>at step</th><th>min</th><th>max</th></tr>`;
  body += `${finals.join("")}</table>\n`;
  if (input.config !== undefined) {
    const cfg =
      typeof input.config === "object" && input.config !== null ? (input.config as Record<string, unknown>) : { config: input.config };
    body += `<h2>Run config</h2>${keyValueTable(cfg)}\n`;
  }
  return page(input.title, span + minutes, body);
}

/** Write `runDir/report.html` from the run's metrics.jsonl (and, when present, run.json's config,
 *  trajectories.jsonl's rollouts and eval.json's held-out samples). */
export async function writeReport(
  runDir: string,
  opts: { title: string; metricsFile?: string; config?: unknown; extra?: Record<string, unknown>; rollouts?: Partial<RolloutLimits> },
): Promise<string> {
  const records = await readMetrics(opts.metricsFile ?? path.join(runDir, "metrics.jsonl"));
  let config = opts.config;
  if (config === undefined) {
    const text = await fs.readFile(path.join(runDir, "run.json"), "utf8").catch(() => undefined);
    if (text !== undefined) {
      try {
        const run = JSON.parse(text) as { config?: unknown };
        config = run.config ?? run;
      } catch {
        config = { "run.json": "not valid JSON" };
      }
    }
  }
  const trajectories = path.join(runDir, "trajectories.jsonl");
  const c = (config ?? {}) as { scaleRewards?: unknown; scale_rewards?: unknown };
  const scale = (c.scaleRewards ?? c.scale_rewards) === "none" ? "none" : "group"; // as training computed them
  const rollouts = (await exists(trajectories))
    ? await readRolloutSample(trajectories, { limits: opts.rollouts, scaleRewards: scale })
    : undefined;
  const heldOut = await readHeldOut(path.join(runDir, "eval.json"));
  const file = path.join(runDir, "report.html");
  await writeFileAtomic(file, renderTrainReport({ title: opts.title, records, config, extra: opts.extra, rollouts, heldOut }));
  return file;
}

/** eval.json's `samples` (finalEvaluation writes the first 50 questions), or nothing. */
async function readHeldOut(file: string): Promise<HeldOutQuestion[] | undefined> {
  const text = await fs.readFile(file, "utf8").catch(() => undefined);
  if (text === undefined) return undefined;
  try {
    const samples = (JSON.parse(text) as { samples?: unknown }).samples;
    return Array.isArray(samples) ? (samples as HeldOutQuestion[]).filter((q) => q && Array.isArray(q.samples)) : undefined;
  } catch {
    return undefined;
  }
}

// ---------------------------------------------------------------- evaluation summary

export interface EvalRow {
  /** Model / checkpoint / setting evaluated, e.g. "base" or "grpo step 200". */
  name: string;
  n: number;
  correct: number;
  /** Accuracy and CI computed elsewhere (for example meanCI over per-question pass@1 from k samples);
   *  when absent, correct / n with a Wilson interval. */
  interval?: Interval;
  /** pass@k values by k, when several samples per question were drawn. */
  passAtK?: Record<number, number>;
  /** Further columns (format rate, mean tool calls, ...). */
  extra?: Record<string, number | string>;
}

export interface EvalSummary {
  title: string;
  rows: EvalRow[];
  config?: Record<string, unknown>;
  /** Every model's questions and samples (as in samples-<model>.jsonl), for the per-question view. */
  questions?: ModelQuestions[];
  /** [model, baseline] pairs whose changes get a filter; default: each model against the one before. */
  compare?: Array<[string, string]>;
  questionLimits?: Partial<QuestionLimits>;
}

/** Horizontal bars of accuracy with 95% Wilson whiskers, one row per evaluated model. */
function accuracyBarsSvg(rows: EvalRow[]): string {
  const rowH = 26,
    left = 170,
    right = 60,
    width = 560,
    top = 10,
    height = top + rows.length * rowH + 26;
  const px = (v: number) => left + v * (width - left - right);
  const out = [`<svg class="chart" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}" role="img" aria-label="accuracy">`];
  for (const t of [0, 0.25, 0.5, 0.75, 1]) {
    out.push(
      `<line x1="${px(t)}" x2="${px(t)}" y1="${top}" y2="${height - 22}" class="g"/><text x="${px(t)}" ` +
        `y="${height - 8}" class="xl">${t * 100}%</text>`,
    );
  }
  rows.forEach((r, i) => {
    const ci = r.interval ?? wilsonInterval(r.correct, r.n);
    const y = top + i * rowH;
    const name = r.name.length > 26 ? r.name.slice(0, 25) + "…" : r.name;
    out.push(`<text x="${left - 8}" y="${y + 17}" class="yl">${escapeHtml(name)}</text>`);
    out.push(`<rect x="${left}" y="${y + 5}" width="${(px(ci.value) - left).toFixed(1)}" height="${rowH - 10}" class="bar"/>`);
    out.push(`<line x1="${px(ci.lo).toFixed(1)}" x2="${px(ci.hi).toFixed(1)}" y1="${y + rowH / 2}" y2="${y + rowH / 2}" class="ci"/>`);
    for (const v of [ci.lo, ci.hi])
      out.push(`<line x1="${px(v).toFixed(1)}" x2="${px(v).toFixed(1)}" y1="${y + 8}" y2="${y + rowH - 8}" class="ci"/>`);
    out.push(
      `<text x="${(px(ci.hi) + 6).toFixed(1)}" y="${y + 17}" class="yl" text-anchor="start" style="text-anchor:start">` +
        `${(ci.value * 100).toFixed(1)}%</text>`,
    );
  });
  out.push(`</svg>`);
  return out.join("");
}

export function renderEvalReport(summary: EvalSummary): string {
  for (const r of summary.rows) wilsonInterval(r.correct, r.n); // reject impossible counts early, with the values
  const ks = [...new Set(summary.rows.flatMap((r) => Object.keys(r.passAtK ?? {}).map(Number)))].sort((a, b) => a - b);
  const extraCols = [...new Set(summary.rows.flatMap((r) => Object.keys(r.extra ?? {})))];
  const head = ["model", "n", "correct", "accuracy", "95% CI", ...ks.map((k) => `pass@${k}`), ...extraCols];
  const rows = summary.rows.map((r) => {
    const ci = r.interval ?? wilsonInterval(r.correct, r.n);
    const pct = (v: number) => `${(v * 100).toFixed(1)}%`;
    return (
      `<tr><th>${escapeHtml(r.name)}</th><td class="n">${r.n}</td><td class="n">${r.correct}</td><td class="n">${pct(ci.value)}</td>` +
      `<td class="n">${pct(ci.lo)} – ${pct(ci.hi)}</td>` +
      ks.map((k) => (r.passAtK?.[k] === undefined ? "<td></td>" : `<td class="n">${pct(r.passAtK[k])}</td>`)).join("") +
      extraCols.map((c) => (r.extra?.[c] === undefined ? "<td></td>" : cell(r.extra[c]))).join("") +
      `</tr>`
    );
  });
  let body = summary.rows.length ? accuracyBarsSvg(summary.rows) : "<p>No evaluations.</p>";
  body += `\n<h2>Results</h2><table><tr>${head.map((h) => `<th>${escapeHtml(h)}</th>`).join("")}</tr>${rows.join("")}</table>\n`;
  body +=
    `<p class="sub">95% CI: Wilson score interval unless stated otherwise by the run. ` +
    `pass@k: unbiased estimator from n samples per question.</p>\n`;
  const qs = summary.questions ?? [];
  const compare = summary.compare ?? qs.slice(1).map((m, i): [string, string] => [m.name, qs[i].name]);
  const browser = renderQuestionBrowser(qs, compare, summary.questionLimits);
  body += browser.html;
  if (summary.config) body += `<h2>Config</h2>${keyValueTable(summary.config)}\n`;
  return page(summary.title, `${summary.rows.length} evaluation${summary.rows.length === 1 ? "" : "s"}`, body, browser.css);
}

export async function writeEvalReport(file: string, summary: EvalSummary): Promise<string> {
  await writeFileAtomic(file, renderEvalReport(summary));
  return file;
}
