/** The evaluation report's per-question view: every model's transcript of a question side by side,
 *  with filters "wrong → right" and "right → wrong" for each compared pair, "format failures" and
 *  "tool errors", each with its count. The filters are radio buttons and CSS (no script). Bounded:
 *  at most `maxQuestions` questions (those some filter selects first) and `maxChars` characters per
 *  transcript; the counts cover every question, and samples-<model>.jsonl holds everything. */
import type { TurnRecord } from "../rollout/types.ts";
import { escapeHtml } from "./html.ts";
import { renderPlain, renderTurns, TRANSCRIPT_LEGEND } from "./transcript.ts";

/** One sample as samples-<model>.jsonl stores it. */
export interface QuestionSample {
  text: string;
  finalText: string;
  strict: boolean;
  lenient?: boolean;
  formatValid: boolean;
  toolCalls: number;
  toolErrors?: number;
  parseErrors?: number;
  truncated: boolean;
  turns?: TurnRecord[];
}

export interface ModelQuestions {
  name: string;
  questions: Array<{ id: string; question: string; gold: string; samples: QuestionSample[] }>;
}

export interface QuestionLimits {
  maxQuestions: number;
  maxChars: number;
}

export const QUESTION_LIMITS: QuestionLimits = { maxQuestions: 200, maxChars: 2000 };

/** Share of a question's samples that are strictly correct (1 or 0 when k = 1). */
const score = (samples: QuestionSample[]) => (samples.length ? samples.filter((s) => s.strict).length / samples.length : 0);
const toolTrouble = (s: QuestionSample) => (s.toolErrors ?? 0) + (s.parseErrors ?? 0) > 0;

interface Filter {
  id: string;
  label: string;
  match: (qi: number) => boolean;
}

/** The filters for these models and compared pairs ([model, baseline] names). */
export function questionFilters(models: ModelQuestions[], compare: Array<[string, string]>): Filter[] {
  const byName = new Map(models.map((m) => [m.name, m]));
  const filters: Filter[] = [];
  compare.forEach(([b, a], i) => {
    const A = byName.get(a),
      B = byName.get(b);
    if (!A || !B) return;
    // k > 1: "wrong → right" means the share of correct samples rose.
    const d = (qi: number) => score(B.questions[qi]?.samples ?? []) - score(A.questions[qi]?.samples ?? []);
    filters.push({ id: `up${i}`, label: `${a} → ${b}: wrong → right`, match: (qi) => d(qi) > 0 });
    filters.push({ id: `down${i}`, label: `${a} → ${b}: right → wrong`, match: (qi) => d(qi) < 0 });
  });
  filters.push({
    id: "fmt",
    label: "format failures",
    match: (qi) => models.some((m) => m.questions[qi]?.samples.some((s) => !s.formatValid)),
  });
  filters.push({
    id: "tool",
    label: "tool errors or unparsed calls",
    match: (qi) => models.some((m) => m.questions[qi]?.samples.some(toolTrouble)),
  });
  return filters;
}

function sampleHtml(model: string, samples: QuestionSample[], maxChars: number): string {
  const s = samples[0];
  if (!s) return `<div class="ro"><div class="meta"><b>${escapeHtml(model)}</b> · no sample</div></div>`;
  const tags = [s.strict ? `<span class="tag ok">right</span>` : `<span class="tag bad">wrong</span>`];
  if (!s.formatValid) tags.push(`<span class="tag warn">format failure</span>`);
  if (toolTrouble(s)) tags.push(`<span class="tag bad">tool error or unparsed call</span>`);
  if (s.truncated) tags.push(`<span class="tag warn">truncated</span>`);
  const k = samples.length > 1 ? ` · sample 1 of ${samples.length}, ${samples.filter((x) => x.strict).length} right` : "";
  const source = `samples-${model}.jsonl`;
  const body = Array.isArray(s.turns)
    ? renderTurns(s.turns, { maxChars, source })
    : renderPlain(String(s.text ?? ""), { maxChars, source });
  const calls = `${s.toolCalls} tool call${s.toolCalls === 1 ? "" : "s"}`;
  const meta = `<b>${escapeHtml(model)}</b> ${tags.join("")} · ${calls}${k}`;
  return `<div class="ro${s.strict ? "" : " miss"}"><div class="meta">${meta}</div>${body}</div>`;
}

