import { describe, expect, it } from "vitest";
import { normalizeExpression, parseAnnotations } from "../../src/datasets/annotations.ts";
import { buildSftConversations, compareResults, operators, toConversation, verifyConversation } from "../../src/agents/sft.ts";
import { SYSTEM_PROMPT, toPrompt } from "../../src/agents/prompts.ts";
import type { Gsm8kExample } from "../../src/datasets/gsm8k.ts";
import { parseGold } from "../../src/datasets/answer.ts";

const ex = (answer: string, id = "t-0"): Gsm8kExample => ({ id, question: "Q?", answer, gold: parseGold(answer) });

// A stand-in calculator: a fixed table, so the test says exactly what the tool answers.
function tableTool(table: Record<string, string>) {
  const calls: string[] = [];
  return {
    calls,
    name: "calculator",
    run: async (args: Record<string, unknown>) => {
      const e = String(args.expression);
      calls.push(e);
      return table[e] ?? `Error: cannot evaluate ${e}`;
    },
  };
}

describe("annotations", () => {
  it("finds each <<expr=result>> with its span", () => {
    const text = "Natalia sold 48/2 = <<48/2=24>>24 clips.\nThen 48+24 = <<48+24=72>>72.";
    const anns = parseAnnotations(text);
    expect(anns.map((a) => [a.expression, a.result])).toEqual([
      ["48/2", "24"],
      ["48+24", "72"],
    ]);
    expect(text.slice(anns[0].start, anns[0].end)).toBe("<<48/2=24>>");
    expect(() => parseAnnotations("bad <<48/2>>")).toThrow(/annotation "<<48\/2>>" is not "<<expression=result>>"/);
    expect(() => parseAnnotations("bad <<=3>>")).toThrow(/is not "<<expression=result>>"/);
  });
  it.each([
    ["560//10", "560/10"],
    ["$12 x 3", "12 * 3"],
    ["2×3÷4", "2*3/4"],
    ["1,000,000*2", "1000000*2"],
    ["2**3", "2^3"],
    ["(1.5+2) * .5", "(1.5+2) * .5"],
  ])("normalizeExpression(%j) = %j", (raw, want) => expect(normalizeExpression(raw)).toBe(want));
});

describe("toConversation", () => {
  it("splits at each annotation into call, tool result, continuation; #### becomes \\boxed{}", () => {
    const conv = toConversation(
      ex("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72"),
    );
    expect(conv.slice(0, 2)).toEqual(toPrompt("Q?"));
    expect(conv[0].content).toBe(SYSTEM_PROMPT);
    const call = (e: string) => [{ type: "function", function: { name: "calculator", arguments: { expression: e } } }];
    expect(conv.slice(2)).toEqual([
      { role: "assistant", content: "Natalia sold 48/2 =", tool_calls: call("48/2") },
      { role: "tool", content: "24" },
      { role: "assistant", content: "24 clips in May.\nNatalia sold 48+24 =", tool_calls: call("48+24") },
      { role: "tool", content: "72" },
      { role: "assistant", content: "72 clips altogether.\nThe answer is \\boxed{72}." },
    ]);
  });

  it("inline steps keep GSM8K's text without the annotation and join the next turn", () => {
    const answer = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72";
    const call = (e: string) => [{ type: "function", function: { name: "calculator", arguments: { expression: e } } }];
    expect(toConversation(ex(answer), { inline: (_, step) => step === 0 }).slice(2)).toEqual([
      { role: "assistant", content: "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 =", tool_calls: call("48+24") },
      { role: "tool", content: "72" },
      { role: "assistant", content: "72 clips altogether.\nThe answer is \\boxed{72}." },
    ]);
    expect(toConversation(ex(answer), { inline: (_, step) => step === 1 }).slice(4)).toEqual([
      { role: "assistant", content: "24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\nThe answer is \\boxed{72}." },
    ]);
    expect(toConversation(ex(answer), { inline: () => true }).slice(2)).toEqual([
      {
        role: "assistant",
        content: "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\nThe answer is \\boxed{72}.",
      },
    ]);
  });

  it("keeps $ before the annotation in the text, normalises the tool message and the gold", () => {
    const conv = toConversation(ex("She earned 0.2 x 50 = $<<0.2*50=10.0>>10.\n#### 10.0"));
    expect(conv[2]).toMatchObject({
      content: "She earned 0.2 x 50 = $",
      tool_calls: [{ function: { arguments: { expression: "0.2*50" } } }],
    });
    expect(conv[3]).toEqual({ role: "tool", content: "10" });
    expect(conv[4].content).toBe("10.\nThe answer is \\boxed{10}.");
  });

  it("no annotation: one assistant turn; adjacent annotations give an empty-content call turn", () => {
    expect(toConversation(ex("She has none.\n#### 0")).slice(2)).toEqual([
      { role: "assistant", content: "She has none.\nThe answer is \\boxed{0}." },
    ]);
    const conv = toConversation(ex("<<2*3=6>><<6+1=7>>7\n#### 7"));
    expect(conv.slice(2).map((m) => [m.role, m.content])).toEqual([
      ["assistant", ""],
      ["tool", "6"],
      ["assistant", ""],
      ["tool", "7"],
      ["assistant", "7\nThe answer is \\boxed{7}."],
    ]);
  });

  it("a solution that is only the #### line", () => {
    expect(toConversation(ex("#### 5")).at(-1)).toEqual({ role: "assistant", content: "The answer is \\boxed{5}." });
  });
});

