/** The GRPO report's rollout browser: for a few steps (first, middle, last and some evenly between),
 *  the first few groups of each step with their rollouts side by side — conversation, reward and its
 *  components, group-relative advantage, length — the best and worst rollout of each group outlined.
 *  Bounded whatever the run's length: trajectories.jsonl is streamed, only the chosen steps' lines
 *  are parsed, and steps, groups, rollouts per group and characters per rollout are capped (the page
 *  says what it shows; the full data stays in trajectories.jsonl). */
import * as fs from "node:fs";
import * as readline from "node:readline";
import type { TurnRecord } from "../rollout/types.ts";
import { groupAdvantages } from "../trainer/advantages.ts";
import { formatNumber } from "../trainer/metrics.ts";
import { escapeHtml } from "./html.ts";
import { renderTurns, TRANSCRIPT_LEGEND } from "./transcript.ts";
import { mean } from "../trainer/stats.ts";

export interface RolloutLimits {
  /** Steps shown (first, middle and last always among them). */
  maxSteps: number;
  /** Groups (questions) per step: the first ones by prompt index. */
  maxGroups: number;
  /** Rollouts per group: the best and the worst always among them. */
  maxRollouts: number;
  /** Characters of conversation per rollout. */
  maxChars: number;
}

export const ROLLOUT_LIMITS: RolloutLimits = { maxSteps: 8, maxGroups: 4, maxRollouts: 8, maxChars: 3000 };

export interface RolloutView {
  step: number;
  promptIndex: number;
  sampleIndex: number;
  question: string;
  reward: number | null;
  components: Record<string, number>;
  advantage: number | null;
  tokens: number; // completion tokens, sampled + forced
  sampled: number;
  toolCalls: number;
  toolErrors: number;
  parseErrors: number;
  finishReason: string;
  turns: TurnRecord[];
}

export interface RolloutSample {
  /** Every step in the log, in order. */
  allSteps: number[];
  groupsPerStep: number;
  steps: Array<{ step: number; groups: RolloutView[][] }>;
  limits: RolloutLimits;
}

/** Up to `max` of the sorted `steps`: evenly spaced from first to last, the middle one among them. */
export function pickSteps(steps: number[], max: number): number[] {
  const n = steps.length;
  if (n <= max) return [...steps];
  if (max <= 1) return [steps[n - 1]];
  const mid = Math.floor((n - 1) / 2);
  const idx = new Set(Array.from({ length: max }, (_, j) => Math.round((j * (n - 1)) / (max - 1))));
  if (max >= 3 && !idx.has(mid)) {
    // make room for the middle: drop the spaced one nearest to it (never the first or last)
    const inner = [...idx].filter((i) => i !== 0 && i !== n - 1);
    if (inner.length) idx.delete(inner.reduce((a, b) => (Math.abs(b - mid) < Math.abs(a - mid) ? b : a)));
    idx.add(mid);
  }
  return [...idx].sort((a, b) => a - b).map((i) => steps[i]);
}

/** The user message of a chat-template prompt (the question), or the whole prompt. */
export function questionOf(promptText: string): string {
  const users = [...promptText.matchAll(/<\|im_start\|>user\n([\s\S]*?)<\|im_end\|>/g)];
  return users.length ? users[users.length - 1][1] : promptText;
}

const STEP_PREFIX = /^\{"step":(\d+)[,}]/;

async function* lines(file: string): AsyncGenerator<string> {
  const rl = readline.createInterface({ input: fs.createReadStream(file, "utf8"), crlfDelay: Infinity });
  try {
    for await (const line of rl) if (line.trim()) yield line;
  } finally {
    rl.close();
  }
}

function stepOf(line: string): number | null {
  const m = STEP_PREFIX.exec(line);
  if (m) return Number(m[1]);
  try {
    const s = (JSON.parse(line) as { step?: unknown }).step;
    return typeof s === "number" ? s : null;
  } catch {
    return null; // a torn last line
  }
}

const asNum = (v: unknown) => (typeof v === "number" && Number.isFinite(v) ? v : null);

