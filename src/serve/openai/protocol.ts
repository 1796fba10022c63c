/** Request bodies of the OpenAI API, checked field by field and turned into what the batcher takes.
 *  A wrong type or value is a 400 naming the field (`param`). Fields that do not change what is
 *  generated (user, metadata, store, parallel_tool_calls, …) are accepted and ignored, as vLLM does;
 *  settings this server cannot honour (penalties, logit_bias, best_of > 1, echo) are refused by name.
 *  Leaves out: the HTTP side (server.ts) and rendering / parsing chat turns (chat.ts). */
import type { ChatMessage, ChatToolCall, ToolSchema } from "../../model/types.ts";
import type { GenParams } from "./batcher.ts";
import { badField } from "./errors.ts";
import { toolCallNode, type Node } from "./json-grammar.ts";
import { checkSchemaDepth, compileSchema, type GrammarLimits } from "./json-schema.ts";

type Body = Record<string, unknown>;

const kind = (v: unknown) => (v === null ? "null" : Array.isArray(v) ? "an array" : typeof v);
const isObj = (v: unknown): v is Body => typeof v === "object" && v !== null && !Array.isArray(v);

function num(b: Body, k: string, def: number, min: number, max: number, int = false): number {
  const v = b[k];
  if (v === undefined || v === null) return def;
  if (typeof v !== "number" || !Number.isFinite(v)) throw badField(k, `expected a number, got ${kind(v)}`);
  if (int && !Number.isInteger(v)) throw badField(k, `expected an integer, got ${v}`);
  if (v < min || v > max) throw badField(k, `${v} is out of range; expected ${min} to ${max}`);
  return v;
}

function bool(b: Body, k: string, def: boolean): boolean {
  const v = b[k];
  if (v === undefined || v === null) return def;
  if (typeof v !== "boolean") throw badField(k, `expected true or false, got ${kind(v)}`);
  return v;
}

function unsupported(b: Body, k: string, neutral: (v: unknown) => boolean, what: string): void {
  const v = b[k];
  if (v !== undefined && v !== null && !neutral(v)) throw badField(k, `${what} is not supported by this server`);
}

/** The model name a request asks for (required, a string). */
export function modelOf(b: Body): string {
  if (typeof b.model !== "string" || b.model === "")
    throw badField("model", `expected the name of a served model (GET /v1/models), got ${kind(b.model)}`);
  return b.model;
}

export interface Sampling {
  params: GenParams;
  n: number;
  maxTokens: number | undefined; // undefined: as many as the context leaves
  stream: boolean;
  includeUsage: boolean;
  tokenIds: boolean; // return_tokens_as_token_ids: tokens as "token_id:N"
  returnTokenIds: boolean; // vLLM's return_token_ids: token_ids / prompt_token_ids on each choice
}

