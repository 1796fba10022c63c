/** runToolCall: the one place a parsed call becomes a tool message's text and a record. */
import { describe, expect, it } from "vitest";
import type { Tool } from "../../src/agents/types.ts";
import { runToolCall } from "../../src/rollout/tool-messages.ts";

const tool = (name: string, run: Tool["run"]): Tool => ({ name, description: name, parameters: { type: "object", properties: {} }, run });
const echo = tool("echo", async (args) => (typeof args.text === "string" ? args.text : "Error: missing text"));
const tools = (...list: Tool[]) => new Map(list.map((t) => [t.name, t]));

describe("runToolCall", () => {
  it("runs a call and marks the tool's own Error replies", async () => {
    expect(await runToolCall({ name: "echo", arguments: { text: "hi" } }, tools(echo))).toEqual({
      name: "echo",
      arguments: { text: "hi" },
      result: "hi",
      error: false,
    });
    expect(await runToolCall({ name: "echo", arguments: {} }, tools(echo))).toMatchObject({ result: "Error: missing text", error: true });
  });

  it("a tool's isError decides (MCP's flag): text that starts with ERROR can be a success", async () => {
    const log = tool("read_log", async () => ({ text: "ERROR disk full at 12:00", isError: false }));
    const missing = tool("read_missing", async () => ({ text: "no such file", isError: true }));
    expect(await runToolCall({ name: "read_log", arguments: {} }, tools(log))).toMatchObject({
      result: "ERROR disk full at 12:00",
      error: false,
    });
    expect(await runToolCall({ name: "read_missing", arguments: {} }, tools(missing))).toMatchObject({
      result: "no such file",
      error: true,
    });
  });

  it("never rejects: unknown tools name the known ones; a throwing tool or one without text becomes error text", async () => {
    expect(await runToolCall({ name: "python", arguments: {} }, tools(echo))).toMatchObject({
      result: 'Error: unknown tool "python"; known tools: echo',
      error: true,
    });
    expect(await runToolCall({ name: "x", arguments: {} }, tools())).toMatchObject({
      result: 'Error: unknown tool "x"; known tools: (none)',
      error: true,
    });
    const huge = tool("huge", async () => {
      throw new Error("disk on fire " + "!".repeat(10_000));
    });
    const r = await runToolCall({ name: "huge", arguments: {} }, tools(huge));
    expect(r).toMatchObject({ error: true });
    expect(r.result).toMatch(/^Error: tool "huge" failed: disk on fire !+$/);
    expect(r.result.length).toBeLessThan(300); // the message is untrusted text: cut
    const silent = tool("silent", async () => undefined as unknown as string);
    expect(await runToolCall({ name: "silent", arguments: {} }, tools(silent))).toMatchObject({
      result: 'Error: tool "silent" returned no text',
      error: true,
    });
  });
});
