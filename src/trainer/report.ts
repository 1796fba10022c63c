/** Self-contained HTML reports: `report.html` for a training run (one inline-SVG line chart per metric
 *  found in metrics.jsonl, a table of final values, the run config) and an evaluation summary
 *  (accuracies with 95% Wilson intervals, pass@k). No scripts, fonts or external assets, so the file
 *  opens anywhere and can be attached as is. Every string from a run (config values, names, and any
 *  model-written text) is HTML-escaped. */
import * as path from "node:path";
import { promises as fs } from "node:fs";
import { writeFileAtomic } from "../util/fs.ts";
import { formatNumber, METRIC, readMetrics, type MetricsRecord } from "./metrics.ts";
import { formatDuration } from "./progress.ts";
import { wilsonInterval, type Interval } from "./stats.ts";

export function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]!);
}

/** Known curves in display order: [key, title, key of a ±std band]. Other numeric keys follow. */
const KNOWN: Array<[string, string, string?]> = [
  [METRIC.reward, "Reward (mean ± std)", METRIC.rewardStd],
  [METRIC.accuracy, "Accuracy (training rollouts)"],
  [METRIC.evalAccuracy, "Eval accuracy"],
  [METRIC.loss, "Loss"],
  [METRIC.kl, "KL to base"],
  [METRIC.completionLen, "Completion length (tokens)"],
  [METRIC.toolCalls, "Tool calls per rollout"],
  [METRIC.clipRatio, "Clipped fraction"],
  [METRIC.lr, "Learning rate"],
  [METRIC.gradNorm, "Gradient norm"],
  [METRIC.entropy, "Entropy"],
  [METRIC.stepTime, "Step time (s)"],
];
const NOT_CURVES = new Set(["step", "time"]);

// ---------------------------------------------------------------- charts

/** About `count` round tick values covering [lo, hi] (1, 2, 5 × 10^k steps). */
export function niceTicks(lo: number, hi: number, count = 4): number[] {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw)!;
  const out: number[] = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : Number(v.toPrecision(12)));
  return out;
}

export interface Series {
  x: number[];
  y: Array<number | null>;
  /** Optional band (for example mean ± std). */
  lo?: Array<number | null>;
  hi?: Array<number | null>;
}

const W = 380, H = 210, ML = 52, MR = 14, MT = 28, MB = 30;

/** One line chart as an inline <svg>: axes with round ticks, a band if given, dots when sparse. */
export function lineChartSvg(s: Series, title: string): string {
  const pts = s.x.map((x, i) => [x, s.y[i]] as const).filter((p): p is readonly [number, number] => p[1] !== null && Number.isFinite(p[1]));
  const band = s.lo && s.hi
    ? s.x.map((x, i) => [x, s.lo![i], s.hi![i]] as const).filter((b): b is readonly [number, number, number] => b[1] !== null && b[2] !== null && Number.isFinite(b[1]) && Number.isFinite(b[2]))
    : [];
  const ys = [...pts.map((p) => p[1]), ...band.flatMap((b) => [b[1], b[2]])];
  const xs = pts.map((p) => p[0]);
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (y0 === y1) [y0, y1] = [y0 - (Math.abs(y0) || 1) * 0.5, y1 + (Math.abs(y1) || 1) * 0.5];
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
  const yt = niceTicks(y0, y1, 4);
  y0 = Math.min(y0, yt[0]);
  y1 = Math.max(y1, yt[yt.length - 1]);
  const px = (x: number) => ML + ((x - x0) / (x1 - x0)) * (W - ML - MR);
  const py = (y: number) => H - MB - ((y - y0) / (y1 - y0)) * (H - MT - MB);
  const f = (v: number) => v.toFixed(1);

  const parts: string[] = [];
  parts.push(`<svg class="chart" viewBox="0 0 ${W} ${H}" width="${W}" height="${H}" role="img" aria-label="${escapeHtml(title)}">`);
  parts.push(`<text x="${ML}" y="17" class="t">${escapeHtml(title)}</text>`);
  for (const t of yt) {
    parts.push(`<line x1="${ML}" x2="${W - MR}" y1="${f(py(t))}" y2="${f(py(t))}" class="g"/>`);
    parts.push(`<text x="${ML - 6}" y="${f(py(t) + 4)}" class="yl">${formatNumber(t, 3)}</text>`);
  }
  for (const t of niceTicks(x0, x1, 5)) {
    if (t < x0 || t > x1) continue;
    parts.push(`<line x1="${f(px(t))}" x2="${f(px(t))}" y1="${H - MB}" y2="${H - MB + 4}" class="a"/>`);
    parts.push(`<text x="${f(px(t))}" y="${H - MB + 16}" class="xl">${formatNumber(t, 4)}</text>`);
  }
  parts.push(`<line x1="${ML}" x2="${W - MR}" y1="${H - MB}" y2="${H - MB}" class="a"/>`);
  parts.push(`<line x1="${ML}" x2="${ML}" y1="${MT - 6}" y2="${H - MB}" class="a"/>`);
  parts.push(`<text x="${W - MR}" y="${H - 2}" class="xl" text-anchor="end">step</text>`);
  if (band.length > 1) {
    const upper = band.map((b) => `${f(px(b[0]))},${f(py(b[2]))}`);
    const lower = band.map((b) => `${f(px(b[0]))},${f(py(b[1]))}`).reverse();
    parts.push(`<polygon points="${[...upper, ...lower].join(" ")}" class="band"/>`);
  }
  if (pts.length > 1) parts.push(`<polyline points="${pts.map((p) => `${f(px(p[0]))},${f(py(p[1]))}`).join(" ")}" class="line"/>`);
  // Dots when points are few (eval every N steps) so a two-point line does not look like data.
  if (pts.length <= 30) for (const p of pts) parts.push(`<circle cx="${f(px(p[0]))}" cy="${f(py(p[1]))}" r="2.5" class="dot"/>`);
  parts.push(`</svg>`);
  return parts.join("");
}

