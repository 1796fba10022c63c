/** A tool the agent can call. A second tool is a new file that exports one of these and registers
 *  itself; nothing else changes. run() always resolves (never rejects) to short text for the model,
 *  and says whether the tool failed. */
import type { ToolSchema } from "../model/types.ts";

/** What one call gives back. `isError` decides what counts as a tool error (MCP's flag, carried
 *  through); a plain string is the built-in tools' form, an error when it starts with "Error". */
export type ToolOutput = string | ToolResult;
export interface ToolResult {
  text: string;
  isError: boolean;
}

/** A run()'s value as a ToolResult, or null when it is neither a string nor a ToolResult. */
export function toToolResult(out: unknown): ToolResult | null {
  if (typeof out === "string") return { text: out, isError: /^error\b/i.test(out.trimStart()) };
  const r = out as ToolResult | null;
  return r && typeof r === "object" && typeof r.text === "string" ? { text: r.text, isError: r.isError === true } : null;
}

export interface Tool {
  name: string;
  description: string;
  parameters: Record<string, unknown>; // JSON schema, rendered into the chat template's <tools>
  run(args: Record<string, unknown>): Promise<ToolOutput>;
  /** The system prompt's sentence about this tool (default: its name and description). */
  promptHint?: string;
  /** The tool bounds each call's own time itself (the calculator: 250 ms of evaluation in a sandbox),
   *  so the tool set's --tool_timeout is not laid on top: waiting behind other calls or for a worker
   *  restart is not the call's time, and would make results depend on machine load. */
  limitsOwnTime?: boolean;
  /** Gets the tool ready (starts a worker), so the first call's time limit is not spent starting up. */
  start?(): Promise<void>;
  /** Frees what the tool holds (a worker, a server connection); the tool set calls it once at the end. */
  close?(): Promise<void>;
}

export function toolSchema(tool: Tool): ToolSchema {
  return { type: "function", function: { name: tool.name, description: tool.description, parameters: tool.parameters } };
}

/** One tool call parsed from an assistant turn. */
export interface ParsedToolCall {
  name: string;
  arguments: Record<string, unknown>;
}
/** Result of parsing one assistant turn: well-formed calls and the errors of malformed ones. */
export interface ParsedTurn {
  content: string; // text outside the <tool_call> blocks
  calls: ParsedToolCall[];
  errors: string[]; // one short message per malformed block (goes back to the model as a tool message)
}
