import { describe, expect, it } from "vitest";
import { getTool, listTools, registerTool, toolSchemas } from "../../src/agents/registry.ts";
import type { Tool } from "../../src/agents/types.ts";

const echo: Tool = {
  name: "echo",
  description: "Repeat the text",
  parameters: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
  run: async (args) => (typeof args.text === "string" ? args.text : "Error: missing text"),
};
const broken: Tool = { name: "broken", description: "Breaks its contract", parameters: { type: "object", properties: {} }, run: async () => "" };

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
});
