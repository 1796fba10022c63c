/** POST /v1/responses: the subset of OpenAI's Responses API that vLLM serves, over the same chat
 *  template, batcher and constrained decoding as /v1/chat/completions.
 *  In: `input` as text or items (messages with text parts, `function_call`, `function_call_output`;
 *  `reasoning` items are skipped), `instructions` (a system message first), function `tools`,
 *  `tool_choice` (auto, none, required, a named function), `text.format` (text, json_object,
 *  json_schema), `max_output_tokens`, `temperature`, `top_p`, `seed`, `stream`.
 *  Out: a `response` object whose output is a message item and/or function_call items, with usage;
 *  streamed, the Responses event sequence (response.created, response.in_progress, the output items'
 *  added / delta / done events, response.completed or response.incomplete), each with its
 *  sequence_number. Errors are OpenAI's shape, as on the other routes.
 *  The last outputs' items are kept (ItemStore) so a next turn may name them by item_reference.
 *  Leaves out: stored responses (previous_response_id, retrieving a response),
 *  background mode, built-in tools (web search, file search, ...), images and files in input. */
import type * as http from "node:http";
import type { ChatMessage, ChatToolCall, ToolSchema } from "../../model/types.ts";
import type { Batcher } from "./batcher.ts";
import { assistantMessage, chatPromptIds, ContentDeltas } from "./chat.ts";
import { badField } from "./errors.ts";
import type { Node } from "./json-grammar.ts";
import { checkSchemaDepth, type GrammarLimits } from "./json-schema.ts";
import { forcedToolGrammar, formatGrammar, modelOf, samplingOf, type Sampling } from "./protocol.ts";

type Body = Record<string, unknown>;
const isObj = (v: unknown): v is Body => typeof v === "object" && v !== null && !Array.isArray(v);
const kind = (v: unknown) => (v === null ? "null" : Array.isArray(v) ? "an array" : typeof v);

/** What the route needs from the server around it. */
export interface ResponsesContext {
  batcher: Batcher;
  limits: GrammarLimits;
  toolsInPrompt: boolean;
  adapterFor(model: string): string | null;
  checkChars(chars: number, param: string): void;
  checkLength(promptLen: number, s: Sampling, param: string, maxParam: string): void;
  newId(prefix: string): string;
  sendJson(res: http.ServerResponse, status: number, body: unknown): void;
}

interface ResponsesRequest {
  model: string;
  messages: ChatMessage[];
  tools: ToolSchema[];
  toolChoice: unknown;
  format: Body;
  grammar?: Node;
  sampling: Sampling;
  echo: Body; // request fields the response object repeats
}

function textOf(v: unknown, param: string): string {
  if (typeof v === "string") return v;
  if (!Array.isArray(v)) throw badField(param, `expected a string or a list of text parts, got ${kind(v)}`);
  return v
    .map((p, i) => {
      if (!isObj(p) || !["input_text", "output_text", "text"].includes(p.type as string) || typeof p.text !== "string")
        throw badField(`${param}[${i}]`, `expected {"type": "input_text", "text": "..."}; only text is supported`);
      return p.text;
    })
    .join("");
}

const ROLES: Record<string, ChatMessage["role"]> = { system: "system", developer: "system", user: "user", assistant: "assistant" };

