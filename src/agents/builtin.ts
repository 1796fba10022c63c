/** The built-in tools, in one explicit table, and the default tool set. `--tools` picks built-in tools
 *  by name from here (toolset.ts), beside MCP servers; adding a built-in tool is its file plus one
 *  entry in BUILTIN_TOOLS. Leaves out running calls (rollout/tool-messages.ts runToolCall) and argument
 *  validation against the JSON schema: each tool checks its own. */
import type { ToolSchema } from "../model/types.ts";
import { calculatorTool } from "./calculator.ts";
import { toolSchema, type Tool } from "./types.ts";

/** Tools by name, in the order given. */
export interface ToolTable {
  get(name: string): Tool | undefined;
  list(): Tool[];
  /** Schemas for the chat template's <tools> block: the named tools in the given order, or all. */
  schemas(names?: string[]): ToolSchema[];
}

/** A table of `tools`. The same object twice is listed once; a different tool under a taken name, or
 *  an invalid name, is an error. */
export function toolTable(tools: readonly Tool[]): ToolTable {
  const byName = new Map<string, Tool>();
  for (const tool of tools) {
    if (typeof tool?.name !== "string" || !/^[A-Za-z_][A-Za-z0-9_-]*$/.test(tool.name))
      throw new Error(`tool name ${JSON.stringify(tool?.name)} is invalid; use letters, digits, _ and - (e.g. "calculator")`);
    const existing = byName.get(tool.name);
    if (existing && existing !== tool) throw new Error(`a different tool named "${tool.name}" is already registered`);
    byName.set(tool.name, tool);
  }
  const list = () => [...byName.values()];
  return {
    get: (name) => byName.get(name),
    list,
    schemas: (names) =>
      (names ?? [...byName.keys()]).map((name) => {
        const tool = byName.get(name);
        if (!tool)
          throw new Error(
            `unknown tool "${name}"; registered tools: ${
              list()
                .map((t) => t.name)
                .join(", ") || "(none)"
            }`,
          );
        return toolSchema(tool);
      }),
  };
}

export const BUILTIN_TOOLS = toolTable([calculatorTool]);

/** The tools of a run that names none (`--tools` default). */
export const DEFAULT_TOOLS: readonly string[] = ["calculator"];

/** The default tools themselves, for code that runs them without opening a tool set (chat's prompt). */
export const defaultTools = (): Tool[] => DEFAULT_TOOLS.map((name) => BUILTIN_TOOLS.get(name)!);
