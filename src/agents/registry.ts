/** The tools the agent can call, by name. A tool module registers itself when imported
 *  (`import "./calculator.ts"`), so adding a tool is one new file; `--tools` picks from here
 *  (toolset.ts). Leaves out running calls (rollout/tool-messages.ts runToolCall) and argument
 *  validation against the JSON schema: each tool checks its own. */
import { toolSchema, type Tool } from "./types.ts";
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

function knownNames(list: readonly Tool[]): string {
  return list.length ? list.map((t) => t.name).join(", ") : "(none)";
}
