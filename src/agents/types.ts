/** A tool the agent can call. A second tool is a new file that exports one of these and registers
 *  itself; nothing else changes. run() always resolves (never rejects) to short text for the model. */
import type { ToolSchema } from "../model/types.ts";

export interface Tool {
  name: string;
  description: string;
  parameters: Record<string, unknown>; // JSON schema, rendered into the chat template's <tools>
  run(args: Record<string, unknown>): Promise<string>;
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
