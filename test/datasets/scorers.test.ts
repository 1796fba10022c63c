/** Answer schemas, the scorer registry, the one judge shared by reward and eval, and task files. */
import { describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { extractAnswer } from "../../src/datasets/answer.ts";
import { isTaskFile, loadTasks } from "../../src/datasets/tasks.ts";
import { scoreRollout } from "../../src/rollout/rewards.ts";
import { getScorer, judgeRollout, registerScorer, score, scorerNames } from "../../src/datasets/scorers.ts";
import type { Trajectory } from "../../src/rollout/types.ts";
import { judge } from "../../src/run/evaluate.ts";
import { loadExamples } from "../../src/run/data.ts";

describe("answer schemas", () => {
  it("boxed: the last \\boxed{} or \\fbox{}, nested braces kept", () => {
    expect(extractAnswer("\\boxed{1} then \\fbox{2}", "boxed")).toBe("2");
    expect(extractAnswer("\\fbox{1} then \\boxed{ {3}/{4} }", "boxed")).toBe("{3}/{4}");
    expect(extractAnswer("\\boxed{\\frac{1}{2}}", "boxed")).toBe("\\frac{1}{2}");
    expect(extractAnswer("\\fbox{7", "boxed")).toBeNull();
  });
  it("answer, gsm8k and last_number", () => {
    expect(extractAnswer("<answer>no</answer> <answer> Paris </answer>", "answer")).toBe("Paris");
    expect(extractAnswer("so\n#### 1,200\n", "gsm8k")).toBe("1,200");
    expect(extractAnswer("3 apples and 1,200 pears.", "last_number")).toBe("1200");
    expect(extractAnswer("no numbers", "last_number")).toBeNull();
  });
});

describe("scorers", () => {
  it("math: numeric equality forgiving formatting", () => {
    expect(score("$1,000.00", { gold: "1000" })).toBe(1);
    expect(score("\\frac{3}{4}", { gold: "0.75" })).toBe(1);
    expect(score("999", { gold: "1000" })).toBe(0);
    expect(score(null, { gold: "1" })).toBe(0);
  });
  it("exact: whitespace-insensitive equality; contains: case-insensitive substring", () => {
    expect(score("  New   York ", { gold: "New York", scorer: "exact" })).toBe(1);
    expect(score("new york", { gold: "New York", scorer: "exact" })).toBe(0);
    expect(score("It is in New York City", { gold: "new york", scorer: "contains" })).toBe(1);
    expect(score("Boston", { gold: "new york", scorer: "contains" })).toBe(0);
    expect(score(null, { gold: "x", scorer: "contains" })).toBe(0);
  });
  it("user scorers: registered once, clamped to [0, 1], a throwing one scores 0", () => {
    registerScorer("length_ratio", (a, gold) => (a ?? "").length / gold.length);
    expect(scorerNames()).toContain("length_ratio");
    expect(score("ab", { gold: "abcd", scorer: "length_ratio" })).toBe(0.5);
    expect(score("abcdefgh", { gold: "abcd", scorer: "length_ratio" })).toBe(1);
    registerScorer("throws", () => {
      throw new Error("boom");
    });
    expect(score("x", { gold: "y", scorer: "throws" })).toBe(0);
    expect(() => registerScorer("math", () => 1)).toThrow(/already registered/);
    expect(() => getScorer("nosuch")).toThrow(/unknown scorer "nosuch", expected one of math, exact, contains/);
  });
});

const traj = (over: Partial<Trajectory>): Trajectory => ({
  promptIndex: 0,
  sampleIndex: 0,
  promptIds: [],
  completionIds: [],
  lossMask: [],
  sampleLogprobs: [],
  turns: [],
  finalText: "",
  finishReason: "stop",
  truncated: false,
  numToolCalls: 0,
  numToolErrors: 0,
  numParseErrors: 0,
  numUnknownTools: 0,
  ...over,
});

describe("reward and eval agree", () => {
  const rollouts: Trajectory[] = [
    traj({ finalText: "So \\boxed{42}." }),
    traj({ finalText: "So \\boxed{41}." }),
    traj({ finalText: "The answer is 42." }),
    traj({ finalText: "\\boxed{42}", truncated: true, finishReason: "length" }),
    traj({ finalText: "\\boxed{42}", numParseErrors: 1 }),
    traj({ finalText: "\\boxed{42}", numToolCalls: 1, numToolErrors: 1, numUnknownTools: 1 }), // called a tool the run lacks
    traj({ finalText: "<answer>42</answer>" }),
  ];
  it.each([
    [{ gold: "42" }],
    [{ gold: "42", answerSchema: "answer" as const }],
    [{ gold: "42", scorer: "exact", answerSchema: "last_number" as const }],
  ])("correctness = strict and format = formatValid on the same rollouts (%j)", (task) => {
    for (const t of rollouts) {
      const reward = scoreRollout(t, task, { correctness: 1, format: 0, tool_use: 0 });
      const sample = judge(t, { id: "q", question: "q", answer: task.gold, ...task });
      expect(reward.components.correctness === 1).toBe(sample.strict);
      expect(reward.components.format === 1).toBe(sample.formatValid);
    }
  });
  it("an unknown tool fails format in both", () => {
    const t = rollouts[5];
    expect(judgeRollout(t, { gold: "42" }).formatValid).toBe(false);
    expect(scoreRollout(t, "42").components.format).toBe(0);
  });
});

describe("task files", () => {
  it("AgentRL JSONL: id, query, answer, optional scorer and answer_schema; through --dataset", async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), "marl-tasks-"));
    const file = path.join(dir, "tasks.jsonl");
    await fs.writeFile(
      file,
      [
        JSON.stringify({ id: "a", query: "2+3?", answer: 5 }),
        JSON.stringify({ id: "b", query: "Capital of France?", answer: "Paris", scorer: "exact", answer_schema: "answer" }),
        "",
      ].join("\n"),
    );
    expect(await isTaskFile(file)).toBe(true);
    const tasks = await loadExamples({ dataset: file, purpose: "rl" });
    expect(tasks).toEqual([
      { id: "a", question: "2+3?", answer: "5", gold: "5" },
      { id: "b", question: "Capital of France?", answer: "Paris", gold: "Paris", scorer: "exact", answerSchema: "answer" },
    ]);
    const bad = path.join(dir, "bad.jsonl");
    await fs.writeFile(bad, JSON.stringify({ query: "q", answer: "1", scorer: "fuzzy" }) + "\n");
    await expect(loadTasks(bad)).rejects.toThrow(/line 1: scorer "fuzzy" is unknown; registered: math, exact, contains/);
    await fs.writeFile(bad, JSON.stringify({ query: "q", answer: "1", answer_schema: "latex" }) + "\n");
    await expect(loadExamples({ dataset: bad, purpose: "rl" })).rejects.toThrow(
      /answer_schema "latex" is unknown; expected one of boxed, answer, gsm8k, last_number/,
    );
    const gsm = path.join(dir, "gsm.jsonl");
    await fs.writeFile(gsm, JSON.stringify({ question: "q", answer: "#### 1" }) + "\n");
    expect(await isTaskFile(gsm)).toBe(false);
    await fs.rm(dir, { recursive: true });
  });
});
