import { describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { writeRunConfig } from "../../src/run/output-dir.ts";
import type { TurnRecord } from "../../src/rollout/types.ts";
import { MetricsLogger } from "../../src/trainer/metrics.ts";
import { renderEvalReport, renderTrainReport, writeReport } from "../../src/report/report.ts";
import { chartsSection, formatTick, metricCharts } from "../../src/report/charts.ts";
import { escapeHtml } from "../../src/report/html.ts";
import type { ModelQuestions, QuestionSample } from "../../src/report/eval-questions.ts";
import { pickSteps, readRolloutSample } from "../../src/report/rollouts.ts";
import { renderTurns } from "../../src/report/transcript.ts";
import { expectSelfContained } from "./helpers/report-helpers.ts";

const tmp = () => fs.mkdtemp(path.join(os.tmpdir(), "marl-report-views-"));

/** Untrusted text as a model or tool might write it: markup, a closing </pre>, control characters. */
const EVIL = `<script>alert(1)</script></pre><b>x</b>&amp;"'\u0000\u0007\u001b[31m\u007f\u0085`;

/** No markup or control character from EVIL got through: it is all text. */
function expectInert(html: string) {
  expect(html).not.toContain("<script");
  expect(html).not.toContain("<b>x</b>");
  expect(html).toContain("&lt;script&gt;alert(1)&lt;/script&gt;&lt;/pre&gt;");
  expect(html).toContain("\\x00\\x07\\x1b[31m\\x7f\\x85");
  expect(html).not.toMatch(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/);
  expect(html.match(/<pre[ >]/g)?.length ?? 0).toBe(html.match(/<\/pre>/g)?.length ?? 0);
}

function turns(answer: string, opts: { call?: string; result?: string; error?: boolean; parseError?: string } = {}): TurnRecord[] {
  const out: TurnRecord[] = [];
  if (opts.call) {
    const text = `Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "${opts.call}"}}\n</tool_call>`;
    out.push({
      text,
      content: "Let me compute.",
      toolCalls: [{ name: "calculator", arguments: { expression: opts.call }, result: opts.result ?? "1", error: !!opts.error }],
      parseErrors: [],
      ended: true,
    });
  }
  out.push({ text: answer, content: answer, toolCalls: [], parseErrors: opts.parseError ? [opts.parseError] : [], ended: true });
  return out;
}

/** A trajectories.jsonl line in the format TrajectoryLog writes. */
function trajLine(step: number, p: number, i: number, reward: number, t: TurnRecord[], question = `What is ${p} + ${i}?`) {
  const n = 20 + i;
  return JSON.stringify({
    step,
    promptIndex: p,
    sampleIndex: i,
    promptText: `<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n${question}<|im_end|>\n<|im_start|>assistant\n`,
    completionText: t.map((x) => x.text).join("\n"),
    finishReason: "stop",
    truncated: false,
    reward,
    rewardComponents: { correctness: reward >= 1 ? 1 : 0, format: 1 },
    numToolCalls: t.reduce((a, x) => a + x.toolCalls.length, 0),
    numToolErrors: t.reduce((a, x) => a + x.toolCalls.filter((c) => c.error).length, 0),
    numParseErrors: 0,
    finalText: t[t.length - 1].content,
    turns: t,
    promptIds: [1, 2, 3],
    completionIds: Array.from({ length: n }, (_, k) => k),
    lossMask: Array.from({ length: n }, (_, k) => (k < 15 ? 1 : 0)),
    sampleLogprobs: Array(n).fill(-0.5),
  });
}

describe("charts", () => {
  it("draws bytes in MB and seconds with units, and collapses metrics that never move", () => {
    const records = Array.from({ length: 10 }, (_, s) => ({
      step: s + 1,
      time: s,
      reward: s / 10,
      reward_correctness: s % 2,
      loss: 1 / (s + 1),
      rss_bytes: 400e6 + s * 3e6,
      step_time: 2 + s / 10,
      kl: 0,
      clip_ratio: 0,
      rollout_tokens_per_s: 12000 + s * 500,
    }));
    const { charts, flat } = metricCharts(records);
    expect(charts[0]).toContain('aria-label="Reward (mean ± std)"'); // reward first
    expect(charts[1]).toContain('aria-label="Reward: correctness"'); // then its components
    expect(charts[2]).toContain('aria-label="Loss"');
    expect(charts.join("")).toContain('aria-label="Process memory, RSS (MB)"');
    expect(charts.join("")).toContain('aria-label="Step time (s)"');
    expect(charts.join("")).toContain('aria-label="Rollout throughput (tokens/s)"');
    // tick labels are short numbers: no run of zeros from raw byte counts
    const labels = [...charts.join("").matchAll(/class="yl">([^<]*)</g)].map((m) => m[1]);
    expect(labels.length).toBeGreaterThan(8);
    for (const l of labels) expect(l.length).toBeLessThanOrEqual(6);
    expect(flat).toEqual([
      "<li><b>kl</b>: 0 throughout (10 steps, 1–10)</li>",
      "<li><b>clip_ratio</b>: 0 throughout (10 steps, 1–10)</li>",
    ]);
    // what the model does comes first; speed and memory are folded away below
    const section = chartsSection(records);
    expect(section.indexOf("Reward (mean ± std)")).toBeLessThan(section.indexOf("<details><summary>Speed and memory (3 charts)</summary>"));
    expect(section.indexOf("<details>")).toBeLessThan(section.indexOf("Process memory, RSS (MB)"));
    expect(formatTick(12500)).toBe("12.5k");
    expect(formatTick(2_500_000)).toBe("2.5M");
    expect(formatTick(3e-5)).toBe("3e-5");
  });

  it("merges records logged for the same step (the final eval line) instead of dropping the step's metrics", () => {
    const html = renderTrainReport({
      title: "t",
      records: [
        { step: 1, time: 0, reward: 0.1 },
        { step: 2, time: 1, reward: 0.5 },
        { step: 2, time: 2, eval_accuracy: 0.7 },
      ],
    });
    expect(html).toContain('aria-label="Reward (mean ± std)"');
    expect(html).toContain("<li><b>eval_accuracy</b>: 0.7 (step 2 only)</li>");
    expect(html).toMatch(/<tr><th>reward<\/th><td class="n">0.5<\/td><td class="n">2<\/td>/);
  });
});

describe("GRPO rollout browser", () => {
  it("shows first, middle and last steps open, the first groups, best and worst outlined, advantages — bounded", async () => {
    const run = await tmp();
    await writeRunConfig(run, { scaleRewards: "group" }, "grpo");
    const log = new MetricsLogger(path.join(run, "metrics.jsonl"));
    const lines: string[] = [];
    const long = "x".repeat(2_000);
    for (let step = 1; step <= 21; step++) {
      log.log(step, { reward: step / 21, kl: 0 });
      for (let p = 0; p < 6; p++)
        for (let i = 0; i < 10; i++) {
          const reward = p === 1 ? 0.5 : i === 3 ? 1.2 : i === 7 ? -1 : 0.2; // group 1: all equal
          const t =
            step === 1 && p === 0 && i === 0
              ? turns(EVIL, { call: EVIL, result: EVIL, error: true, parseError: EVIL })
              : turns(`The answer is \\boxed{${i}}. ${long}`, { call: "2+3", result: "5" });
          lines.push(trajLine(step, p, i, reward, t, step === 1 && p === 0 ? EVIL : undefined));
        }
    }
    await fs.writeFile(path.join(run, "trajectories.jsonl"), lines.join("\n") + "\n");
    const bytes = (await fs.stat(path.join(run, "trajectories.jsonl"))).size;

    const sample = await readRolloutSample(path.join(run, "trajectories.jsonl"));
    expect(sample.allSteps).toHaveLength(21);
    expect(sample.steps.map((s) => s.step)).toEqual(pickSteps(sample.allSteps, 8));
    expect(sample.steps.map((s) => s.step)).toEqual(expect.arrayContaining([1, 11, 21]));
    expect(sample.steps.every((s) => s.groups.length === 4)).toBe(true);
    // advantages recomputed per whole group: (r - mean) / (std + 1e-4)
    const g0 = sample.steps[0].groups[0];
    const rs = g0.map((r) => r.reward!);
    const mu = rs.reduce((a, b) => a + b, 0) / rs.length;
    const sd = Math.sqrt(rs.reduce((a, b) => a + (b - mu) ** 2, 0) / (rs.length - 1)); // unbiased, as training uses
    expect(g0[3].advantage).toBeCloseTo((1.2 - mu) / (sd + 1e-4), 6);
    expect(sample.steps[0].groups[1].every((r) => r.advantage === 0)).toBe(true);

    const file = await writeReport(run, { title: "GRPO", rollouts: { maxChars: 600 } });
    const html = await fs.readFile(file, "utf8");
    expectSelfContained(html);
    expectInert(html);
    expect(html.match(/<details open>/g)).toHaveLength(3);
    expect(html.match(/<details[ >]/g)).toHaveLength(8);
    expect(html).toContain("<summary>step 1 ·");
    expect(html).toContain("<summary>step 21 ·");
    expect(html).toContain("questions 1–4 of 6 per step");
    expect(html).toContain("8 of 10 rollouts shown");
    // best (#3, reward 1.2) and worst (#7, reward -1) of each signal group outlined; the flat group says so
    expect(html.match(/<div class="ro best">/g)).toHaveLength(8 * 3);
    expect(html.match(/<div class="ro worst">/g)).toHaveLength(8 * 3);
    expect(html).toContain("all rewards equal: no learning signal");
    expect(html).toMatch(/<span class="tag ok">best<\/span>#3 · reward <b>1.2<\/b> \(correctness 1, format 1\) · advantage \+/);
    expect(html).toContain("23 tokens (15 sampled, 8 forced)");
    expect(html).toContain('<span class="call">&lt;tool_call&gt;');
    expect(html).toContain('<span class="res err"');
    expect(html).toContain("more characters in trajectories.jsonl");
    // bounded by the limits, not by the log: 8 steps × 4 groups × 8 rollouts × (600 characters + markup)
    expect(bytes).toBeGreaterThan(2.5e6);
    expect(html.length).toBeLessThan(8 * 4 * 8 * (600 + 1000));
    expect(html.length).toBeLessThan(bytes / 5);
  });
});

function sample(strict: boolean, o: Partial<QuestionSample> & { answer?: string } = {}): QuestionSample {
  const t = turns(o.answer ?? `\\boxed{${strict ? 7 : 8}}`, {
    call: "3+4",
    result: o.toolErrors ? "Error: bad" : "7",
    error: !!o.toolErrors,
  });
  return {
    text: "",
    finalText: "",
    strict,
    lenient: strict,
    formatValid: true,
    toolCalls: 1,
    toolErrors: 0,
    parseErrors: 0,
    truncated: false,
    turns: t,
    ...o,
  };
}

describe("evaluation report: per-question view", () => {
  const mk = (name: string, right: boolean[], extra: (qi: number) => Partial<QuestionSample> = () => ({})): ModelQuestions => ({
    name,
    questions: right.map((r, qi) => ({
      id: `q${qi}`,
      question: qi === 0 ? EVIL : `Question ${qi}?`,
      gold: "7",
      samples: [sample(r, extra(qi))],
    })),
  });

  it("puts every model's transcript side by side, with filters and exact counts, escaped", () => {
    const base = mk("base", [false, false, true, false, true], (qi) =>
      qi === 3 ? { formatValid: false } : qi === 0 ? { answer: EVIL } : {},
    );
    const sft = mk("sft", [true, false, false, true, true], (qi) => (qi === 1 ? { toolErrors: 1 } : {}));
    const rl = mk("rl", [true, true, true, true, false]);
    const html = renderEvalReport({
      title: "eval",
      rows: [
        { name: "base", n: 5, correct: 2 },
        { name: "sft", n: 5, correct: 3 },
        { name: "rl", n: 5, correct: 4 },
      ],
      questions: [base, sft, rl],
      compare: [
        ["sft", "base"],
        ["rl", "sft"],
      ],
    });
    expectSelfContained(html);
    expectInert(html);
    expect(html).toContain("all questions (5)</label>");
    expect(html).toContain("base → sft: wrong → right (2)</label>"); // q0, q3
    expect(html).toContain("base → sft: right → wrong (1)</label>"); // q2
    expect(html).toContain("sft → rl: wrong → right (2)</label>"); // q1, q2
    expect(html).toContain("sft → rl: right → wrong (1)</label>"); // q4
    expect(html).toContain("format failures (1)</label>");
    expect(html).toContain("tool errors or unparsed calls (1)</label>");
    expect(html).toContain('<div class="group qq up0 fmt">'); // q3
    expect(html).toContain('<div class="group qq up1 tool">'); // q1
    expect(html).toContain("#qf-up0:checked~.qs .qq:not(.up0){display:none}");
    expect(html.match(/<div class="group qq/g)).toHaveLength(5);
    expect(html.match(/<div class="cmp">/g)).toHaveLength(5);
    expect(html.match(/<div class="ro( miss)?"><div class="meta"><b>sft<\/b>/g)).toHaveLength(5);
    expect(html).toContain("question 2 · <code>q1</code> · gold <b>7</b> · base ✗ · sft ✗ · rl ✓");
  });

  it("shows at most maxQuestions, those a filter selects first, and says so", () => {
    const n = 50;
    const a = mk(
      "a",
      Array.from({ length: n }, (_, i) => i % 10 === 9),
    );
    const b = mk(
      "b",
      Array.from({ length: n }, () => false),
    );
    const html = renderEvalReport({ title: "e", rows: [], questions: [a, b], questionLimits: { maxQuestions: 8, maxChars: 100 } });
    expect(html.match(/<div class="group qq/g)).toHaveLength(8);
    expect(html).toContain("a → b: right → wrong (5)</label>");
    expect(html).toContain("all questions (50, 8 shown)</label>");
    expect(html).toContain("8 of 50 questions shown");
    for (const qi of [9, 19, 29, 39, 49]) expect(html).toContain(`<code>q${qi}</code>`);
    expect(html).toContain("more characters in samples-a.jsonl");
  });
});

describe("SFT report", () => {
  it("ends with a few held-out transcripts from eval.json, right and wrong", async () => {
    const run = await tmp();
    const log = new MetricsLogger(path.join(run, "metrics.jsonl"));
    for (let s = 1; s <= 5; s++) log.log(s, { loss: 2 / s, lr: 1e-3 });
    const samples = Array.from({ length: 10 }, (_, i) => ({
      id: `q${i}`,
      question: i === 0 ? EVIL : `Q${i}`,
      gold: "7",
      samples: [sample(i % 2 === 0, i === 0 ? { answer: EVIL } : {})],
    }));
    // an older eval.json stored only the flat text
    samples[9].samples[0] = { ...samples[9].samples[0], turns: undefined, text: `plain ${EVIL}` };
    await fs.writeFile(path.join(run, "eval.json"), JSON.stringify({ n: 10, samples }));
    const html = await fs.readFile(await writeReport(run, { title: "SFT" }), "utf8");
    expectSelfContained(html);
    expectInert(html);
    expect(html.indexOf('aria-label="Loss"')).toBeLessThan(html.indexOf("Held-out transcripts"));
    expect(html).toContain("the first 3 right and the first 3 wrong of the 10 questions");
    expect(html.match(/<div class="ro"><div class="meta"><span class="tag (ok|bad)">/g)).toHaveLength(6);
    expect(escapeHtml("a\tb\nc")).toBe("a\tb\nc");
  });
});

describe("transcripts", () => {
  it("show an environment's observation after the action's turn, as forced text, escaped", () => {
    const turn = {
      text: "Action: guess 50",
      content: "Action: guess 50",
      toolCalls: [],
      parseErrors: [],
      ended: true,
      action: "guess 50",
      observation: `higher ${EVIL}`,
      reward: 0.5,
    };
    const html = renderTurns([turn as TurnRecord]);
    expect(html).toContain(
      '<span class="res" title="forced tokens: what the environment answered, not sampled">observation (reward 0.5) → higher &lt;script&gt;',
    );
    expectInert(`<!DOCTYPE html>${html}`);
  });
});

describe("step sample", () => {
  it("spreads the steps evenly, first, middle and last always among them", () => {
    const steps = Array.from({ length: 24 }, (_, i) => i + 1);
    expect(pickSteps(steps, 8)).toEqual([1, 4, 8, 12, 14, 17, 21, 24]);
    expect(pickSteps(steps, 3)).toEqual([1, 12, 24]);
    expect(pickSteps(steps, 2)).toEqual([1, 24]);
    expect(pickSteps([5, 6], 8)).toEqual([5, 6]);
    for (let n = 1; n <= 40; n++)
      for (const max of [3, 5, 8]) {
        const s = Array.from({ length: n }, (_, i) => i * 10);
        const p = pickSteps(s, max);
        expect(p.length).toBe(Math.min(n, max));
        expect(new Set(p).size).toBe(p.length);
        expect(p).toEqual(expect.arrayContaining([s[0], s[Math.floor((n - 1) / 2)], s[n - 1]]));
      }
  });
});
