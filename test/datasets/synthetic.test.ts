import { evaluate } from "mathjs";
import { describe, expect, it } from "vitest";
import { parseGold } from "../../src/datasets/answer.ts";
import { parseAnnotations } from "../../src/datasets/annotations.ts";
import { toConversation } from "../../src/agents/sft.ts";
import { generateSynthetic, type SynthOp } from "../../src/datasets/synthetic.ts";

function checkFormat(ex: { question: string; answer: string; gold: string }, maxValue = 999_999) {
  const lines = ex.answer.split("\n");
  expect(lines.at(-1)).toBe(`#### ${ex.gold}`);
  expect(parseGold(ex.answer)).toBe(ex.gold);
  const anns = parseAnnotations(ex.answer);
  expect(anns.length).toBe(lines.length - 1); // one annotation per solution line
  const questionNumbers = (ex.question.match(/\d+/g) ?? []).map(Number);
  let prev: number | null = null;
  for (const a of anns) {
    const value = evaluate(a.expression) as number;
    expect(String(value)).toBe(a.result); // the annotation is right
    expect(Number.isInteger(value) && value > 0 && value <= maxValue).toBe(true);
    // GSM8K style: the result is repeated right after the annotation.
    expect(ex.answer.slice(a.end).startsWith(a.result)).toBe(true);
    const [x, y] = a.expression.split(/[+\-*/]/).map(Number);
    if (prev !== null)
      expect(x).toBe(prev); // each step works on the amount so far...
    else expect(questionNumbers).toContain(x);
    expect(questionNumbers).toContain(y); // ...and a number the question gives
    prev = value;
  }
  expect(String(prev)).toBe(ex.gold); // #### equals the last result
}

describe("generateSynthetic", () => {
  it("is deterministic per seed and differs across seeds", () => {
    const a = generateSynthetic({ n: 50, seed: 7 });
    expect(generateSynthetic({ n: 50, seed: 7 })).toEqual(a);
    const b = generateSynthetic({ n: 50, seed: 8 });
    expect(b.map((e) => e.question)).not.toEqual(a.map((e) => e.question));
    // A longer run starts with the same problems: examples depend on seed and index only.
    expect(generateSynthetic({ n: 60, seed: 7 }).slice(0, 50)).toEqual(a);
    expect(a[3].id).toBe("synthetic-7-3");
  });

  it("every problem is valid GSM8K format with correct annotations", () => {
    for (const ex of generateSynthetic({ n: 400, seed: 1 })) checkFormat(ex);
  });

  it("covers 1-4 steps and all four operations; numbers need a calculator", () => {
    const xs = generateSynthetic({ n: 400, seed: 2 });
    const steps = new Set(xs.map((e) => parseAnnotations(e.answer).length));
    expect([...steps].sort()).toEqual([1, 2, 3, 4]);
    const ops = new Set(xs.flatMap((e) => parseAnnotations(e.answer).map((a) => a.expression.match(/[+\-*/]/)![0])));
    expect([...ops].sort()).toEqual(["*", "+", "-", "/"]);
    const products = xs.flatMap((e) => parseAnnotations(e.answer)).filter((a) => a.expression.includes("*"));
    expect(products.some((a) => a.result.length >= 5)).toBe(true);
    expect(xs.every((e) => /^(\w+ (buys|has|shares) )/.test(e.question) && e.question.endsWith("?"))).toBe(true);
  });

  it("honours steps, operand, value and operation knobs", () => {
    const only = (ops: SynthOp[]) =>
      generateSynthetic({ n: 100, seed: 3, ops, minSteps: 2, maxSteps: 3, maxOperand: 99, maxValue: 50_000 });
    for (const ops of [["+"], ["-"], ["*"], ["/"], ["*", "/"]] as SynthOp[][]) {
      for (const ex of only(ops)) {
        checkFormat(ex, 50_000);
        const anns = parseAnnotations(ex.answer);
        expect(anns.length).toBeGreaterThanOrEqual(2);
        expect(anns.length).toBeLessThanOrEqual(3);
        for (const a of anns) expect(ops).toContain(a.expression.match(/[+\-*/]/)![0]);
      }
    }
    const first = generateSynthetic({ n: 100, seed: 4, ops: ["+"], minOperand: 100, maxOperand: 999, maxSteps: 1 });
    for (const ex of first)
      for (const n of parseAnnotations(ex.answer)[0].expression.split("+").map(Number)) expect(n >= 100 && n <= 999).toBe(true);
  });

  it("converts to a tool-calling conversation like real GSM8K", () => {
    const [ex] = generateSynthetic({ n: 1, seed: 5, minSteps: 3, maxSteps: 3, ops: ["+", "-"] });
    const conv = toConversation(ex);
    expect(conv.filter((m) => m.role === "tool")).toHaveLength(3);
    expect(conv.at(-1)!.content.endsWith(`The answer is \\boxed{${ex.gold}}.`)).toBe(true);
  });

  it("rejects bad options with the value and what is accepted", () => {
    expect(() => generateSynthetic({ n: -1, seed: 0 })).toThrow(/n -1 must be an integer >= 0/);
    expect(() => generateSynthetic({ n: 1, seed: 0, minSteps: 3, maxSteps: 2 })).toThrow(
      /steps 3\.\.2: need 1 <= minSteps <= maxSteps <= 8/,
    );
    expect(() => generateSynthetic({ n: 1, seed: 0, maxSteps: 9 })).toThrow(/<= 8/);
    expect(() => generateSynthetic({ n: 1, seed: 0, ops: ["%" as SynthOp] })).toThrow(/ops \[%\] must be a non-empty subset of \+ - \* \//);
    expect(() => generateSynthetic({ n: 1, seed: 0, ops: [] })).toThrow(/non-empty subset/);
    expect(() => generateSynthetic({ n: 1, seed: 0, minOperand: 50, maxOperand: 20 })).toThrow(/need minOperand < maxOperand/);
    expect(() => generateSynthetic({ n: 1, seed: 0, maxValue: 1000 })).toThrow(/maxValue 1000 must be at least 1998/);
    // Five products cannot stay under 2,000 with operands from 12: 12*12*2*2*2*2 > 2000.
    expect(() => generateSynthetic({ n: 1, seed: 0, ops: ["*"], minSteps: 5, maxSteps: 5, maxOperand: 20, maxValue: 2000 })).toThrow(
      /cannot make 5 steps with ops \[\*\] under maxValue 2000/,
    );
  });
});