describe("verification against the calculator", () => {
  it("compareResults categories", () => {
    expect(compareResults("24", "24")).toBe("ok");
    expect(compareResults("0.4", "0.40")).toBe("format");
    expect(compareResults("3/4", "0.75")).toBe("format");
    expect(compareResults("3/5", "0.75")).toBe("wrong");
    expect(compareResults("about 3", "3")).toBe("wrong");
    expect(compareResults("3.33", "3.3333333333")).toBe("rounded");
    expect(compareResults("3", "3.35")).toBe("rounded");
    expect(compareResults("3.3", "3.35")).toBe("rounded"); // cut, not rounded
    expect(compareResults("-2", "-2.5")).toBe("rounded");
    expect(compareResults("3.4", "3.3333")).toBe("wrong");
    expect(compareResults("25", "24")).toBe("wrong");
    expect(compareResults("24", "Error: division by zero")).toBe("error");
  });

  it("verifyConversation re-runs every call with the tool given", async () => {
    const conv = toConversation(ex("a <<48/2=24>>24 b <<10/3=3.33>>3.33 c <<2+2=5>>5\n#### 5"));
    const tool = tableTool({ "48/2": "24", "10/3": "3.3333333333", "2+2": "4" });
    const checks = await verifyConversation(conv, tool);
    expect(tool.calls).toEqual(["48/2", "10/3", "2+2"]);
    expect(checks.map((c) => c.status)).toEqual(["ok", "rounded", "wrong"]);
    expect(checks[2]).toEqual({ expression: "2+2", annotated: "5", computed: "4", status: "wrong" });
    await expect(verifyConversation(conv, { ...tool, name: "search" })).rejects.toThrow(
      /calls tool "calculator", but the tool given is "search"/,
    );
  });

  it("buildSftConversations: calculator text in tool messages, wrong/failed examples dropped with counts", async () => {
    const tool = tableTool({ "1/2": "0.5", "10/3": "3.3333333333", "2+2": "4", "3*3": "9" });
    const built = await buildSftConversations(
      [
        ex("half is <<1/2=.5>>.5\n#### .5", "a"),
        ex("about <<10/3=3.33>>3.33 hours\n#### 3.33", "b"),
        ex("so <<2+2=5>>5\n#### 5", "c"),
        ex("so <<7/0=0>>0\n#### 0", "d"),
        ex("so <<3*3=9>>9\n#### 9", "e"),
      ],
      tool,
    );
    expect(built.ids).toEqual(["a", "b", "e"]);
    expect(built.dropped.map((d) => d.id)).toEqual(["c", "d"]);
    expect(built.counts).toEqual({ ok: 2, format: 0, rounded: 1, wrong: 1, error: 1 });
    expect(built.mismatches.map((m) => [m.id, m.kept, m.check.status])).toEqual([
      ["b", true, "rounded"],
      ["c", false, "wrong"],
      ["d", false, "error"],
    ]);
    expect(built.conversations[1][3]).toEqual({ role: "tool", content: "3.3333333333" });
    expect(built.conversations[1][4].content).toBe("3.33 hours\nThe answer is \\boxed{3.33}.");
  });

  it("buildSftConversations inlineShare: that share of steps, seeded, without calling the tool for them", async () => {
    const answers = Array.from({ length: 200 }, (_, i) =>
      ex(`a <<${i}+1=${i + 1}>>${i + 1} b <<${i + 1}*2=${2 * i + 2}>>${2 * i + 2}\n#### ${2 * i + 2}`, `x${i}`),
    );
    const table: Record<string, string> = {};
    for (let i = 0; i < 200; i++) Object.assign(table, { [`${i}+1`]: String(i + 1), [`${i + 1}*2`]: String(2 * i + 2) });
    let tool = tableTool(table);
    const build = (share: number, seed: number) => buildSftConversations(answers, (tool = tableTool(table)), { inlineShare: share, seed });
    const calls = (b: Awaited<ReturnType<typeof build>>) => b.conversations.reduce((n, c) => n + c.filter((m) => m.tool_calls).length, 0);
    const none = await build(0, 0);
    expect(calls(none)).toBe(400);
    const half = await build(0.3, 7);
    expect(calls(half)).toBeGreaterThan(400 * 0.6);
    expect(calls(half)).toBeLessThan(400 * 0.8);
    expect(half.counts.ok).toBe(calls(half)); // only the calls left are checked
    expect(half.inlined + calls(half)).toBe(400);
    expect(tool.calls).toHaveLength(calls(half)); // inlined steps never reach the tool
    expect(half.conversations).toEqual((await build(0.3, 7)).conversations);
    expect(half.conversations).not.toEqual((await build(0.3, 8)).conversations);
    expect(calls(await build(1, 0))).toBe(0);
    await expect(build(1.5, 0)).rejects.toThrow(/inline share 1.5 must be between 0 and 1/);
  });

  it("buildSftConversations inlineOps: only steps made of those operators are written inline", async () => {
    const tool = tableTool({ "12+3": "15", "15*4": "60" });
    const answers = Array.from({ length: 20 }, (_, i) => ex("a <<12+3=15>>15 b <<15*4=60>>60\n#### 60", `x${i}`));
    const built = await buildSftConversations(answers, tool, { inlineShare: 1, inlineOps: ["+", "-"] });
    for (const conv of built.conversations)
      expect(conv.slice(2).map((m) => m.tool_calls?.[0].function.arguments)).toEqual([{ expression: "15*4" }, undefined, undefined]);
    expect(built.conversations[0][2].content).toBe("a 15 b");
    await expect(buildSftConversations(answers, tool, { inlineShare: 1, inlineOps: ["+", "sqrt"] })).rejects.toThrow(
      /inline ops \[sqrt\] not known/,
    );
  });

  it.each([
    ["48/2", ["/"]],
    ["(3+4)*2", ["+", "*"]],
    ["12 x 3", ["*"]],
    ["7", []],
  ])("operators(%j) = %j", (e, want) => expect(operators(e)).toEqual(want));
});
