import { describe, expect, it } from "vitest";
import { DEFAULT_REWARD_WEIGHTS, parseRewardWeights, scoreRollout, type RolloutForReward } from "../../src/rollout/rewards.ts";

const base: RolloutForReward = { finalText: "", numToolCalls: 0, numToolErrors: 0, numParseErrors: 0, truncated: false };
const roll = (over: Partial<RolloutForReward>): RolloutForReward => ({ ...base, ...over });

describe("scoreRollout", () => {
  const w = { correctness: 1, format: 0.5, tool_use: 0.25 };

  it("right, well formed, tool used well: every component 1", () => {
    const s = scoreRollout(roll({ finalText: "So 5 + 4 = 9.\nThe answer is \\boxed{9}.", numToolCalls: 2 }), "9", w);
    expect(s.components).toEqual({ correctness: 1, format: 1, tool_use: 1 });
    expect(s.reward).toBeCloseTo(1.75, 12);
  });

  it("the right number outside \\boxed{} earns no correctness and fails format", () => {
    const s = scoreRollout(roll({ finalText: "The answer is 9." }), "9", w);
    expect(s.components).toEqual({ correctness: 0, format: 0, tool_use: 0 });
    expect(s.reward).toBe(0);
  });

  it("wrong boxed answer is well formed but not correct", () => {
    const s = scoreRollout(roll({ finalText: "\\boxed{8}" }), "9", w);
    expect(s.components).toEqual({ correctness: 0, format: 1, tool_use: 0 });
    expect(s.reward).toBeCloseTo(0.5, 12);
  });

  it("a malformed tool call or truncation fails format; correctness still counts", () => {
    const bad = scoreRollout(roll({ finalText: "\\boxed{9}", numToolCalls: 1, numParseErrors: 1 }), "9", w);
    expect(bad.components).toEqual({ correctness: 1, format: 0, tool_use: 0.5 });
    expect(bad.reward).toBeCloseTo(1 + 0.25 * 0.5, 12);
    const cut = scoreRollout(roll({ finalText: "\\boxed{9}", truncated: true }), "9", w);
    expect(cut.components.format).toBe(0);
    expect(cut.components.correctness).toBe(1);
  });

  it("tool_use: calls that error reduce it, only failures give a negative value", () => {
    expect(scoreRollout(roll({ numToolCalls: 4, numToolErrors: 1 }), "1", w).components.tool_use).toBeCloseTo(0.75, 12);
    expect(scoreRollout(roll({ numParseErrors: 2 }), "1", w).components.tool_use).toBe(-1);
  });

  it("the last \\boxed{} is the answer and comparison is numeric", () => {
    expect(scoreRollout(roll({ finalText: "\\boxed{3} no, \\boxed{1,000}" }), "1000", w).components.correctness).toBe(1);
    expect(scoreRollout(roll({ finalText: "\\boxed{1,000} no, \\boxed{3}" }), "1000", w).components.correctness).toBe(0);
  });

  it("default weights and unknown names", () => {
    const s = scoreRollout(roll({ finalText: "\\boxed{2}" }), "2");
    expect(s.reward).toBeCloseTo(DEFAULT_REWARD_WEIGHTS.correctness + DEFAULT_REWARD_WEIGHTS.format, 12);
    expect(() => scoreRollout(base, "1", { corectness: 1 })).toThrow(
      /unknown reward component "corectness", expected one of correctness, format, tool_use, env/,
    );
  });
});

describe("parseRewardWeights", () => {
  it("parses and fills unnamed components with 0", () => {
    expect(parseRewardWeights("correctness=1,format=0.1")).toEqual({ correctness: 1, format: 0.1, tool_use: 0, env: 0 });
    expect(parseRewardWeights(" tool_use = -0.5 , correctness=2 ")).toEqual({ correctness: 2, format: 0, tool_use: -0.5, env: 0 });
  });
  it("clear errors", () => {
    expect(() => parseRewardWeights("length=1")).toThrow(/unknown reward component "length"/);
    expect(() => parseRewardWeights("constructor=1")).toThrow(/unknown reward component "constructor"/);
    expect(() => parseRewardWeights("correctness")).toThrow(/"correctness" is not NAME=NUMBER/);
    expect(() => parseRewardWeights("correctness=abc")).toThrow(/correctness="abc" is not a finite number/);
    expect(() => parseRewardWeights("format=1,format=2")).toThrow(/"format" is given twice/);
    expect(() => parseRewardWeights("")).toThrow(/name no component/);
  });
});
