/** The tools the agent can call, by name. A tool module registers itself when imported
 *  (`import "./calculator.ts"`), so adding a tool is one new file. runToolCall turns a parsed call
 *  into the text of the tool message and never throws: a bad call is something for the model to read,
 *  not a crash. Leaves out argument validation against the JSON schema: each tool checks its own. */
import { toolSchema, type ParsedToolCall, type Tool } from "./types.ts";
import type { ToolSchema } from "../model/types.ts";

const tools = new Map<string, Tool>();

/** Add a tool. Registering the same object twice is a no-op; a different tool under a taken name is an error. */
export function registerTool(tool: Tool): void {
  if (typeof tool?.name !== "string" || !/^[A-Za-z_][A-Za-z0-9_-]*$/.test(tool.name))
    throw new Error(`tool name ${JSON.stringify(tool?.name)} is invalid; use letters, digits, _ and - (e.g. "calculator")`);
  const existing = tools.get(tool.name);
  if (existing && existing !== tool) throw new Error(`a different tool named "${tool.name}" is already registered`);
  tools.set(tool.name, tool);
}

export function getTool(name: string): Tool | undefined {
  return tools.get(name);
}

/** Registered tools in registration order. */
export function listTools(): Tool[] {
  return [...tools.values()];
}

/** Schemas for the chat template's <tools> block: the named tools in the given order, or all. */
export function toolSchemas(names?: string[]): ToolSchema[] {
  const chosen = names ?? [...tools.keys()];
  return chosen.map((name) => {
    const tool = tools.get(name);
    if (!tool) throw new Error(`unknown tool "${name}"; registered tools: ${knownNames(listTools())}`);
    return toolSchema(tool);
  });
}

/** Run one parsed call against the allowed tools (default: all registered). The tool's own "Error: ..."
 *  replies count as errors too, so callers can count failed calls. */
export async function runToolCall(call: ParsedToolCall, allowed: readonly Tool[] = listTools()): Promise<{ text: string; error: boolean }> {
  const tool = allowed.find((t) => t.name === call?.name);
  if (!tool) {
    const name = typeof call?.name === "string" ? call.name.slice(0, 40) : String(call?.name);
    return { text: `Error: unknown tool "${name}"; known tools: ${knownNames(allowed)}`, error: true };
  }
  try {
    const text = await tool.run(call.arguments ?? {});
    if (typeof text !== "string") return { text: `Error: tool "${tool.name}" returned no text`, error: true };
    return { text, error: text.startsWith("Error") };
  } catch (e) {
    // The Tool contract says run() never rejects; if one does anyway, the model still gets a reply.
    return { text: `Error: tool "${tool.name}" failed (${String((e as Error)?.message ?? e).slice(0, 80)})`, error: true };
  }
}

function knownNames(list: readonly Tool[]): string {
  return list.length ? list.map((t) => t.name).join(", ") : "(none)";
}
