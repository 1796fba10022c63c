/** Rows carry their group from the engine to the update: scoring places each rollout by its
 *  (promptIndex, sampleIndex), not by the order the engine returned them in, and the update's
 *  rollouts carry the task as their group. */
import { describe, expect, it } from "vitest";
import type { Task } from "../../src/datasets/tasks.ts";
import { newTrajectory } from "../../src/rollout/episode.ts";
import type { Trajectory } from "../../src/rollout/types.ts";
import { grpoRollouts, scoreStep } from "../../src/run/grpo-step.ts";

const tasks: Task[] = [
  { id: "t-0", question: "2+3?", answer: "#### 5", gold: "5" },
  { id: "t-1", question: "4+4?", answer: "#### 8", gold: "8" },
];
// Task 0: samples answer 5, 4, 5; task 1: 8, 8, and one the environment failed.
const answers = [
  ["5", "4", "5"],
  ["8", "8", null],
];

/** A finished rollout of task p, sample g: prompt ids [p], completion ids [100p + g] (so a row is known by its ids). */
function row(p: number, g: number): Trajectory {
  const t = newTrajectory(p, g, [p]);
  const a = answers[p][g];
  return {
    ...t,
    completionIds: [100 * p + g],
    lossMask: [1],
    sampleLogprobs: [-0.5],
    finalText: a === null ? "" : `\\boxed{${a}}`,
    finishReason: a === null ? "env_error" : "stop",
  };
}

const ordered = [0, 1].flatMap((p) => [0, 1, 2].map((g) => row(p, g)));
const score = (rows: Trajectory[]) => scoreStep(rows, tasks, { rewardWeights: { correctness: 1 }, scale: "none" });

describe("rows carry their group", () => {
  it("gives each row its own group's advantage, whatever order the engine returned the rows in", () => {
    const shuffled = [4, 0, 5, 2, 1, 3].map((i) => ordered[i]);
    const a = score(ordered),
      b = score(shuffled);
    // task 0: rewards 1, 0, 1 → mean 2/3; task 1: 1, 1 counted (the failed row is left out) → 0
    expect(b.advantages).toEqual(a.advantages);
    expect(a.advantages.map((g) => g.map((x) => Math.round(x * 1e6) / 1e6))).toEqual([
      [0.333333, -0.666667, 0.333333],
      [0, 0, 0],
    ]);
    expect(b.counted).toEqual([
      [true, true, true],
      [true, true, false],
    ]);
    expect(b.rewards).toEqual([
      [1, 0, 1],
      [1, 1],
    ]);
    // the scored copies stay in the engine's order (the log's), each with its own reward
    expect(b.trajs.map((t) => [t.promptIndex, t.sampleIndex, t.reward])).toEqual(
      shuffled.map((t) => [t.promptIndex, t.sampleIndex, ["5", "8"].includes(answers[t.promptIndex][t.sampleIndex]!) ? 1 : 0]),
    );
    // the update's rows: the failed one left out, each with its task as its group and its own advantage
    const update = grpoRollouts(b, true);
    expect(update.map((r) => [r.ids, r.group, r.advantage])).toEqual(
      shuffled
        .filter((t) => t.finishReason !== "env_error")
        .map((t) => [[t.promptIndex, 100 * t.promptIndex + t.sampleIndex], t.promptIndex, a.advantages[t.promptIndex][t.sampleIndex]]),
    );
    expect(update[0]).toMatchObject({ lossMask: [0, 1], behaviourLogprobs: [NaN, -0.5], truncated: false });
  });

  it("rejects a row without a place of its own and a group missing a sample, naming them", () => {
    expect(() => score([...ordered, row(0, 1)])).toThrow(/rollout of task 0, sample 1 has no place of its own among 2 tasks/);
    expect(() => score([...ordered, { ...row(0, 0), promptIndex: 2 }])).toThrow(/rollout of task 2, sample 0 has no place/);
    expect(() => score(ordered.filter((t) => !(t.promptIndex === 1 && t.sampleIndex === 1)))).toThrow(
      /task 1 is missing rollouts: it has samples \[0, 2\]/,
    );
    expect(() => score(ordered.filter((t) => t.promptIndex === 0))).toThrow(/task 1 is missing rollouts: it has samples \[\]/);
  });
});
