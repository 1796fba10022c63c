/** A client of an OpenAI-compatible inference engine (vLLM started with --enable-lora, or this
 *  project's scripts/serve-openai.ts) for rollouts: token-id prompts in, token ids and their log-probs
 *  out (/v1/completions with return_token_ids / return_tokens_as_token_ids, so no text is ever
 *  re-tokenized), and LoRA adapters hot-loaded by name (/v1/load_lora_adapter, /v1/unload_lora_adapter).
 *  Every request is bounded by a timeout; an engine that cannot be reached, answers with an HTTP error
 *  or with a body that lacks what was asked is an EngineError whose message names the URL and the
 *  field. Leaves out: the turn loop and tools (turns.ts). */
import type { TurnCompletion, TurnSampling } from "../turns.ts";
import { EngineError } from "./types.ts";

export interface EngineClientOptions {
  url: string; // base URL, with or without /v1
  apiKey?: string;
  timeoutMs: number; // per request
}

/** A request's sampling and what comes back: a turn of turns.ts's loop. */
export type CompletionParams = Omit<TurnSampling, "signal">;
export type EngineCompletion = TurnCompletion;

type Json = Record<string, unknown>;
/** Socket errors of a pooled connection the other side had closed (undici's names and the OS's). */
const STALE_SOCKET = new Set(["UND_ERR_SOCKET", "ECONNRESET", "EPIPE", "UND_ERR_CLOSED"]);
const isObj = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

export class EngineClient {
  readonly base: string;

  constructor(
    readonly o: EngineClientOptions,
    public vocabSize: number,
  ) {
    this.base = o.url.replace(/\/+$/, "").replace(/\/v1$/, "");
  }

  /** One HTTP exchange. A connection the engine closed while it sat idle in the pool (its keep-alive
   *  timeout ran out while this process was busy training) fails with a socket error on reuse: such a
   *  request is sent once more on a fresh connection; an engine that is gone then refuses it. */
  private async request(method: "GET" | "POST", route: string, body?: unknown): Promise<{ status: number; text: string }> {
    const url = `${this.base}/v1/${route}`;
    for (let attempt = 0; ; attempt++) {
      try {
        const res = await fetch(url, {
          method,
          headers: { "Content-Type": "application/json", ...(this.o.apiKey ? { Authorization: `Bearer ${this.o.apiKey}` } : {}) },
          body: body === undefined ? undefined : JSON.stringify(body),
          signal: AbortSignal.timeout(this.o.timeoutMs),
        });
        const text = await res.text(); // the timeout covers the body too: a truncated or stalled one fails here
        return { status: res.status, text };
      } catch (err) {
        const e = err as Error & { cause?: { code?: string; message?: string } };
        if (e.name === "TimeoutError" || e.name === "AbortError")
          throw new EngineError(
            `rollout engine ${url}: no complete answer within ${this.o.timeoutMs / 1000} s (--rollout_timeout)`,
            "timeout",
          );
        const code = e.cause?.code ?? "";
        if (attempt === 0 && STALE_SOCKET.has(code)) continue;
        throw new EngineError(`rollout engine ${url}: cannot be reached (${code || e.cause?.message || e.message})`, "unreachable");
      }
    }
  }

  private async json(method: "GET" | "POST", route: string, body?: unknown): Promise<Json> {
    const { status, text } = await this.request(method, route, body);
    if (status !== 200) throw new EngineError(`rollout engine ${this.base}/v1/${route}: HTTP ${status}: ${errorText(text)}`, "http");
    let v: unknown;
    try {
      v = JSON.parse(text);
    } catch {
      throw new EngineError(
        `rollout engine ${this.base}/v1/${route}: the answer is not JSON (${text.length} bytes: ${JSON.stringify(text.slice(0, 60))})`,
        "malformed",
      );
    }
    if (!isObj(v)) throw new EngineError(`rollout engine ${this.base}/v1/${route}: the answer is not a JSON object`, "malformed");
    return v;
  }

  /** The models the engine serves (GET /v1/models). */
  async models(): Promise<string[]> {
    const v = await this.json("GET", "models");
    if (!Array.isArray(v.data)) throw malformed("models", "data", "a list of models");
    return v.data.map((m, i) => {
      if (!isObj(m) || typeof m.id !== "string") throw malformed("models", `data[${i}].id`, "a string");
      return m.id;
    });
  }

  async loadAdapter(name: string, dir: string): Promise<void> {
    const { status, text } = await this.request("POST", "load_lora_adapter", { lora_name: name, lora_path: dir });
    if (status !== 200)
      throw new EngineError(`rollout engine ${this.base}/v1/load_lora_adapter ${name}: HTTP ${status}: ${errorText(text)}`, "http");
  }