// ---------------------------------------------------------------- page

const CSS = `body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1d2330;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}.sub{color:#667;margin:0 0 16px}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{border:1px solid #e3e6ec;border-radius:6px;background:#fcfcfd}
.t{font-size:13px;font-weight:600;fill:#1d2330}.yl{font-size:10px;fill:#556;text-anchor:end}.xl{font-size:10px;fill:#556;text-anchor:middle}
.g{stroke:#eceef2}.a{stroke:#99a}.line{fill:none;stroke:#2563eb;stroke-width:1.6}.band{fill:#2563eb;opacity:.16}.dot{fill:#2563eb}
table{border-collapse:collapse;font-size:13px}td,th{border-bottom:1px solid #e3e6ec;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f4f5f8}td.n{text-align:right;font-variant-numeric:tabular-nums}code{font:12px ui-monospace,monospace;word-break:break-all}
.bar{fill:#2563eb;opacity:.8}.ci{stroke:#1d2330;stroke-width:1.4}`;

function page(title: string, subtitle: string, body: string): string {
  return `<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">` +
    `<title>${escapeHtml(title)}</title><style>${CSS}</style></head>\n<body><h1>${escapeHtml(title)}</h1><p class="sub">${escapeHtml(subtitle)}</p>\n${body}\n</body></html>\n`;
}

function cell(v: unknown): string {
  if (typeof v === "number") return `<td class="n">${escapeHtml(formatNumber(v, 4))}</td>`;
  if (typeof v === "string") return `<td><code>${escapeHtml(v)}</code></td>`;
  return `<td><code>${escapeHtml(JSON.stringify(v) ?? "")}</code></td>`;
}

function keyValueTable(obj: Record<string, unknown>): string {
  const rows = Object.entries(obj).map(([k, v]) => `<tr><th>${escapeHtml(k)}</th>${cell(v)}</tr>`);
  return `<table>${rows.join("")}</table>`;
}

export interface TrainReportInput {
  title: string;
  records: MetricsRecord[];
  config?: unknown;
  /** More rows for the summary table (for example final eval accuracy). */
  extra?: Record<string, unknown>;
}

/** Keys charted, in order: the known list first, then any other key holding numbers. */
export function chartedKeys(records: MetricsRecord[]): string[] {
  const numeric = new Set<string>();
  for (const r of records) for (const [k, v] of Object.entries(r)) if (typeof v === "number" && Number.isFinite(v) && !NOT_CURVES.has(k)) numeric.add(k);
  const bands = new Set(KNOWN.filter(([k, , b]) => b && numeric.has(k)).map(([, , b]) => b!));
  const known = KNOWN.map(([k]) => k).filter((k) => numeric.has(k));
  const rest = [...numeric].filter((k) => !known.includes(k) && !bands.has(k)).sort();
  return [...known, ...rest];
}

/** Records sorted by step, the last one kept when a step was logged twice (a run resumed from an
 *  earlier checkpoint without dropping the later lines). */
function byStep(records: MetricsRecord[]): MetricsRecord[] {
  const last = new Map<number, MetricsRecord>();
  for (const r of records) last.set(r.step, r);
  return [...last.values()].sort((a, b) => a.step - b.step);
}