/** Sampling fields shared by chat and text completions. `topLogprobs` is read by the caller. */
export function samplingOf(b: Body, topLogprobs: number): Sampling {
  unsupported(b, "frequency_penalty", (v) => v === 0, "frequency_penalty other than 0");
  unsupported(b, "presence_penalty", (v) => v === 0, "presence_penalty other than 0");
  unsupported(b, "logit_bias", (v) => isObj(v) && Object.keys(v).length === 0, "logit_bias");
  unsupported(b, "best_of", (v) => v === 1, "best_of other than 1");
  unsupported(b, "echo", (v) => v === false, "echo");
  unsupported(b, "suffix", (v) => v === "", "suffix");
  const maxA = num(b, "max_tokens", NaN, 1, 1e9, true);
  const maxB = num(b, "max_completion_tokens", NaN, 1, 1e9, true);
  let stop: string[] = [];
  if (typeof b.stop === "string") stop = [b.stop];
  else if (Array.isArray(b.stop)) stop = b.stop as string[];
  else if (b.stop !== undefined && b.stop !== null) throw badField("stop", `expected a string or a list of strings, got ${kind(b.stop)}`);
  if (stop.length > 16 || stop.some((s) => typeof s !== "string" || s === ""))
    throw badField("stop", "expected at most 16 non-empty strings");
  let stopTokenIds: number[] = [];
  if (b.stop_token_ids !== undefined && b.stop_token_ids !== null) {
    if (!Array.isArray(b.stop_token_ids) || b.stop_token_ids.some((x) => !Number.isInteger(x) || (x as number) < 0))
      throw badField("stop_token_ids", "expected a list of token ids");
    stopTokenIds = b.stop_token_ids as number[];
  }
  const so = b.stream_options;
  if (so !== undefined && so !== null && !isObj(so)) throw badField("stream_options", `expected an object, got ${kind(so)}`);
  const topK = num(b, "top_k", 0, -1, 1e6, true);
  const seed = b.seed === undefined || b.seed === null ? undefined : num(b, "seed", 0, -(2 ** 53), 2 ** 53, true);
  return {
    params: {
      temperature: num(b, "temperature", 1, 0, 2),
      topP: num(b, "top_p", 1, Number.MIN_VALUE, 1),
      topK: topK < 0 ? 0 : topK,
      maxTokens: Number.isNaN(maxB) ? (Number.isNaN(maxA) ? Infinity : maxA) : maxB, // Infinity: until the context is full
      stop,
      stopTokenIds,
      seed: seed === undefined ? undefined : seed >>> 0,
      topLogprobs,
    },
    n: num(b, "n", 1, 1, 16, true),
    maxTokens: Number.isNaN(maxB) ? (Number.isNaN(maxA) ? undefined : maxA) : maxB,
    stream: bool(b, "stream", false),
    includeUsage: so ? bool(so as Body, "include_usage", false) : false,
    tokenIds: bool(b, "return_tokens_as_token_ids", false),
    returnTokenIds: bool(b, "return_token_ids", false),
  };
}

export interface ChatRequest {
  model: string;
  messages: ChatMessage[];
  tools: ToolSchema[]; // empty: none offered (or tool_choice "none")
  logprobs: boolean;
  sampling: Sampling;
  grammar?: Node; // what the reply must be: JSON by response_format, or a forced tool call
}

/** A structured-output format (chat's response_format, the Responses API's text.format) → its grammar;
 *  undefined for free text. `schemaParam` names where the schema sits, for the 400s. */
export function formatGrammar(type: unknown, schema: unknown, param: string, schemaParam: string, limits: GrammarLimits): Node | undefined {
  if (type === "text") return undefined;
  if (type === "json_object") return compileSchema({ type: "object" }, param, limits);
  if (type === "json_schema") return compileSchema(schema ?? {}, schemaParam, limits);
  throw badField(param, `type ${JSON.stringify(type)} is not supported; accepted: "text", "json_object", "json_schema"`);
}

/** tool_choice "required" or one named function → the grammar of a call to one of those tools. */
export function forcedToolGrammar(tools: ToolSchema[], choice: "required" | { name: string }, limits: GrammarLimits): Node {
  if (tools.length === 0) throw badField("tool_choice", "forcing a tool call needs tools");
  const chosen = choice === "required" ? tools : tools.filter((t) => t.function.name === choice.name);
  if (chosen.length === 0)
    throw badField(
      "tool_choice",
      `no tool is named "${(choice as { name: string }).name}"; offered: ${tools.map((t) => t.function.name).join(", ")}`,
    );
  return toolCallNode(
    chosen.map((t) => ({
      name: t.function.name,
      parameters: compileSchema(t.function.parameters, `tools[${tools.indexOf(t)}].function.parameters`, limits),
    })),
  );
}

function textOf(v: unknown, param: string, allowNull: boolean): string {
  if (typeof v === "string") return v;
  if ((v === null || v === undefined) && allowNull) return "";
  if (Array.isArray(v)) {
    return v
      .map((part, i) => {
        if (!isObj(part) || part.type !== "text" || typeof part.text !== "string")
          throw badField(`${param}[${i}]`, `expected a text part {"type": "text", "text": "..."}; only text is supported`);
        return part.text;
      })
      .join("");
  }
  throw badField(param, `expected a string or a list of text parts, got ${kind(v)}`);
}

