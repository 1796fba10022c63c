import { describe, expect, it } from "vitest";
import { BUILTIN_TOOLS, defaultTools, toolTable } from "../../src/agents/builtin.ts";
import { calculatorTool } from "../../src/agents/calculator.ts";
import type { Tool } from "../../src/agents/types.ts";

const echo: Tool = {
  name: "echo",
  description: "Repeat the text",
  parameters: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
  run: async (args) => (typeof args.text === "string" ? args.text : "Error: missing text"),
};
const broken: Tool = {
  name: "broken",
  description: "Breaks its contract",
  parameters: { type: "object", properties: {} },
  run: async () => "",
};

describe("tool table", () => {
  const table = toolTable([echo, broken, echo]);

  it("lists and finds tools; the same tool twice is listed once", () => {
    expect(table.get("echo")).toBe(echo);
    expect(table.get("nope")).toBeUndefined();
    expect(table.list().map((t) => t.name)).toEqual(["echo", "broken"]);
  });

  it("refuses a second tool under a taken name and invalid names", () => {
    expect(() => toolTable([echo, { ...echo }])).toThrow('a different tool named "echo" is already registered');
    expect(() => toolTable([{ ...echo, name: "has space" }])).toThrow(/tool name "has space" is invalid/);
  });

  it("gives schemas in the chat template's shape, for chosen tools or all", () => {
    expect(table.schemas(["echo"])).toEqual([
      { type: "function", function: { name: "echo", description: "Repeat the text", parameters: echo.parameters } },
    ]);
    expect(table.schemas().map((s) => s.function.name)).toEqual(["echo", "broken"]);
    expect(() => table.schemas(["calculator"])).toThrow('unknown tool "calculator"; registered tools: echo, broken');
  });

  it("the built-in table holds the calculator, which is also the default", () => {
    expect(BUILTIN_TOOLS.list()).toEqual([calculatorTool]);
    expect(defaultTools()).toEqual([calculatorTool]);
  });
});