export function renderTrainReport(input: TrainReportInput): string {
  const records = byStep(input.records);
  const keys = chartedKeys(records);
  const x = records.map((r) => r.step);
  const num = (v: unknown) => (typeof v === "number" && Number.isFinite(v) ? v : null);
  const charts = keys.map((k) => {
    const known = KNOWN.find(([kk]) => kk === k);
    const y = records.map((r) => num(r[k]));
    const s: Series = { x, y };
    if (known?.[2] && records.some((r) => num(r[known[2]!]) !== null)) {
      const sd = records.map((r) => num(r[known[2]!]));
      s.lo = y.map((v, i) => (v === null || sd[i] === null ? null : v - sd[i]!));
      s.hi = y.map((v, i) => (v === null || sd[i] === null ? null : v + sd[i]!));
    }
    return lineChartSvg(s, known?.[1] ?? k);
  });

  const finals: string[] = [];
  for (const k of keys) {
    const vals = records.map((r) => num(r[k])).filter((v): v is number => v !== null);
    const lastRec = [...records].reverse().find((r) => num(r[k]) !== null)!;
    finals.push(`<tr><th>${escapeHtml(k)}</th>${cell(vals[vals.length - 1])}<td class="n">${lastRec.step}</td>${cell(Math.min(...vals))}${cell(Math.max(...vals))}</tr>`);
  }
  const first = records[0], last = records[records.length - 1];
  const span = records.length ? `${records.length} logged steps, step ${first.step} to ${last.step}` : "no metrics logged yet";
  const minutes = records.length > 1 ? `, ${formatDuration(last.time - first.time)} wall time` : "";
  let body = `<div class="charts">${charts.join("\n")}</div>\n`;
  body += `<h2>Final values</h2><table><tr><th>metric</th><th>last</th><th>at step</th><th>min</th><th>max</th></tr>${finals.join("")}</table>\n`;
  if (input.extra && Object.keys(input.extra).length) body += `<h2>Summary</h2>${keyValueTable(input.extra)}\n`;
  if (input.config !== undefined) {
    const cfg = typeof input.config === "object" && input.config !== null ? (input.config as Record<string, unknown>) : { config: input.config };
    body += `<h2>Run config</h2>${keyValueTable(cfg)}\n`;
  }
  return page(input.title, span + minutes, body);
}

/** Write `runDir/report.html` from the run's metrics.jsonl (and run.json config when present). */
export async function writeReport(
  runDir: string,
  opts: { title: string; metricsFile?: string; config?: unknown; extra?: Record<string, unknown> },
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
  const file = path.join(runDir, "report.html");
  await writeFileAtomic(file, renderTrainReport({ title: opts.title, records, config, extra: opts.extra }));
  return file;
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
}

/** Horizontal bars of accuracy with 95% Wilson whiskers, one row per evaluated model. */
function accuracyBarsSvg(rows: EvalRow[]): string {
  const rowH = 26, left = 170, right = 60, width = 560, top = 10, height = top + rows.length * rowH + 26;
  const px = (v: number) => left + v * (width - left - right);
  const out = [`<svg class="chart" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}" role="img" aria-label="accuracy">`];
  for (const t of [0, 0.25, 0.5, 0.75, 1]) {
    out.push(`<line x1="${px(t)}" x2="${px(t)}" y1="${top}" y2="${height - 22}" class="g"/><text x="${px(t)}" y="${height - 8}" class="xl">${t * 100}%</text>`);
  }
  rows.forEach((r, i) => {
    const ci = r.interval ?? wilsonInterval(r.correct, r.n);
    const y = top + i * rowH;
    const name = r.name.length > 26 ? r.name.slice(0, 25) + "…" : r.name;
    out.push(`<text x="${left - 8}" y="${y + 17}" class="yl">${escapeHtml(name)}</text>`);
    out.push(`<rect x="${left}" y="${y + 5}" width="${(px(ci.value) - left).toFixed(1)}" height="${rowH - 10}" class="bar"/>`);
    out.push(`<line x1="${px(ci.lo).toFixed(1)}" x2="${px(ci.hi).toFixed(1)}" y1="${y + rowH / 2}" y2="${y + rowH / 2}" class="ci"/>`);
    for (const v of [ci.lo, ci.hi]) out.push(`<line x1="${px(v).toFixed(1)}" x2="${px(v).toFixed(1)}" y1="${y + 8}" y2="${y + rowH - 8}" class="ci"/>`);
    out.push(`<text x="${(px(ci.hi) + 6).toFixed(1)}" y="${y + 17}" class="yl" text-anchor="start" style="text-anchor:start">${(ci.value * 100).toFixed(1)}%</text>`);
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
    return `<tr><th>${escapeHtml(r.name)}</th><td class="n">${r.n}</td><td class="n">${r.correct}</td><td class="n">${pct(ci.value)}</td>` +
      `<td class="n">${pct(ci.lo)} – ${pct(ci.hi)}</td>` +
      ks.map((k) => (r.passAtK?.[k] === undefined ? "<td></td>" : `<td class="n">${pct(r.passAtK[k])}</td>`)).join("") +
      extraCols.map((c) => (r.extra?.[c] === undefined ? "<td></td>" : cell(r.extra[c]))).join("") + `</tr>`;
  });
  let body = summary.rows.length ? accuracyBarsSvg(summary.rows) : "<p>No evaluations.</p>";
  body += `\n<h2>Results</h2><table><tr>${head.map((h) => `<th>${escapeHtml(h)}</th>`).join("")}</tr>${rows.join("")}</table>\n`;
  body += `<p class="sub">95% CI: Wilson score interval unless stated otherwise by the run. pass@k: unbiased estimator from n samples per question.</p>\n`;
  if (summary.config) body += `<h2>Config</h2>${keyValueTable(summary.config)}\n`;
  return page(summary.title, `${summary.rows.length} evaluation${summary.rows.length === 1 ? "" : "s"}`, body);
}

export async function writeEvalReport(file: string, summary: EvalSummary): Promise<string> {
  await writeFileAtomic(file, renderEvalReport(summary));
  return file;
}
