import { describe, expect, it } from "vitest";
import { parseToolCalls } from "../../src/agents/toolcall.ts";

const calc = (expression: string) => ({ name: "calculator", arguments: { expression } });

describe("parseToolCalls", () => {
  it("parses Qwen2.5's rendering of one call, with the text before it as content", () => {
    const turn = 'Janet sells 16 - 3 - 4 = \n<tool_call>\n{"name": "calculator", "arguments": {"expression": "16-3-4"}}\n</tool_call>';
    expect(parseToolCalls(turn)).toEqual({ content: "Janet sells 16 - 3 - 4 =", calls: [calc("16-3-4")], errors: [] });
  });

  it("returns plain text with no calls unchanged apart from trimming", () => {
    expect(parseToolCalls("  9 eggs. The answer is \\boxed{18}.\n")).toEqual({
      content: "9 eggs. The answer is \\boxed{18}.",
      calls: [],
      errors: [],
    });
    expect(parseToolCalls("")).toEqual({ content: "", calls: [], errors: [] });
  });

  it("accepts whitespace variants, a JSON-string arguments field and a ```json fence", () => {
    const turn =
      '<tool_call>{"name":"calculator","arguments":{"expression":"1+1"}}</tool_call>' +
      '<tool_call>\n\n   {"name": "calculator",\n "arguments": "{\\"expression\\": \\"2*3\\"}"}  \n</tool_call>' +
      '<tool_call>\n```json\n{"name": "calculator", "arguments": {"expression": "7/2"}}\n```\n</tool_call>';
    const r = parseToolCalls(turn);
    expect(r.errors).toEqual([]);
    expect(r.calls).toEqual([calc("1+1"), calc("2*3"), calc("7/2")]);
    expect(r.content).toBe("");
  });

  it("keeps several calls in order and joins the text between them", () => {
    const turn =
      'First 3*4 = \n<tool_call>\n{"name": "calculator", "arguments": {"expression": "3*4"}}\n</tool_call>\n' +
      'then 12+5 = \n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12+5"}}\n</tool_call>';
    const r = parseToolCalls(turn);
    expect(r.calls).toEqual([calc("3*4"), calc("12+5")]);
    expect(r.content).toBe("First 3*4 = \n\nthen 12+5 =");
  });

  it("parses unknown tool names (the registry decides) and keeps other argument types", () => {
    const r = parseToolCalls('<tool_call>\n{"name": "web_search", "arguments": {"query": "eggs", "n": 3}}\n</tool_call>');
    expect(r.calls).toEqual([{ name: "web_search", arguments: { query: "eggs", n: 3 } }]);
  });

  it("reports each malformed block with a short error and still parses the good ones", () => {
    const turn = [
      "Let me compute.",
      '<tool_call>\n{"name": "calculator", "arguments": {"expression": "16-3-4"}\n</tool_call>', // missing }
      '<tool_call>\n{"arguments": {"expression": "1+1"}}\n</tool_call>', // no name
      '<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>', // empty name
      '<tool_call>\n{"name": 7, "arguments": {}}\n</tool_call>', // name not a string
      '<tool_call>\n{"name": "calculator"}\n</tool_call>', // no arguments
      '<tool_call>\n{"name": "calculator", "arguments": "16-3-4"}\n</tool_call>', // string, not JSON
      '<tool_call>\n{"name": "calculator", "arguments": [1, 2]}\n</tool_call>', // array
      '<tool_call>\n["calculator", "1+1"]\n</tool_call>', // not an object
      "<tool_call>\n\n</tool_call>", // empty
      '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>', // fine
      "calculator(16-3-4)", // plain text, not a call
    ].join("\n");
    const r = parseToolCalls(turn);
    expect(r.calls).toEqual([calc("2+2")]);
    expect(r.errors).toEqual([
      'Error: tool call is not valid JSON: "{\\"name\\": \\"calculator\\", \\"arguments\\": {\\"ex…"',
      'Error: tool call has no "name" string',
      'Error: tool call has no "name" string, got string',
      'Error: tool call has no "name" string, got number',
      'Error: tool call to "calculator" has no "arguments" object',
      'Error: "arguments" of "calculator" is a string that is not valid JSON: "16-3-4"',
      'Error: "arguments" of "calculator" must be a JSON object, got an array',
      "Error: tool call must be a JSON object, got an array",
      'Error: empty tool call; write {"name": ..., "arguments": {...}}',
    ]);
    expect(r.content).toBe("Let me compute.\n" + "\n".repeat(10) + "calculator(16-3-4)");
    for (const e of r.errors) expect(e.length).toBeLessThan(120);
  });

  it("reports a <tool_call> left open at the end of the text (generation stopped mid-call)", () => {
    const r = parseToolCalls('So 5*6 = \n<tool_call>\n{"name": "calculator", "arguments": {"expr');
    expect(r).toEqual({ content: "So 5*6 =", calls: [], errors: ["Error: <tool_call> is not closed with </tool_call>"] });
  });

  it("treats a block re-opened before it closes as unclosed, then parses the inner block", () => {
    const r = parseToolCalls(
      '<tool_call>\n{"name": "calculator", <tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>',
    );
    expect(r.calls).toEqual([calc("1+2")]);
    expect(r.errors).toEqual(["Error: <tool_call> is not closed with </tool_call>"]);
  });

  it("reports a stray </tool_call> and keeps the text around it", () => {
    const r = parseToolCalls('{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call> done');
    expect(r.calls).toEqual([]);
    expect(r.errors).toEqual(["Error: </tool_call> without a matching <tool_call>"]);
    expect(r.content).toBe('{"name": "calculator", "arguments": {"expression": "1+2"}}\n done');
  });

  it("survives garbage and hostile text without throwing", () => {
    const garbage = [
      "<tool_call><tool_call></tool_call></tool_call>",
      "</tool_call></tool_call><tool_call>",
      '<tool_call>{"name": "calculator", "arguments": {"__proto__": {"polluted": 1}, "expression": "1"}}</tool_call>',
      "<tool_call>" + "{".repeat(5000) + "</tool_call>",
      "<tool_call>\u0000\uFFFF\uD800</tool_call>",
      "<|im_start|>assistant\n<tool_call>null</tool_call><|im_end|>",
    ];
    for (const g of garbage) {
      const r = parseToolCalls(g);
      expect(Array.isArray(r.calls) && Array.isArray(r.errors) && typeof r.content === "string").toBe(true);
    }
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    expect(parseToolCalls(garbage[0]).errors).toHaveLength(3); // unclosed, empty, stray close
    expect(parseToolCalls(garbage[5])).toEqual({
      content: "<|im_start|>assistant\n<|im_end|>",
      calls: [],
      errors: ["Error: tool call must be a JSON object, got null"],
    });
  });
});
