import { afterAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import { calculatorTool, shutdownCalculator } from "../../src/agents/calculator.ts";
import {
  checkAnnotations,
  extractAnnotations,
  matchesAnnotated,
  plainArithmetic,
  type Annotation,
} from "../../scripts/lib/calculator-check.ts";

afterAll(() => shutdownCalculator());

describe("plain-arithmetic reference", () => {
  it("evaluates + - * / and parentheses left to right in float64", () => {
    expect(plainArithmetic("16-3-4")).toBe(9);
    expect(plainArithmetic("2+3*4")).toBe(14);
    expect(plainArithmetic("(2+3)*4")).toBe(20);
    expect(plainArithmetic("100/10/5")).toBe(2);
    expect(plainArithmetic("-3*-2")).toBe(6);
    expect(plainArithmetic(".05*104000")).toBe(0.05 * 104000);
    expect(plainArithmetic("0.1+0.2")).toBe(0.1 + 0.2);
    expect(plainArithmetic("12.")).toBe(12);
  });
  it("says null for anything else", () => {
    for (const s of ["560//10", "2^3", "2(3)", "1.2.3", "(1+2", "1+", "x*2", "3%", ""]) expect(plainArithmetic(s), s).toBeNull();
  });
});

describe("annotation matching", () => {
  it("extracts <<expr=result>> in order", () => {
    expect(extractAnnotations("a <<1+2=3>>3 b <<3/4=3/4>> c <<oops>>")).toEqual([
      { expr: "1+2", result: "3" },
      { expr: "3/4", result: "3/4" },
      { expr: "oops", result: "" },
    ]);
  });
  it("accepts results rounded to the digits shown, nothing looser", () => {
    expect(matchesAnnotated(100 / 3, "33.33")).toBe(true);
    expect(matchesAnnotated(100 / 3, "33.3")).toBe(true);
    expect(matchesAnnotated(100 / 3, "33.34")).toBe(false);
    expect(matchesAnnotated(48, "46")).toBe(false);
    expect(matchesAnnotated(1000, "1,000")).toBe(true);
    expect(matchesAnnotated(0.75, "3/4")).toBe(false);
  });
});

describe("checkAnnotations on a GSM8K-format fixture", () => {
  it("agrees with plain arithmetic on every plain annotation and finds the planted disagreements", async () => {
    const text = await fs.readFile(new URL("../fixtures/agents/gsm8k-annotations.jsonl", import.meta.url), "utf8");
    const annotations: Annotation[] = text
      .split("\n")
      .filter((l) => l.trim())
      .flatMap((l) => extractAnnotations((JSON.parse(l) as { answer: string }).answer));
    const r = await checkAnnotations(annotations, (expression) => calculatorTool.run({ expression }));
    expect(r.total).toBe(31);
    expect(r.plainArithmetic).toBe(30); // all but 560//10
    expect(r.calculatorMatchesPlain).toBe(30);
    expect(r.calculatorMismatchesPlain).toEqual([]);
    expect(r.agreeWithAnnotation).toBe(28);
    expect(r.disagreeWithAnnotation).toBe(3);
    expect(r.disagreeExamples.map((e) => [e.expr, e.annotated, e.why])).toEqual([
      ["3/4", "3/4", "annotated result is not a number"],
      ["560//10", "56", "calculator refused the expression"],
      ["12*4", "46", "annotated result differs (rounded or wrong in the data)"],
    ]);
  });

  it("flags a calculator that disagrees with plain arithmetic", async () => {
    const r = await checkAnnotations(
      [
        { expr: "0.1+0.2", result: "0.3" },
        { expr: "2*3", result: "6" },
      ],
      async (e) => (e === "2*3" ? "7" : "0.3"),
    );
    expect(r.calculatorMatchesPlain).toBe(1);
    expect(r.calculatorMismatchesPlain.map((e) => e.expr)).toEqual(["2*3"]);
  });
});
