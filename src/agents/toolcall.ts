/** Parse an assistant turn in Qwen2.5's (Hermes-style) tool-call format:
 *
 *    <tool_call>
 *    {"name": "calculator", "arguments": {"expression": "16-3-4"}}
 *    </tool_call>
 *
 *  The text is model-written, so anything goes: every malformed block becomes one short entry in
 *  `errors` (sent back to the model as a tool message) instead of an exception. Lenient where the
 *  meaning is plain — any whitespace around the JSON, a ```json fence around it, `arguments` given as
 *  a JSON-encoded string — and strict otherwise. Leaves out whether the tool exists (the registry's
 *  business) and checking arguments against the tool's schema (the tool's). */
import type { ParsedToolCall, ParsedTurn } from "./types.ts";

const OPEN = "<tool_call>";
const CLOSE = "</tool_call>";
const MAX_SHOWN = 40; // characters of model text quoted back in an error

export function parseToolCalls(text: string): ParsedTurn {
  const calls: ParsedToolCall[] = [];
  const errors: string[] = [];
  const outside: string[] = [];
  let pos = 0;
  while (pos < text.length) {
    const open = text.indexOf(OPEN, pos);
    const strayClose = text.indexOf(CLOSE, pos);
    if (strayClose !== -1 && (open === -1 || strayClose < open)) {
      // A </tool_call> with no opening tag: the text before it is not a call, so keep it as content.
      outside.push(text.slice(pos, strayClose));
      errors.push(`Error: ${CLOSE} without a matching ${OPEN}`);
      pos = strayClose + CLOSE.length;
      continue;
    }
    if (open === -1) {
      outside.push(text.slice(pos));
      break;
    }
    outside.push(text.slice(pos, open));
    const bodyStart = open + OPEN.length;
    const close = text.indexOf(CLOSE, bodyStart);
    const reopen = text.indexOf(OPEN, bodyStart);
    if (close === -1 || (reopen !== -1 && reopen < close)) {
      // Unclosed: either the text ends (generation stopped mid-call) or a new block starts first.
      errors.push(`Error: ${OPEN} is not closed with ${CLOSE}`);
      pos = reopen !== -1 && (close === -1 || reopen < close) ? reopen : text.length;
      continue;
    }
    const parsed = parseBody(text.slice(bodyStart, close));
    if ("error" in parsed) errors.push(parsed.error);
    else calls.push(parsed);
    pos = close + CLOSE.length;
  }
  return { content: outside.join("").trim(), calls, errors };
}

/** One block's inside: a JSON object with a string `name` and an object (or JSON-string) `arguments`. */
function parseBody(raw: string): ParsedToolCall | { error: string } {
  let body = raw.trim();
  const fenced = /^```(?:json)?\s*([\s\S]*?)\s*```$/.exec(body);
  if (fenced) body = fenced[1];
  if (body === "") return { error: 'Error: empty tool call; write {"name": ..., "arguments": {...}}' };
  let value: unknown;
  try {
    value = JSON.parse(body);
  } catch {
    return { error: `Error: tool call is not valid JSON: ${quote(body)}` };
  }
  if (!isObject(value)) return { error: `Error: tool call must be a JSON object, got ${kind(value)}` };
  const { name } = value;
  if (typeof name !== "string" || name.trim() === "")
    return { error: `Error: tool call has no "name" string${name === undefined ? "" : `, got ${kind(name)}`}` };
  let args = value.arguments;
  if (args === undefined) return { error: `Error: tool call to "${clip(name)}" has no "arguments" object` };
  if (typeof args === "string") {
    // Some models (and OpenAI-style APIs) send arguments as a JSON-encoded string.
    try {
      args = JSON.parse(args);
    } catch {
      return { error: `Error: "arguments" of "${clip(name)}" is a string that is not valid JSON: ${quote(args as string)}` };
    }
  }
  if (!isObject(args)) return { error: `Error: "arguments" of "${clip(name)}" must be a JSON object, got ${kind(args)}` };
  return { name: name.trim(), arguments: args };
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
function kind(v: unknown): string {
  return v === null ? "null" : Array.isArray(v) ? "an array" : typeof v;
}
function clip(s: string): string {
  return s.length > MAX_SHOWN ? `${s.slice(0, MAX_SHOWN)}…` : s;
}
function quote(s: string): string {
  return JSON.stringify(clip(s.replace(/\s+/g, " ")));
}
