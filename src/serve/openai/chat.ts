/** The chat side of the OpenAI API: messages (+ tools) → prompt ids through the model's own chat
 *  template, and generated text → an OpenAI assistant message, with Qwen/Hermes `<tool_call>` blocks
 *  parsed into `tool_calls` (arguments as a JSON string). A turn whose blocks do not parse is returned
 *  as plain content, as the model wrote it. Also the streaming side: which part of the text so far can
 *  be sent as a delta (nothing that might turn out to be a tool call or a stop string). */
import { randomBytes } from "node:crypto";
import { parseToolCalls } from "../../agents/toolcall.ts";
import type { ChatMessage, Tokenizer, ToolSchema } from "../../model/types.ts";
import type { GenToken } from "./batcher.ts";

export const TOOL_OPEN = "<tool_call>";

export function chatPromptIds(tokenizer: Tokenizer, messages: ChatMessage[], tools: ToolSchema[], toolsInPrompt: boolean): number[] {
  const text = tokenizer.applyChatTemplate(messages, {
    tools: toolsInPrompt && tools.length > 0 ? tools : undefined,
    addGenerationPrompt: true,
  });
  return tokenizer.encode(text);
}

export interface OpenAiToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

export interface AssistantMessage {
  role: "assistant";
  content: string | null;
  tool_calls?: OpenAiToolCall[];
}

/** Generated text → the assistant message and its finish reason. Tool calls are parsed only when the
 *  request offered tools. */
export function assistantMessage(
  text: string,
  toolsOffered: boolean,
  finish: "stop" | "length",
): { message: AssistantMessage; finishReason: string } {
  if (toolsOffered && text.includes(TOOL_OPEN)) {
    const parsed = parseToolCalls(text);
    if (parsed.calls.length > 0 && parsed.errors.length === 0)
      return {
        message: {
          role: "assistant",
          content: parsed.content === "" ? null : parsed.content,
          tool_calls: parsed.calls.map((c) => ({
            id: `call_${randomBytes(12).toString("hex")}`,
            type: "function",
            function: { name: c.name, arguments: JSON.stringify(c.arguments) },
          })),
        },
        finishReason: "tool_calls",
      };
  }
  return { message: { role: "assistant", content: text }, finishReason: finish };
}

/** How much of `text` a stream may send now: all of it but a tail that could still become one of
 *  `markers` (a stop string, the opening of a tool call), and nothing from a complete tool-call opening on. */
export function sendableLength(text: string, markers: string[]): number {
  let n = text.length;
  if (text.endsWith("\uFFFD")) n--; // an unfinished UTF-8 sequence: wait for its next token
  for (const m of markers) {
    const at = text.indexOf(m);
    if (at !== -1) n = Math.min(n, at);
    for (let k = Math.min(m.length - 1, text.length); k > 0; k--)
      if (text.endsWith(m.slice(0, k))) {
        n = Math.min(n, text.length - k);
        break;
      }
  }
  return Math.max(0, n);
}

/** One streamed choice's content: tokens in, the text that is safe to send out as deltas. With
 *  tools, content is the text outside tool calls, trimmed: whitespace waits for what follows it. */
export class ContentDeltas {
  private readonly ids: number[] = [];
  private sent = "";
  private readonly markers: string[];

  constructor(
    private readonly tok: Tokenizer,
    private readonly withTools: boolean,
    stop: string[],
  ) {
    this.markers = [...stop, ...(withTools ? [TOOL_OPEN] : [])];
  }

  /** A generated token (not a stop token) → the delta to send now (maybe ""). */
  push(id: number): string {
    this.ids.push(id);
    const raw = this.tok.decode(this.ids, { skipSpecialTokens: true });
    const text = this.withTools ? raw.trimStart() : raw;
    const safe = sendableLength(text, this.markers);
    const n = this.withTools ? text.slice(0, safe).trimEnd().length : safe;
    const delta = n > this.sent.length && text.startsWith(this.sent) ? text.slice(this.sent.length, n) : "";
    this.sent += delta;
    return delta;
  }

  /** What is left to send once the turn is parsed into its final `content`. */
  rest(content: string): string {
    return content.startsWith(this.sent) ? content.slice(this.sent.length) : "";
  }
}

/** How a token is named in log-probs: "token_id:N" (vLLM's return_tokens_as_token_ids) or its text. */
export function tokenName(tokenizer: Tokenizer, id: number, asIds: boolean): string {
  return asIds ? `token_id:${id}` : tokenizer.decode([id]);
}

/** Chat log-probs of some generated tokens, in OpenAI's shape. */
export function chatLogprobs(tokenizer: Tokenizer, tokens: GenToken[], asIds: boolean) {
  const entry = (id: number, logprob: number) => {
    const token = tokenName(tokenizer, id, asIds);
    return { token, logprob, bytes: [...Buffer.from(asIds ? tokenizer.decode([id]) : token, "utf8")] };
  };
  return tokens.map((t) => ({ ...entry(t.id, t.logprob), top_logprobs: t.top.map((a) => entry(a.id, a.logprob)) }));
}