/** `input` (+ `instructions`) → chat messages. function_call items join the assistant turn before them. */
function messagesOf(b: Body, items: ItemStore): ChatMessage[] {
  const out: ChatMessage[] = [];
  if (b.instructions !== undefined && b.instructions !== null) {
    if (typeof b.instructions !== "string") throw badField("instructions", `expected a string, got ${kind(b.instructions)}`);
    out.push({ role: "system", content: b.instructions });
  }
  if (typeof b.input === "string") return [...out, { role: "user", content: b.input }];
  if (!Array.isArray(b.input) || b.input.length === 0)
    throw badField("input", `expected a string or a non-empty list of input items, got ${kind(b.input)}`);
  const callIds = new Set<string>(); // of the function_call items so far: each output answers one
  b.input.forEach((given, i) => {
    const p = `input[${i}]`;
    if (!isObj(given)) throw badField(p, `expected an object, got ${kind(given)}`);
    const item = given.type === "item_reference" ? items.get(given.id, `${p}.id`) : given;
    const type = item.type ?? "message";
    if (type === "message") {
      const role = ROLES[item.role as string];
      if (!role) throw badField(`${p}.role`, `expected system, developer, user or assistant, got ${JSON.stringify(item.role)}`);
      out.push({ role, content: textOf(item.content, `${p}.content`) });
    } else if (type === "function_call") {
      if (typeof item.name !== "string" || typeof item.arguments !== "string")
        throw badField(p, 'expected {"type": "function_call", "call_id", "name", "arguments": "<JSON>"}');
      let args: unknown;
      try {
        args = item.arguments.trim() === "" ? {} : JSON.parse(item.arguments);
      } catch {
        throw badField(`${p}.arguments`, "expected a JSON-encoded object");
      }
      if (!isObj(args)) throw badField(`${p}.arguments`, `expected a JSON object, got ${kind(args)}`);
      if (typeof item.call_id === "string") callIds.add(item.call_id);
      const call: ChatToolCall = { type: "function", function: { name: item.name, arguments: args } };
      const last = out.at(-1);
      if (last?.role === "assistant")
        (last.tool_calls ??= []).push(call); // the turn's text, then its calls
      else out.push({ role: "assistant", content: "", tool_calls: [call] });
    } else if (type === "function_call_output") {
      if (typeof item.call_id !== "string" || !callIds.has(item.call_id))
        throw badField(
          `${p}.call_id`,
          `no function_call before it has call_id ${JSON.stringify(item.call_id)}; accepted: ` +
            (callIds.size > 0
              ? [...callIds].map((x) => JSON.stringify(x)).join(", ")
              : "the call_id of an earlier function_call item (none given)"),
        );
      out.push({ role: "tool", content: textOf(item.output, `${p}.output`) });
    } else if (type !== "reasoning") {
      throw badField(
        `${p}.type`,
        `${JSON.stringify(type)} is not supported; accepted: message, function_call, function_call_output, item_reference, reasoning`,
      );
    }
  });
  return out;
}

function toolsOf(v: unknown): ToolSchema[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v)) throw badField("tools", `expected a list of function tools, got ${kind(v)}`);
  return v.map((t, i): ToolSchema => {
    if (!isObj(t) || t.type !== "function")
      throw badField(`tools[${i}].type`, `only "function" tools are served, got ${JSON.stringify(isObj(t) ? t.type : t)}`);
    if (typeof t.name !== "string" || t.name === "") throw badField(`tools[${i}].name`, "expected a non-empty string");
    if (t.parameters !== undefined && t.parameters !== null && !isObj(t.parameters))
      throw badField(`tools[${i}].parameters`, "expected a JSON schema object");
    checkSchemaDepth(t.parameters, `tools[${i}].parameters`); // the chat template renders it recursively
    return {
      type: "function",
      function: {
        name: t.name,
        description: typeof t.description === "string" ? t.description : "",
        parameters: (t.parameters as Body | undefined) ?? { type: "object", properties: {} },
      },
    };
  });
}