  async unloadAdapter(name: string): Promise<void> {
    const { status, text } = await this.request("POST", "unload_lora_adapter", { lora_name: name });
    if (status !== 200)
      throw new EngineError(`rollout engine ${this.base}/v1/unload_lora_adapter ${name}: HTTP ${status}: ${errorText(text)}`, "http");
  }

  /** One continuation of a token-id prompt. */
  async complete(model: string, prompt: number[], p: CompletionParams): Promise<EngineCompletion> {
    const v = await this.json("POST", "completions", {
      model,
      prompt,
      max_tokens: p.maxTokens,
      temperature: p.temperature,
      top_p: p.topP,
      ...(p.topK > 0 ? { top_k: p.topK } : {}),
      seed: p.seed,
      n: 1,
      logprobs: 0,
      stop_token_ids: p.stopTokenIds,
      return_tokens_as_token_ids: true,
      return_token_ids: true,
      skip_special_tokens: false,
    });
    return parseCompletion(v, this.vocabSize);
  }
}

function malformed(route: string, field: string, expected: string): EngineError {
  return new EngineError(`rollout engine: malformed answer to /v1/${route}: ${field} is not ${expected}`, "malformed");
}

/** The one choice of a /v1/completions answer, checked: ids from token_ids (vLLM's return_token_ids)
 *  or else from the "token_id:N" names in logprobs.tokens; one log-prob per id. */
export function parseCompletion(v: Json, vocabSize: number): EngineCompletion {
  if (!Array.isArray(v.choices) || v.choices.length !== 1 || !isObj(v.choices[0]))
    throw malformed("completions", "choices", "a list of one choice");
  const c = v.choices[0];
  if (c.finish_reason !== "stop" && c.finish_reason !== "length")
    throw malformed("completions", "choices[0].finish_reason", `"stop" or "length" (got ${JSON.stringify(c.finish_reason)})`);
  const lp = c.logprobs;
  if (!isObj(lp) || !Array.isArray(lp.token_logprobs))
    throw malformed("completions", "choices[0].logprobs.token_logprobs", "a list (was logprobs asked for?)");
  const isId = (x: unknown): x is number => Number.isInteger(x) && (x as number) >= 0 && (x as number) < vocabSize;
  let ids: number[];
  if (c.token_ids !== undefined && c.token_ids !== null) {
    if (!Array.isArray(c.token_ids)) throw malformed("completions", "choices[0].token_ids", "a list of token ids");
    c.token_ids.forEach((x, i) => {
      if (!isId(x)) throw malformed("completions", `choices[0].token_ids[${i}]`, `a token id below ${vocabSize}`);
    });
    ids = c.token_ids as number[];
  } else {
    if (!Array.isArray(lp.tokens)) throw malformed("completions", "choices[0].logprobs.tokens", "a list");
    ids = lp.tokens.map((t, i) => {
      const m = typeof t === "string" ? /^token_id:(\d+)$/.exec(t) : null;
      if (!m || !isId(Number(m[1])))
        throw malformed(
          "completions",
          `choices[0].logprobs.tokens[${i}]`,
          `"token_id:N" with N below ${vocabSize} (was return_tokens_as_token_ids honoured?)`,
        );
      return Number(m[1]);
    });
  }
  if (lp.token_logprobs.length !== ids.length)
    throw malformed(
      "completions",
      "choices[0].logprobs.token_logprobs",
      `one log-prob per token (${lp.token_logprobs.length} for ${ids.length} tokens)`,
    );
  const logprobs = lp.token_logprobs.map((x, i) => {
    if (x === null) return NaN;
    if (typeof x !== "number" || !(x <= 0))
      throw malformed("completions", `choices[0].logprobs.token_logprobs[${i}]`, "a log-probability (a number <= 0)");
    return x;
  });
  if (ids.length === 0 && c.finish_reason === "length")
    throw malformed("completions", "choices[0].token_ids", "non-empty when finish_reason is length");
  return { ids, logprobs, finishReason: c.finish_reason };
}

function errorText(text: string): string {
  try {
    const v = JSON.parse(text);
    if (isObj(v) && isObj(v.error) && typeof v.error.message === "string") return v.error.message;
    if (isObj(v) && typeof v.message === "string") return v.message;
  } catch {
    // not JSON: the text itself
  }
  return text.slice(0, 200).replace(/\s+/g, " ");
}