function view(rec: Record<string, unknown>): RolloutView {
  const mask = Array.isArray(rec.lossMask) ? (rec.lossMask as number[]) : [];
  const ids = Array.isArray(rec.completionIds) ? rec.completionIds.length : 0;
  const comps: Record<string, number> = {};
  for (const [k, v] of Object.entries((rec.rewardComponents as Record<string, unknown>) ?? {}))
    if (asNum(v) !== null) comps[k] = v as number;
  return {
    step: rec.step as number,
    promptIndex: asNum(rec.promptIndex) ?? 0,
    sampleIndex: asNum(rec.sampleIndex) ?? 0,
    question: questionOf(String(rec.promptText ?? "")),
    reward: asNum(rec.reward),
    components: comps,
    advantage: null,
    tokens: ids,
    sampled: mask.reduce((a, b) => a + (b ? 1 : 0), 0),
    toolCalls: asNum(rec.numToolCalls) ?? 0,
    toolErrors: asNum(rec.numToolErrors) ?? 0,
    parseErrors: asNum(rec.numParseErrors) ?? 0,
    finishReason: String(rec.finishReason ?? ""),
    turns: Array.isArray(rec.turns) ? (rec.turns as TurnRecord[]) : [],
  };
}

/** Read the sample the browser shows from a trajectories.jsonl (streamed twice: steps, then the
 *  chosen steps' lines). Advantages are recomputed from each whole group's rewards as training did. */
export async function readRolloutSample(
  file: string,
  opts: { limits?: Partial<RolloutLimits>; scaleRewards?: "group" | "none" } = {},
): Promise<RolloutSample> {
  const limits = { ...ROLLOUT_LIMITS, ...opts.limits };
  const seen = new Set<number>();
  for await (const line of lines(file)) {
    const s = stepOf(line);
    if (s !== null) seen.add(s);
  }
  const allSteps = [...seen].sort((a, b) => a - b);
  const chosen = new Set(pickSteps(allSteps, limits.maxSteps));
  const byStep = new Map<number, Map<number, RolloutView[]>>();
  let groupsPerStep = 0;
  for await (const line of lines(file)) {
    const s = stepOf(line);
    if (s === null || !chosen.has(s)) continue;
    let rec: Record<string, unknown>;
    try {
      rec = JSON.parse(line);
    } catch {
      continue;
    }
    const v = view(rec);
    groupsPerStep = Math.max(groupsPerStep, v.promptIndex + 1);
    if (v.promptIndex >= limits.maxGroups) continue;
    const groups = byStep.get(s) ?? byStep.set(s, new Map()).get(s)!;
    (groups.get(v.promptIndex) ?? groups.set(v.promptIndex, []).get(v.promptIndex)!).push(v);
  }
  const steps = [...chosen]
    .sort((a, b) => a - b)
    .map((step) => {
      const groups = [...(byStep.get(step) ?? new Map<number, RolloutView[]>()).entries()]
        .sort((a, b) => a[0] - b[0])
        .map(([, g]) => {
          g.sort((a, b) => a.sampleIndex - b.sampleIndex);
          if (g.every((r) => r.reward !== null)) {
            const adv = groupAdvantages([g.map((r) => r.reward!)], opts.scaleRewards ?? "group")[0];
            g.forEach((r, i) => (r.advantage = adv[i]));
          }
          return g;
        });
      return { step, groups };
    });
  return { allSteps, groupsPerStep, steps, limits };
}

/** Indexes of the best and worst rollout (first of equals); null when all rewards are equal. */
function extremes(g: RolloutView[]): { best: number; worst: number } | null {
  const r = g.map((x) => x.reward ?? -Infinity);
  const hi = Math.max(...r),
    lo = Math.min(...r);
  if (hi === lo) return null;
  return { best: r.indexOf(hi), worst: r.indexOf(lo) };
}

/** Which rollouts of a group are shown: best and worst first kept, then the rest in order. */
function shownRollouts(g: RolloutView[], max: number, ex: { best: number; worst: number } | null): number[] {
  const keep = new Set<number>(ex ? [ex.best, ex.worst] : []);
  for (let i = 0; i < g.length && keep.size < max; i++) keep.add(i);
  return [...keep].sort((a, b) => a - b);
}