export function responsesRequestOf(b: Body, limits: GrammarLimits, items = new ItemStore()): ResponsesRequest {
  const model = modelOf(b);
  for (const k of ["previous_response_id", "conversation", "prompt"])
    if (b[k] !== undefined && b[k] !== null) throw badField(k, "is not supported: this server stores no responses or prompts");
  if (b.background === true) throw badField("background", "background mode is not supported");
  const max = b.max_output_tokens;
  if (max !== undefined && max !== null && !(Number.isInteger(max) && (max as number) >= 1))
    throw badField("max_output_tokens", `expected a positive integer, got ${JSON.stringify(max)}`);
  const messages = messagesOf(b, items);
  let tools = toolsOf(b.tools);
  const choice = b.tool_choice ?? "auto";
  const named = isObj(choice) && choice.type === "function" && typeof choice.name === "string";
  if (!["auto", "none", "required"].includes(choice as string) && !named)
    throw badField(
      "tool_choice",
      `expected "auto", "none", "required" or {"type": "function", "name": ...}, got ${JSON.stringify(choice)}`,
    );
  if (choice === "none") tools = [];
  let grammar: Node | undefined;
  if (choice === "required" || named) grammar = forcedToolGrammar(tools, named ? { name: choice.name as string } : "required", limits);
  const text = b.text ?? {};
  if (!isObj(text)) throw badField("text", `expected an object, got ${kind(text)}`);
  const format = (text.format ?? { type: "text" }) as Body;
  if (!isObj(format)) throw badField("text.format", `expected an object, got ${kind(format)}`);
  const g = formatGrammar(format.type, format.schema, "text.format", "text.format.schema", limits);
  if (g && grammar) throw badField("text.format", "cannot be combined with a forced tool_choice");
  grammar ??= g;
  const sampling = samplingOf({ temperature: b.temperature, top_p: b.top_p, seed: b.seed, stream: b.stream, max_tokens: max }, 0);
  return {
    model,
    messages,
    tools,
    toolChoice: choice,
    format,
    sampling,
    ...(grammar ? { grammar } : {}),
    echo: {
      instructions: b.instructions ?? null,
      max_output_tokens: max ?? null,
      metadata: b.metadata ?? {},
      parallel_tool_calls: b.parallel_tool_calls ?? true,
      temperature: b.temperature ?? 1,
      top_p: b.top_p ?? 1,
      tools: b.tools ?? [],
      user: b.user ?? null,
    },
  };
}

/** The output items of recent responses by id, for the `item_reference` inputs clients send on the
 *  next turn (the Vercel AI SDK does by default). Bounded: the oldest go first. Nothing else is kept. */
export class ItemStore {
  private readonly items = new Map<string, Body>();
  constructor(readonly capacity = 4096) {}

  put(item: Body): void {
    this.items.set(item.id as string, item);
    if (this.items.size > this.capacity) this.items.delete(this.items.keys().next().value!);
  }

  get(id: unknown, param: string): Body {
    const item = typeof id === "string" ? this.items.get(id) : undefined;
    if (!item)
      throw badField(param, `no output item ${JSON.stringify(id)} (this server keeps the items of its last ${this.capacity} outputs only)`);
    return item;
  }
}