function toolCallOf(v: unknown, param: string): ChatToolCall {
  if (!isObj(v) || !isObj(v.function) || typeof v.function.name !== "string")
    throw badField(param, `expected {"type": "function", "function": {"name", "arguments"}}`);
  const raw = v.function.arguments;
  let args: unknown = raw ?? {};
  if (typeof raw === "string") {
    try {
      args = raw.trim() === "" ? {} : JSON.parse(raw);
    } catch {
      throw badField(`${param}.function.arguments`, "expected a JSON-encoded object");
    }
  }
  if (!isObj(args)) throw badField(`${param}.function.arguments`, `expected a JSON object, got ${kind(args)}`);
  return { type: "function", function: { name: v.function.name, arguments: args } };
}

/** A tool message answers a call of the assistant message before it (tool messages between): by its
 *  tool_call_id, where the calls have ids. */
function answersCall(calls: { at: number; ids: string[] } | null, id: unknown, p: string): void {
  if (calls === null)
    throw badField(p, 'a "tool" message must answer a tool call; accepted: tool messages right after an assistant message with tool_calls');
  if (calls.ids.length > 0 && !(typeof id === "string" && calls.ids.includes(id)))
    throw badField(
      `${p}.tool_call_id`,
      `${JSON.stringify(id)} names no tool call of messages[${calls.at}]; accepted: ${calls.ids.map((x) => JSON.stringify(x)).join(", ")}`,
    );
}

const ROLES = new Map<string, ChatMessage["role"]>([
  ["system", "system"],
  ["developer", "system"],
  ["user", "user"],
  ["assistant", "assistant"],
  ["tool", "tool"],
]);

export function chatRequestOf(b: Body, limits: GrammarLimits): ChatRequest {
  const model = modelOf(b);
  if (!Array.isArray(b.messages) || b.messages.length === 0)
    throw badField("messages", `expected a non-empty list of messages, got ${kind(b.messages)}`);
  // The assistant message whose tool calls the tool messages after it answer (OpenAI refuses an orphan).
  let calls: { at: number; ids: string[] } | null = null;
  const messages = b.messages.map((m, i): ChatMessage => {
    const p = `messages[${i}]`;
    if (!isObj(m)) throw badField(p, `expected an object, got ${kind(m)}`);
    const role = typeof m.role === "string" ? ROLES.get(m.role) : undefined;
    if (!role) throw badField(`${p}.role`, `expected system, developer, user, assistant or tool, got ${JSON.stringify(m.role)}`);
    const out: ChatMessage = { role, content: textOf(m.content, `${p}.content`, role === "assistant") };
    if (m.tool_calls !== undefined && m.tool_calls !== null) {
      if (role !== "assistant" || !Array.isArray(m.tool_calls))
        throw badField(`${p}.tool_calls`, "expected a list, on an assistant message");
      if (m.tool_calls.length > 0) out.tool_calls = m.tool_calls.map((c, j) => toolCallOf(c, `${p}.tool_calls[${j}]`));
    }
    if (role === "tool") answersCall(calls, m.tool_call_id, p);
    else calls = out.tool_calls ? { at: i, ids: (m.tool_calls as Body[]).flatMap((c) => (typeof c.id === "string" ? [c.id] : [])) } : null;
    return out;
  });
  let tools: ToolSchema[] = [];
  if (b.tools !== undefined && b.tools !== null) {
    if (!Array.isArray(b.tools))
      throw badField("tools", `expected a list of {"type": "function", "function": {...}}, got ${kind(b.tools)}`);
    tools = b.tools.map((t, i): ToolSchema => {
      const f = isObj(t) ? t.function : undefined;
      if (!isObj(t) || t.type !== "function" || !isObj(f) || typeof f.name !== "string" || f.name === "")
        throw badField(`tools[${i}]`, `expected {"type": "function", "function": {"name", "description", "parameters"}}`);
      if (f.parameters !== undefined && !isObj(f.parameters))
        throw badField(`tools[${i}].function.parameters`, "expected a JSON schema object");
      checkSchemaDepth(f.parameters, `tools[${i}].function.parameters`); // the chat template renders it recursively
      if (f.description !== undefined && typeof f.description !== "string")
        throw badField(`tools[${i}].function.description`, "expected a string");
      return {
        type: "function",
        function: {
          name: f.name,
          description: (f.description as string) ?? "",
          parameters: (f.parameters as Body) ?? { type: "object", properties: {} },
        },
      };
    });
  }
  const choice = b.tool_choice;
  const named = isObj(choice) && choice.type === "function" && isObj(choice.function) && typeof choice.function.name === "string";
  if (choice !== undefined && choice !== null && !["auto", "none", "required"].includes(choice as string) && !named)
    throw badField(
      "tool_choice",
      `expected "auto", "none", "required" or {"type": "function", "function": {"name": ...}}, got ${JSON.stringify(choice)}`,
    );
  if (choice === "none") tools = [];
  let grammar: Node | undefined;
  if (choice === "required" || named)
    grammar = forcedToolGrammar(tools, named ? { name: (choice.function as Body).name as string } : "required", limits);
  const rf = b.response_format;
  if (rf !== undefined && rf !== null) {
    if (!isObj(rf)) throw badField("response_format", `expected an object, got ${kind(rf)}`);
    const js = isObj(rf.json_schema) ? rf.json_schema : {};
    const g = formatGrammar(rf.type, js.schema, "response_format", "response_format.json_schema.schema", limits);
    if (g && grammar) throw badField("response_format", "cannot be combined with a forced tool_choice");
    grammar ??= g;
  }
  const logprobs = bool(b, "logprobs", false);
  const top = num(b, "top_logprobs", 0, 0, 20, true);
  if (top > 0 && !logprobs) throw badField("top_logprobs", "needs logprobs: true");
  return { model, messages, tools, logprobs, sampling: samplingOf(b, top), ...(grammar ? { grammar } : {}) };
}