const fmt = (v: number | null, d = 3) => (v === null ? "–" : formatNumber(v, d));
const signed = (v: number | null) => (v === null ? "–" : (v > 0 ? "+" : "") + formatNumber(v, 3));

function rolloutCard(r: RolloutView, mark: "best" | "worst" | "", maxChars: number): string {
  const comps = Object.entries(r.components)
    .map(([k, v]) => `${escapeHtml(k)} ${fmt(v)}`)
    .join(", ");
  const tags: string[] = [];
  if (mark) tags.push(`<span class="tag ${mark === "best" ? "ok" : "bad"}">${mark}</span>`);
  if (r.toolErrors + r.parseErrors > 0)
    tags.push(`<span class="tag bad">${r.toolErrors + r.parseErrors} tool error${r.toolErrors + r.parseErrors === 1 ? "" : "s"}</span>`);
  if (r.finishReason && r.finishReason !== "stop") tags.push(`<span class="tag warn">${escapeHtml(r.finishReason)}</span>`);
  const meta =
    `${tags.join("")}#${r.sampleIndex} · reward <b>${fmt(r.reward)}</b>${comps ? ` (${comps})` : ""} · advantage ${signed(r.advantage)}` +
    ` · ${r.tokens} tokens (${r.sampled} sampled, ${r.tokens - r.sampled} forced)` +
    ` · ${r.toolCalls} tool call${r.toolCalls === 1 ? "" : "s"}`;
  const turns = renderTurns(r.turns, { maxChars, source: "trajectories.jsonl" });
  return `<div class="ro${mark ? " " + mark : ""}"><div class="meta">${meta}</div>${turns}</div>`;
}

function groupHtml(g: RolloutView[], limits: RolloutLimits): string {
  const ex = extremes(g);
  const shown = shownRollouts(g, limits.maxRollouts, ex);
  const rewards = g.map((r) => r.reward).filter((v): v is number => v !== null);
  const meanReward = mean(rewards, null);
  const note = ex ? "" : ` · <span class="tag warn">all rewards equal: no learning signal</span>`;
  const more = shown.length < g.length ? ` · ${shown.length} of ${g.length} rollouts shown` : "";
  const cards = shown.map((i) => rolloutCard(g[i], ex?.best === i ? "best" : ex?.worst === i ? "worst" : "", limits.maxChars));
  return (
    `<div class="group"><div class="meta">question ${g[0].promptIndex + 1} · ${g.length} rollouts` +
    ` · mean reward ${fmt(meanReward)}${note}${more}</div>` +
    `<div class="q">${escapeHtml(g[0].question)}</div><div class="rollouts">${cards.join("")}</div></div>`
  );
}

/** The browser section: one <details> per chosen step, first, middle and last open. */
export function renderRolloutBrowser(sample: RolloutSample): string {
  const { allSteps, steps, limits } = sample;
  if (steps.length === 0) return `<h2>Rollouts</h2><p class="sub">No rollouts logged (trajectories.jsonl is empty).</p>`;
  const open = new Set(pickSteps(allSteps, 3));
  const g = Math.min(limits.maxGroups, sample.groupsPerStep);
  const intro =
    `Steps ${steps.map((s) => s.step).join(", ")} of ${allSteps.length} logged; questions 1–${g} of ${sample.groupsPerStep} per step; ` +
    `up to ${limits.maxRollouts} rollouts per question (best and worst always) and ${limits.maxChars} ` +
    `characters per rollout. Everything is in trajectories.jsonl.`;
  const sections = steps.map(({ step, groups }) => {
    const rs = groups
      .flat()
      .map((r) => r.reward)
      .filter((v): v is number => v !== null);
    const m = mean(rs, null);
    const summary = `step ${step} · mean reward of the questions shown ${m === null ? "–" : formatNumber(m, 3)}`;
    const body = groups.map((gr) => groupHtml(gr, limits)).join("");
    return `<details${open.has(step) ? " open" : ""}><summary>${summary}</summary>${body}</details>`;
  });
  return `<h2 id="rollouts">Rollouts</h2><p class="sub">${escapeHtml(intro)}</p>${TRANSCRIPT_LEGEND}\n${sections.join("\n")}\n`;
}