/** The per-question section. Questions are matched by position (all models ran the same list). */
export function renderQuestionBrowser(
  models: ModelQuestions[],
  compare: Array<[string, string]>,
  limits: Partial<QuestionLimits> = {},
): { html: string; css: string } {
  const lim = { ...QUESTION_LIMITS, ...limits };
  const n = Math.max(0, ...models.map((m) => m.questions.length));
  if (models.length === 0 || n === 0) return { html: "", css: "" };
  const filters = questionFilters(models, compare);
  const member = Array.from({ length: n }, (_, qi) => filters.filter((f) => f.match(qi)).map((f) => f.id));
  // Within the bound, questions some filter selects come first; the rest fill up in order.
  const flagged = member.map((m, qi) => (m.length ? qi : -1)).filter((qi) => qi >= 0);
  const others = member.map((m, qi) => (m.length ? -1 : qi)).filter((qi) => qi >= 0);
  const shown = new Set([...flagged, ...others].slice(0, lim.maxQuestions));
  const count = (id: string) => member.filter((m) => m.includes(id)).length;
  const shownCount = (id: string) => member.filter((m, qi) => shown.has(qi) && m.includes(id)).length;

  const all = [
    { id: "all", label: "all questions", total: n, shown: shown.size },
    ...filters.map((f) => ({ id: f.id, label: f.label, total: count(f.id), shown: shownCount(f.id) })),
  ];
  const inputs = all.map((f, i) => `<input type="radio" name="qf" id="qf-${f.id}"${i === 0 ? " checked" : ""}>`).join("");
  const labels = all
    .map((f) => `<label for="qf-${f.id}">${escapeHtml(f.label)} (${f.total}${f.shown < f.total ? `, ${f.shown} shown` : ""})</label>`)
    .join("");
  let css = "";
  for (const f of all) {
    css += `#qf-${f.id}:checked~label[for=qf-${f.id}]{background:#2563eb;color:#fff;border-color:#2563eb}`;
    if (f.id !== "all") css += `#qf-${f.id}:checked~.qs .qq:not(.${f.id}){display:none}`;
  }
  css += `.cmp{grid-template-columns:repeat(${models.length},minmax(0,1fr))}`;

  const cards: string[] = [];
  for (let qi = 0; qi < n; qi++) {
    if (!shown.has(qi)) continue;
    const ref = models.find((m) => m.questions[qi])!.questions[qi];
    const verdict = (m: (typeof models)[number]) => (score(m.questions[qi]?.samples ?? []) >= 0.5 ? "✓" : "✗");
    const verdicts = models.map((m) => `${escapeHtml(m.name)} ${verdict(m)}`).join(" · ");
    cards.push(
      `<div class="group qq ${member[qi].join(" ")}"><div class="meta">question ${qi + 1} · <code>${escapeHtml(ref.id)}</code>` +
        ` · gold <b>${escapeHtml(ref.gold)}</b> · ${verdicts}</div>` +
        `<div class="q">${escapeHtml(ref.question)}</div>` +
        `<div class="cmp">${models.map((m) => sampleHtml(m.name, m.questions[qi]?.samples ?? [], lim.maxChars)).join("")}</div></div>`,
    );
  }
  const bound =
    shown.size < n
      ? `${shown.size} of ${n} questions shown (those a filter selects first), at most ${lim.maxChars} characters per transcript; ` +
        "every sample is in samples-&lt;model&gt;.jsonl."
      : `All ${n} questions, at most ${lim.maxChars} characters per transcript; every sample is in samples-&lt;model&gt;.jsonl.`;
  const html =
    `<h2 id="questions">Per question</h2><p class="sub">${bound} Pick a filter:</p>${TRANSCRIPT_LEGEND}` +
    `<div class="filters">${inputs}${labels}<div class="qs">${cards.join("\n")}</div></div>\n`;
  return { html, css };
}
