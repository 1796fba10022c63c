import { describe, expect, it } from "vitest";
import { answersMatch, answerValue, extractAnswer, lastNumber, normalizeNumber, parseGold } from "../../src/datasets/answer.ts";

describe("parseGold", () => {
  it.each([
    ["Some work.\n#### 72", "72"],
    ["#### 1,000", "1000"],
    ["#### 109,200,000", "109200000"],
    ["#### -3", "-3"],
    ["#### 0.5", "0.5"],
    ["#### .5", "0.5"],
    ["#### $18", "18"],
    ["#### 12.0", "12"],
    ["#### 12.50", "12.5"],
    ["#### 007", "7"],
    ["#### -0", "0"],
    ["#### 12345678901234567890", "12345678901234567890"], // beyond 2^53: stays exact
    ["a #### 3 then\n#### 4\n", "4"], // the last #### wins
  ])("%j -> %s", (text, gold) => expect(parseGold(text)).toBe(gold));

  it("rejects a missing #### line and a non-number", () => {
    expect(() => parseGold("just text")).toThrow(/no "#### N" line/);
    expect(() => parseGold("#### twelve")).toThrow(/holds "twelve", expected one number/);
    expect(() => parseGold("#### 1,00")).toThrow(/holds "1,00"/);
    expect(() => parseGold("#### 3/4")).toThrow(/expected one number/);
  });
});

describe("normalizeNumber", () => {
  it("canonicalises plain numbers and refuses anything else", () => {
    expect(normalizeNumber("+3")).toBe("3");
    expect(normalizeNumber("-$5")).toBe("-5");
    expect(normalizeNumber("\\$5")).toBe("5");
    expect(normalizeNumber("5.")).toBe("5");
    expect(normalizeNumber("0.000")).toBe("0");
    expect(normalizeNumber(".")).toBeNull();
    expect(normalizeNumber("")).toBeNull();
    expect(normalizeNumber("1e5")).toBeNull();
    expect(normalizeNumber("12,34")).toBeNull();
  });
});

describe("extractAnswer", () => {
  it("boxed: the last one, nested braces, unclosed and empty give null", () => {
    expect(extractAnswer("first \\boxed{3} then \\boxed{ 18 }.", "boxed")).toBe("18");
    expect(extractAnswer("The answer is \\boxed{\\frac{3}{4}}.", "boxed")).toBe("\\frac{3}{4}");
    expect(extractAnswer("The answer is \\boxed{12", "boxed")).toBeNull();
    expect(extractAnswer("The answer is \\boxed{}", "boxed")).toBeNull();
    expect(extractAnswer("The answer is 12", "boxed")).toBeNull();
  });
  it("gsm8k: rest of the line after the last ####", () => {
    expect(extractAnswer("work\n#### 1,000\nextra", "gsm8k")).toBe("1,000");
    expect(extractAnswer("#### 1\n#### 2", "gsm8k")).toBe("2");
    expect(extractAnswer("no marker", "gsm8k")).toBeNull();
    expect(extractAnswer("####   \n", "gsm8k")).toBeNull();
  });
  it("answer: the last closed pair", () => {
    expect(extractAnswer("<answer>1</answer> and <answer> 42 </answer>", "answer")).toBe("42");
    expect(extractAnswer("<answer>42", "answer")).toBeNull();
    expect(extractAnswer("42</answer>", "answer")).toBeNull();
  });
  it("rejects an unknown format", () => {
    expect(() => extractAnswer("x", "latex" as never)).toThrow(
      /unknown answer schema "latex", expected one of boxed, answer, gsm8k, last_number/,
    );
  });
});

describe("lastNumber", () => {
  it.each([
    ["So she has 1,200 apples.", "1200"],
    ["She pays $12.50 in total.", "12.5"],
    ["16-3-4=9", "9"],
    ["pages 12-15", "15"], // a hyphen between numbers is not a minus sign
    ["The temperature is -3 degrees", "-3"],
    ["It is .5 of the cake", "0.5"],
    ["no digits here", null],
    ["ends with 7.", "7"],
  ])("%j -> %s", (text, want) => expect(lastNumber(text)).toBe(want));
});

describe("answersMatch", () => {
  it.each([
    ["18", "18"],
    ["18.0", "18"],
    ["18.", "18"],
    ["$18", "18"],
    ["\\$18", "18"],
    ["1,000", "1000"],
    ["18 dollars", "18"],
    ["18 \\text{ apples}", "18"],
    ["50%", "50"],
    ["50\\%", "50"],
    ["3/4", "0.75"],
    ["\\frac{3}{4}", "0.75"],
    ["\\dfrac{3}{4}", "0.75"],
    ["0.3333333", "0.33333333"], // within 1e-6 relative
    ["-5", "-5"],
    ["12345678.5", "12345678"], // 4e-8 relative apart
  ])("%j matches %j", (pred, gold) => expect(answersMatch(pred, gold)).toBe(true));

  it.each([
    ["17", "18"],
    ["0.333", "0.33333333"],
    ["-18", "18"],
    ["3 apples and 4 pears", "3"],
    ["twelve", "12"],
    ["", "0"],
    ["1/0", "0"],
    ["0", "0.0000001"],
  ])("%j does not match %j", (pred, gold) => expect(answersMatch(pred, gold)).toBe(false));

  it("null prediction never matches", () => expect(answersMatch(null, "0")).toBe(false));
  it("answerValue reads fractions and refuses two numbers", () => {
    expect(answerValue("7/2 cups")).toBe(3.5);
    expect(answerValue("1 3/4")).toBeNull();
  });
});
