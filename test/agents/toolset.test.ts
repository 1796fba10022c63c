/** The run's tool set: specs, built-in tools, the limits every tool gets, the system prompt. */
import { afterAll, describe, expect, it } from "vitest";
import { calculatorTool, shutdownCalculator } from "../../src/agents/calculator.ts";
import { SYSTEM_PROMPT, systemPromptFor } from "../../src/agents/prompts.ts";
import { capText, limitTool, openTools, splitToolSpecs } from "../../src/agents/toolset.ts";
import { toToolResult, type Tool } from "../../src/agents/types.ts";
import { UsageError } from "../../src/util/errors.ts";

afterAll(() => shutdownCalculator());

const tool = (run: Tool["run"]): Tool => ({ name: "t", description: "a test tool", parameters: { type: "object", properties: {} }, run });

describe("tool specs", () => {
  it("splits on commas that start a spec", () => {
    expect(splitToolSpecs("calculator")).toEqual(["calculator"]);
    expect(splitToolSpecs("calculator, mcp:node server.js --x 1")).toEqual(["calculator", "mcp:node server.js --x 1"]);
    expect(splitToolSpecs("mcp:node s.js --list a=1,b=2,calculator")).toEqual(["mcp:node s.js --list a=1,b=2", "calculator"]);
    expect(() => splitToolSpecs("calculator,,x")).toThrow(UsageError);
  });
  it("a built-in name opens the registered tool; an unknown one is a usage error", async () => {
    const set = await openTools(["calculator"]);
    expect(set.tools.map((t) => t.name)).toEqual(["calculator"]);
    expect(await set.tools[0].run({ expression: "16-3-4" })).toEqual({ text: "9", isError: false });
    expect(set.tools[0].parameters).toBe(calculatorTool.parameters); // the <tools> block is unchanged
    await set.close();
    await expect(openTools(["nosuch"])).rejects.toThrow(/--tools: unknown tool "nosuch"; built in: calculator; or mcp:<command line>/);
    await expect(openTools(["calculator", "calculator"])).rejects.toThrow(/tool "calculator" from calculator clashes/);
    await expect(openTools(["mcp:"])).rejects.toThrow(/mcp: needs a command line/);
  });
});

describe("limits every tool gets", () => {
  it("a slow tool answers with an error at the time limit", async () => {
    const slow = limitTool(
      tool(() => new Promise((r) => setTimeout(() => r("late"), 5_000))),
      50,
      1000,
    );
    expect(await slow.run({})).toEqual({ text: 'Error: tool "t" took longer than 0.05 s', isError: true });
  });
  it("a throwing or non-text tool resolves to an error", async () => {
    expect(
      await limitTool(
        tool(async () => {
          throw new Error("boom");
        }),
        1000,
        1000,
      ).run({}),
    ).toEqual({ text: 'Error: tool "t" failed (boom)', isError: true });
    expect(
      await limitTool(
        tool(async () => 3 as unknown as string),
        1000,
        1000,
      ).run({}),
    ).toEqual({ text: 'Error: tool "t" returned no text', isError: true });
  });
  it("a tool's own isError decides; a plain string is an error when it starts with Error", async () => {
    expect(
      await limitTool(
        tool(async () => ({ text: "ERROR 42 in the log", isError: false })),
        1000,
        1000,
      ).run({}),
    ).toEqual({ text: "ERROR 42 in the log", isError: false });
    expect(
      await limitTool(
        tool(async () => ({ text: "no such file", isError: true })),
        1000,
        1000,
      ).run({}),
    ).toEqual({ text: "no such file", isError: true });
    expect(
      await limitTool(
        tool(async () => "Error: bad input"),
        1000,
        1000,
      ).run({}),
    ).toEqual({ text: "Error: bad input", isError: true });
  });
  it("long output is cut with a visible marker", async () => {
    expect(capText("x".repeat(150), 100)).toBe(`${"x".repeat(100)}\n[truncated: 50 of 150 characters not shown]`);
    expect(capText("short", 100)).toBe("short");
    expect(
      toToolResult(
        await limitTool(
          tool(async () => "y".repeat(250)),
          1000,
          200,
        ).run({}),
      )!.text,
    ).toMatch(/^y{200}\n\[truncated: 50 of 250/);
  });
});

describe("system prompt", () => {
  it("the calculator alone gives the calculator agent's prompt; others add a sentence each", () => {
    expect(systemPromptFor([calculatorTool])).toBe(SYSTEM_PROMPT);
    expect(systemPromptFor([calculatorTool, tool(async () => "")], "answer", "exact")).toBe(
      "Solve the task step by step. Use the calculator tool for arithmetic. Use the t tool (a test tool). Put the final answer in <answer></answer>.",
    );
    expect(systemPromptFor([])).toBe("Solve the math problem step by step. Put the final answer in \\boxed{}.");
  });
});
