/** Metric curves as inline SVG: one line chart per metric that moves, in a fixed order (reward first,
 *  then accuracy, loss, ...), y values in readable units (MB, s, tokens/s) with the unit in the title;
 *  a metric that never changes, or was logged once, becomes one line of text instead of a chart. */
import { formatNumber, METRIC, type MetricsRecord } from "../trainer/metrics.ts";
import { escapeHtml } from "./html.ts";

export type Unit = "" | "bytes" | "s" | "tokens" | "tokens/s";

/** Known curves in display order: key, title, unit, key of a ±std band. Other numeric keys follow. */
const KNOWN: Array<{ key: string; title: string; unit?: Unit; band?: string }> = [
  { key: METRIC.reward, title: "Reward (mean ± std)", band: METRIC.rewardStd },
  { key: METRIC.accuracy, title: "Accuracy (training rollouts)" },
  { key: METRIC.evalAccuracy, title: "Eval accuracy" },
  { key: METRIC.loss, title: "Loss" },
  { key: METRIC.kl, title: "KL to base" },
  { key: METRIC.completionLen, title: "Completion length", unit: "tokens" },
  { key: METRIC.toolCalls, title: "Tool calls per rollout" },
  { key: METRIC.clipRatio, title: "Clipped fraction" },
  { key: METRIC.lr, title: "Learning rate" },
  { key: METRIC.gradNorm, title: "Gradient norm" },
  { key: METRIC.entropy, title: "Entropy" },
  { key: METRIC.stepTime, title: "Step time", unit: "s" },
  { key: "rollout_time", title: "Rollout time per step", unit: "s" },
  { key: "train_time", title: "Update time per step", unit: "s" },
  { key: "tokens_per_s", title: "Training throughput", unit: "tokens/s" },
  { key: "rollout_tokens_per_s", title: "Rollout throughput", unit: "tokens/s" },
  { key: "train_tokens_per_s", title: "Update throughput", unit: "tokens/s" },
  { key: "tokens", title: "Trained tokens per step", unit: "tokens" },
  { key: "rss_bytes", title: "Process memory, RSS", unit: "bytes" },
  { key: "tensor_bytes", title: "Tensor memory", unit: "bytes" },
  { key: "tensors", title: "Live tensors" },
  { key: "epoch", title: "Epoch" },
];
// The loss's hyper-parameters ride on every GRPO step line; as constants they are no curves.
const NOT_CURVES = new Set(["step", "time", "epsilon", "epsilon_high", "beta"]);

/** The unit of a metric from its name, for keys the list above does not know. */
export function unitOf(key: string): Unit {
  const known = KNOWN.find((k) => k.key === key);
  if (known) return known.unit ?? "";
  if (/_bytes$/.test(key)) return "bytes";
  if (/per_s$/.test(key)) return "tokens/s";
  if (/(_time|_seconds)$/.test(key)) return "s";
  if (/(_len|^tokens)$/.test(key)) return "tokens";
  return "";
}

/** Bytes are drawn in MB or GB (whichever keeps the largest value under 1000); others as they are. */
function scaleFor(unit: Unit, maxAbs: number): { div: number; label: string } {
  if (unit === "bytes")
    return maxAbs >= 1e9 ? { div: 1e9, label: "GB" } : maxAbs >= 1e6 ? { div: 1e6, label: "MB" } : { div: 1e3, label: "kB" };
  return { div: 1, label: unit };
}

/** A tick label that fits the axis: 12000 → "12k", 2500000 → "2.5M", 3e-5 → "3e-5". */
export function formatTick(v: number): string {
  const a = Math.abs(v);
  if (a >= 1e6) return `${formatNumber(v / 1e6, 3)}M`;
  if (a >= 1e4) return `${formatNumber(v / 1e3, 3)}k`;
  return formatNumber(v, 3);
}

/** About `count` round tick values covering [lo, hi] (1, 2, 5 × 10^k steps). */
export function niceTicks(lo: number, hi: number, count = 4): number[] {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw)!;
  const out: number[] = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    out.push(Math.abs(v) < step * 1e-9 ? 0 : Number(v.toPrecision(12)));
  return out;
}

export interface Series {
  x: number[];
  y: Array<number | null>;
  /** Optional band (for example mean ± std). */
  lo?: Array<number | null>;
  hi?: Array<number | null>;
}

const W = 380,
  H = 210,
  ML = 52,
  MR = 14,
  MT = 28,
  MB = 30;

