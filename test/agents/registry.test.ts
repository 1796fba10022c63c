import { describe, expect, it } from "vitest";
import { getTool, listTools, registerTool, runToolCall, toolSchemas } from "../../src/agents/registry.ts";
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
  run: async () => {
    throw new Error("disk on fire");
  },
};

describe("tool registry", () => {
  registerTool(echo);
  registerTool(broken);

  it("registers, lists and finds tools; re-registering the same tool is a no-op", () => {
    registerTool(echo);
    expect(getTool("echo")).toBe(echo);
    expect(getTool("nope")).toBeUndefined();
    expect(listTools().map((t) => t.name)).toEqual(["echo", "broken"]);
  });

  it("refuses a second tool under a taken name and invalid names", () => {
    expect(() => registerTool({ ...echo })).toThrow('a different tool named "echo" is already registered');
    expect(() => registerTool({ ...echo, name: "has space" })).toThrow(/tool name "has space" is invalid/);
  });

  it("gives schemas in the chat template's shape, for chosen tools or all", () => {
    expect(toolSchemas(["echo"])).toEqual([
      { type: "function", function: { name: "echo", description: "Repeat the text", parameters: echo.parameters } },
    ]);
    expect(toolSchemas().map((s) => s.function.name)).toEqual(["echo", "broken"]);
    expect(() => toolSchemas(["calculator"])).toThrow('unknown tool "calculator"; registered tools: echo, broken');
  });

  it("runs a call and marks the tool's own Error replies", async () => {
    expect(await runToolCall({ name: "echo", arguments: { text: "hi" } })).toEqual({ text: "hi", error: false });
    expect(await runToolCall({ name: "echo", arguments: {} })).toEqual({ text: "Error: missing text", error: true });
  });

  it("never throws: unknown tools name the known ones, a rejecting tool becomes an error text", async () => {
    expect(await runToolCall({ name: "python", arguments: {} })).toEqual({ text: 'Error: unknown tool "python"; known tools: echo, broken', error: true });
    expect(await runToolCall({ name: "echo", arguments: { text: "x" } }, [broken])).toEqual({
      text: 'Error: unknown tool "echo"; known tools: broken',
      error: true,
    });
    expect(await runToolCall({ name: "broken", arguments: {} })).toEqual({ text: 'Error: tool "broken" failed (disk on fire)', error: true });
    expect(await runToolCall({ name: "x", arguments: {} }, [])).toEqual({ text: 'Error: unknown tool "x"; known tools: (none)', error: true });
  });
});