export async function responses(
  ctx: ResponsesContext,
  items: ItemStore,
  body: Body,
  res: http.ServerResponse,
  signal: AbortSignal,
): Promise<void> {
  const r = responsesRequestOf(body, ctx.limits, items);
  const adapter = ctx.adapterFor(r.model);
  const tok = ctx.batcher.tokenizer;
  ctx.checkChars(
    r.messages.reduce((a, m) => a + m.content.length, 0),
    "input",
  );
  let ids: number[];
  try {
    ids = chatPromptIds(tok, r.messages, r.tools, ctx.toolsInPrompt);
  } catch (err) {
    throw badField("input", `the chat template cannot render it: ${(err as Error).message.split("\n")[0]}`);
  }
  ctx.checkLength(ids.length, r.sampling, "input", "max_output_tokens");
  const s = r.sampling;
  const withTools = r.tools.length > 0;
  const response = {
    id: ctx.newId("resp"),
    object: "response",
    created_at: Math.floor(Date.now() / 1000),
    status: "in_progress" as string,
    error: null,
    incomplete_details: null as { reason: string } | null,
    model: r.model,
    output: [] as Body[],
    tool_choice: r.toolChoice,
    text: { format: r.format },
    truncation: "disabled",
    store: false,
    background: false,
    reasoning: null,
    previous_response_id: null,
    usage: null as Body | null,
    ...r.echo,
  };
  /** The generated turn → output items, status and usage on `response`. */
  const conclude = (text: string, finish: "stop" | "length", outputTokens: number) => {
    const { message } = assistantMessage(text, withTools, finish);
    const items: Body[] = [];
    if (message.content !== null && (message.content !== "" || !message.tool_calls))
      items.push({
        type: "message",
        id: ctx.newId("msg"),
        status: finish === "length" ? "incomplete" : "completed",
        role: "assistant",
        content: [{ type: "output_text", text: message.content, annotations: [], logprobs: [] }],
      });
    for (const c of message.tool_calls ?? [])
      items.push({
        type: "function_call",
        id: ctx.newId("fc"),
        call_id: c.id,
        name: c.function.name,
        arguments: c.function.arguments,
        status: "completed",
      });
    response.output = items;
    response.status = finish === "length" ? "incomplete" : "completed";
    response.incomplete_details = finish === "length" ? { reason: "max_output_tokens" } : null;
    response.usage = {
      input_tokens: ids.length,
      input_tokens_details: { cached_tokens: 0 },
      output_tokens: outputTokens,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: ids.length + outputTokens,
    };
  };
  const gen = { adapter, prompts: [ids], n: 1, params: s.params, grammar: r.grammar, signal };
  if (!s.stream) {
    const [c] = await ctx.batcher.generate(gen);
    conclude(c.text, c.finishReason, c.tokens.length);
    response.output.forEach((o) => items.put(o));
    return ctx.sendJson(res, 200, response);
  }

  ctx.batcher.checkRoom(); // a full queue is a 429, not an error inside a 200 stream
  res.writeHead(200, { "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache", Connection: "keep-alive" });
  let seq = 0;
  const event = (type: string, x: Body) => {
    if (!res.destroyed && !res.writableEnded)
      res.write(`event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq++, ...x })}\n\n`);
  };
  event("response.created", { response });
  event("response.in_progress", { response });
  // The text item opens with its first delta; tool calls, parsed once the turn is whole, follow it.
  const deltas = new ContentDeltas(tok, withTools, s.params.stop);
  const msgId = ctx.newId("msg");
  let opened = false;
  const part = (text: string) => ({ type: "output_text", text, annotations: [], logprobs: [] });
  const at = { item_id: msgId, output_index: 0, content_index: 0 };
  const open = () => {
    if (opened) return;
    event("response.output_item.added", {
      output_index: 0,
      item: { type: "message", id: msgId, status: "in_progress", role: "assistant", content: [] },
    });
    event("response.content_part.added", { ...at, part: part("") });
    opened = true;
  };
  const say = (delta: string) => {
    if (delta === "") return;
    open();
    event("response.output_text.delta", { ...at, delta, logprobs: [] });
  };
  try {
    const [c] = await ctx.batcher.generate({
      ...gen,
      onToken: (_i, t) => say(ctx.batcher.stopIds.has(t.id) || s.params.stopTokenIds.includes(t.id) ? "" : deltas.push(t.id)),
    });
    conclude(c.text, c.finishReason, c.tokens.length);
    const message = response.output.find((o) => o.type === "message");
    if (message) {
      const text = (message.content as { text: string }[])[0].text;
      say(deltas.rest(text));
      open(); // an empty reply still gets its item
      message.id = msgId;
      items.put(message);
      event("response.output_text.done", { ...at, text, logprobs: [] });
      event("response.content_part.done", { ...at, part: part(text) });
      event("response.output_item.done", { output_index: 0, item: message });
    }
    response.output.forEach((item, k) => {
      if (item.type !== "function_call") return;
      items.put(item);
      event("response.output_item.added", { output_index: k, item: { ...item, arguments: "", status: "in_progress" } });
      event("response.function_call_arguments.delta", { item_id: item.id, output_index: k, delta: item.arguments });
      event("response.function_call_arguments.done", { item_id: item.id, output_index: k, name: item.name, arguments: item.arguments });
      event("response.output_item.done", { output_index: k, item });
    });
    event(response.status === "completed" ? "response.completed" : "response.incomplete", { response });
  } catch (err) {
    const e = err as Error & { code?: string | null };
    response.status = "failed";
    event("response.failed", { response: { ...response, error: { code: e.code ?? "server_error", message: e.message.split("\n")[0] } } });
  }
  if (!res.destroyed && !res.writableEnded) res.end();
}