/** One line chart as an inline <svg>: axes with round ticks, a band if given, dots when sparse. */
export function lineChartSvg(s: Series, title: string): string {
  const pts = s.x.map((x, i) => [x, s.y[i]] as const).filter((p): p is readonly [number, number] => p[1] !== null && Number.isFinite(p[1]));
  const band =
    s.lo && s.hi
      ? s.x
          .map((x, i) => [x, s.lo![i], s.hi![i]] as const)
          .filter(
            (b): b is readonly [number, number, number] => b[1] !== null && b[2] !== null && Number.isFinite(b[1]) && Number.isFinite(b[2]),
          )
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
    parts.push(`<text x="${ML - 6}" y="${f(py(t) + 4)}" class="yl">${formatTick(t)}</text>`);
  }
  for (const t of niceTicks(x0, x1, 5)) {
    if (t < x0 || t > x1) continue;
    parts.push(`<line x1="${f(px(t))}" x2="${f(px(t))}" y1="${H - MB}" y2="${H - MB + 4}" class="a"/>`);
    parts.push(`<text x="${f(px(t))}" y="${H - MB + 16}" class="xl">${formatTick(t)}</text>`);
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

/** Keys charted, in order: the known list first, then any other key holding numbers (a band key
 *  is drawn with its curve, not on its own). */
export function chartedKeys(records: MetricsRecord[]): string[] {
  const numeric = new Set<string>();
  for (const r of records)
    for (const [k, v] of Object.entries(r)) if (typeof v === "number" && Number.isFinite(v) && !NOT_CURVES.has(k)) numeric.add(k);
  const bands = new Set(KNOWN.filter((k) => k.band && numeric.has(k.key)).map((k) => k.band!));
  const known = KNOWN.map((k) => k.key).filter((k) => numeric.has(k));
  const rest = [...numeric].filter((k) => !known.includes(k) && !bands.has(k)).sort();
  // reward components (reward_correctness, ...) right after the reward they make up
  const at = known.indexOf(METRIC.reward) + 1;
  const parts = at > 0 ? rest.filter((k) => k.startsWith(`${METRIC.reward}_`)) : [];
  return [...known.slice(0, at), ...parts, ...known.slice(at), ...rest.filter((k) => !parts.includes(k))];
}

/** A chart's title: the known one, "Reward: correctness" for a reward component, else the key. */
function titleOf(key: string): string {
  const known = KNOWN.find((k) => k.key === key);
  if (known) return known.title;
  if (key.startsWith(`${METRIC.reward}_`)) return `Reward: ${key.slice(METRIC.reward.length + 1).replace(/_/g, " ")}`;
  return key;
}

const num = (v: unknown) => (typeof v === "number" && Number.isFinite(v) ? v : null);

/** A value with its unit, scaled like the charts: 3.1e8 bytes → "310 MB". */
export function formatWithUnit(v: number, unit: Unit): string {
  const s = scaleFor(unit, Math.abs(v));
  return `${formatNumber(v / s.div, 3)}${s.label ? " " + s.label : ""}`;
}

/** Speed and memory metrics: kept apart from the curves of what the model does. */
export function isSystemMetric(key: string): boolean {
  return ["s", "tokens/s", "bytes"].includes(unitOf(key)) || ["tensors", "tokens", "epoch"].includes(key);
}

/** Charts for the moving metrics and one text line per metric that does not move. Records must be
 *  sorted by step, one per step. */
export function metricCharts(records: MetricsRecord[], keys = chartedKeys(records)): { charts: string[]; flat: string[] } {
  const x = records.map((r) => r.step);
  const charts: string[] = [],
    flat: string[] = [];
  for (const key of keys) {
    const known = KNOWN.find((k) => k.key === key);
    const unit = unitOf(key);
    const y = records.map((r) => num(r[key]));
    const vals = y.filter((v): v is number => v !== null);
    const steps = x.filter((_, i) => y[i] !== null);
    const sd = known?.band ? records.map((r) => num(r[known.band!])) : [];
    const bandMoves = sd.some((v) => v !== null && v > 0);
    const [lo, hi] = [Math.min(...vals), Math.max(...vals)];
    if (vals.length === 1) {
      flat.push(`<li><b>${escapeHtml(key)}</b>: ${escapeHtml(formatWithUnit(vals[0], unit))} (step ${steps[0]} only)</li>`);
      continue;
    }
    if (hi - lo <= 1e-12 * Math.max(1, Math.abs(hi)) && !bandMoves) {
      flat.push(
        `<li><b>${escapeHtml(key)}</b>: ${escapeHtml(formatWithUnit(vals[0], unit))} throughout ` +
          `(${vals.length} steps, ${steps[0]}–${steps[steps.length - 1]})</li>`,
      );
      continue;
    }
    const sc = scaleFor(unit, Math.max(Math.abs(lo), Math.abs(hi)));
    const div = (v: number | null) => (v === null ? null : v / sc.div);
    const s: Series = { x, y: y.map(div) };
    if (known?.band && sd.some((v) => v !== null)) {
      s.lo = y.map((v, i) => (v === null || sd[i] === null ? null : (v - sd[i]!) / sc.div));
      s.hi = y.map((v, i) => (v === null || sd[i] === null ? null : (v + sd[i]!) / sc.div));
    }
    const title = titleOf(key) + (sc.label ? ` (${sc.label})` : "");
    charts.push(lineChartSvg(s, title));
  }
  return { charts, flat };
}

/** The charts section: the curves of what the model does (reward first), one line per metric that
 *  does not move, then speed and memory folded under a <details>. */
export function chartsSection(records: MetricsRecord[]): string {
  const keys = chartedKeys(records);
  const main = metricCharts(
    records,
    keys.filter((k) => !isSystemMetric(k)),
  );
  const sys = metricCharts(records, keys.filter(isSystemMetric));
  const flat = [...main.flat, ...sys.flat];
  let html = `<div class="charts">${main.charts.join("\n")}</div>\n`;
  if (flat.length) html += `<ul class="flat" aria-label="constant metrics">${flat.join("")}</ul>\n`;
  const n = sys.charts.length;
  if (n) html += `<details><summary>Speed and memory (${n} chart${n === 1 ? "" : "s"})</summary><div class="charts">`;
  if (n) html += `${sys.charts.join("\n")}</div></details>\n`;
  return html;
}