export interface CompletionRequest {
  model: string;
  prompts: { ids?: number[]; text?: string }[];
  logprobs: number | null; // null: none; k: the sampled token's and k alternatives
  sampling: Sampling;
}

export function completionRequestOf(b: Body, vocabSize: number): CompletionRequest {
  const model = modelOf(b);
  const p = b.prompt;
  const isIds = (v: unknown): v is number[] => Array.isArray(v) && v.length > 0 && v.every((x) => typeof x === "number");
  let prompts: { ids?: number[]; text?: string }[];
  if (typeof p === "string") prompts = [{ text: p }];
  else if (isIds(p)) prompts = [{ ids: p }];
  else if (Array.isArray(p) && p.length > 0 && p.every((x) => typeof x === "string")) prompts = (p as string[]).map((text) => ({ text }));
  else if (Array.isArray(p) && p.length > 0 && p.every(isIds)) prompts = (p as number[][]).map((ids) => ({ ids }));
  else throw badField("prompt", `expected a string, a list of strings, a list of token ids or a list of such lists, got ${kind(p)}`);
  if (prompts.length > 256) throw badField("prompt", `${prompts.length} prompts; at most 256 per request`);
  prompts.forEach((q, i) => {
    if (q.ids?.some((x) => !Number.isInteger(x) || x < 0 || x >= vocabSize))
      throw badField("prompt", `prompt ${i} holds a token id outside 0..${vocabSize - 1}`);
    if (q.text === "") throw badField("prompt", `prompt ${i} is empty`);
  });
  let logprobs: number | null = null;
  if (b.logprobs !== undefined && b.logprobs !== null) logprobs = num(b, "logprobs", 0, 0, 20, true);
  if (b.stream === true) throw badField("stream", "streaming is served on /v1/chat/completions; /v1/completions answers whole");
  return { model, prompts, logprobs, sampling: samplingOf(b, logprobs ?? 0) };
}
