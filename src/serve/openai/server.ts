/** An OpenAI-compatible HTTP server over one checkpoint (scripts/serve-openai.ts), on node:http:
 *    GET  /v1/models, GET /health
 *    POST /v1/chat/completions   messages + tools through the model's chat template; tool_calls back;
 *                                stream (SSE), n, temperature, top_p, max_tokens, stop, seed, logprobs;
 *                                response_format json_object / json_schema and tool_choice "required" /
 *                                a named function, enforced by a token mask (json-grammar.ts)
 *    POST /v1/responses          the Responses API subset vLLM serves (responses.ts)
 *    POST /v1/completions        text or token-id prompts; tokens as ids (return_tokens_as_token_ids)
 *    POST /v1/load_lora_adapter {lora_name, lora_path}, /v1/unload_lora_adapter {lora_name} (vLLM's)
 *  "model" names the served model or a loaded adapter. Every error is OpenAI's
 *  {"error": {message, type, param, code}} with a 4xx/5xx status, and the server keeps serving.
 *  Bodies over the cap get 413 before they are read; past --max_queue waiting requests, 429. */
import { timingSafeEqual } from "node:crypto";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import type { Tokenizer } from "../../model/types.ts";
import { assistantMessage, chatLogprobs, chatPromptIds, ContentDeltas, tokenName } from "./chat.ts";
import type { Batcher, GenChoice, GenToken } from "./batcher.ts";
import { ApiError, badField } from "./errors.ts";
import { vocabOf } from "./token-mask.ts";
import { ItemStore, responses } from "./responses.ts";
import { chatRequestOf, completionRequestOf, type Sampling } from "./protocol.ts";

export const MAX_BODY_BYTES = 4 * 1024 * 1024;
const DRAIN_LIMIT = 64 * 1024 * 1024; // an oversized body is read and dropped up to this, then cut off

export interface OpenAiServerOptions {
  host: string;
  port: number;
  servedModelName: string;
  apiKey?: string;
  toolsInPrompt: boolean;
  maxBodyBytes?: number;
  /** Constrained decoding: the longest string a JSON schema without maxLength gets. */
  maxJsonString: number;
  log?: (line: string) => void;
}

export interface RunningOpenAiServer {
  url: string;
  close(): Promise<void>;
}

type Body = Record<string, unknown>;

function readBody(req: http.IncomingMessage, cap: number): Promise<Body> {
  const declared = Number(req.headers["content-length"] ?? NaN);
  if (declared > cap)
    return Promise.reject(new ApiError(413, `request body is ${declared} bytes; the limit is ${cap}`, null, "body_too_large"));
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (c: Buffer) => {
      size += c.length;
      if (size <= cap) chunks.push(c);
      else if (size > DRAIN_LIMIT) req.destroy();
    });
    req.on("error", reject);
    req.on("end", () => {
      if (size > cap) return reject(new ApiError(413, `request body is over ${cap} bytes`, null, "body_too_large"));
      let v: unknown;
      try {
        v = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      } catch (err) {
        return reject(new ApiError(400, `request body is not valid JSON (${(err as Error).message})`, null, "invalid_json"));
      }
      if (v === null || typeof v !== "object" || Array.isArray(v))
        return reject(new ApiError(400, "request body must be a JSON object", null, "invalid_json"));
      resolve(v as Body);
    });
  });
}

function sendJson(res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  if (res.headersSent || res.destroyed) return;
  const text = JSON.stringify(body);
  res.writeHead(status, { "Content-Type": "application/json; charset=utf-8", "Content-Length": Buffer.byteLength(text), ...headers });
  res.end(text);
}

export async function startOpenAiServer(batcher: Batcher, o: OpenAiServerOptions): Promise<RunningOpenAiServer> {
  const tok: Tokenizer = batcher.tokenizer;
  const cap = o.maxBodyBytes ?? MAX_BODY_BYTES;
  const items = new ItemStore(); // /v1/responses output items, for item_reference
  const limits = { maxString: o.maxJsonString > 0 ? o.maxJsonString : Infinity };
  const created = Math.floor(Date.now() / 1000);
  let seq = 0;
  const newId = (prefix: string) => `${prefix}-${Date.now().toString(36)}${(seq++).toString(36)}`;

  /** "model" → the adapter to use (null: as started); unknown names are 404 model_not_found. */
  const adapterFor = (model: string): string | null => {
    if (model === o.servedModelName) return null;
    if (batcher.hasAdapter(model)) return model;
    const known = [o.servedModelName, ...batcher.adapterNames().map((a) => a.name)];
    throw new ApiError(404, `the model "${model}" does not exist; served: ${known.join(", ")}`, "model", "model_not_found");
  };

  const vocab = vocabOf(tok, batcher.model.config.vocabSize); // built once: the token mask and the bound below use it
  const checkLength = (promptLen: number, s: Sampling, param: string, maxParam = "max_tokens") => {
    const ctx = batcher.contextLength;
    if (promptLen >= ctx) throw badField(param, `the prompt is ${promptLen} tokens; the model holds ${ctx} positions`);
    if (s.maxTokens !== undefined && promptLen + s.maxTokens > ctx)
      throw badField(maxParam, `${s.maxTokens} new tokens after a ${promptLen}-token prompt pass the model's ${ctx} positions`);
  };

  // A text too long for the context whatever its tokens (each covers at most vocab.longest characters)
  // is refused before it is tokenized: tokenizing megabytes holds the event loop for seconds.
  const checkChars = (chars: number, param: string) => {
    const atLeast = Math.ceil(chars / vocab.longest);
    if (atLeast >= batcher.contextLength)
      throw badField(
        param,
        `the prompt is ${chars} characters, at least ${atLeast} tokens; the model holds ${batcher.contextLength} positions`,
      );
  };

  // One request decodes in one batch: prompts × n may not pass --max_batch_rows.
  const checkRows = (prompts: number, s: Sampling) => {
    if (prompts * s.n > batcher.o.maxBatchRows)
      throw badField(
        prompts > 1 ? "prompt" : "n",
        `${prompts} prompt(s) × n ${s.n} = ${prompts * s.n} rows; this server decodes at most ` +
          `${batcher.o.maxBatchRows} (--max_batch_rows) per request`,
      );
  };

  const usage = (promptTokens: number, choices: GenChoice[]) => {
    const completion = choices.reduce((a, c) => a + c.tokens.length, 0);
    return { prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion };
  };

  const isStop = (t: GenToken, s: Sampling) => batcher.stopIds.has(t.id) || s.params.stopTokenIds.includes(t.id);

  async function chat(body: Body, res: http.ServerResponse, signal: AbortSignal): Promise<void> {
    const r = chatRequestOf(body, limits);
    const adapter = adapterFor(r.model);
    checkChars(
      r.messages.reduce((a, m) => a + m.content.length, 0),
      "messages",
    );
    let ids: number[];
    try {
      ids = chatPromptIds(tok, r.messages, r.tools, o.toolsInPrompt);
    } catch (err) {
      throw badField("messages", `the chat template cannot render them: ${(err as Error).message.split("\n")[0]}`);
    }
    checkLength(ids.length, r.sampling, "messages");
    checkRows(1, r.sampling);
    const s = r.sampling;
    const id = newId("chatcmpl");
    const head = { id, created: Math.floor(Date.now() / 1000), model: r.model };
    const logprobsOf = (tokens: GenToken[]) =>
      r.logprobs
        ? {
            content: chatLogprobs(
              tok,
              tokens.filter((t) => !isStop(t, s)),
              s.tokenIds,
            ),
          }
        : null;
    if (!s.stream) {
      const choices = await batcher.generate({ adapter, prompts: [ids], n: s.n, params: s.params, grammar: r.grammar, signal });
      return sendJson(res, 200, {
        ...head,
        object: "chat.completion",
        choices: choices.map((c, i) => {
          const { message, finishReason } = assistantMessage(c.text, r.tools.length > 0, c.finishReason);
          return {
            index: i,
            message,
            logprobs: logprobsOf(c.tokens),
            finish_reason: finishReason,
            ...(s.returnTokenIds ? { token_ids: c.tokens.map((t) => t.id) } : {}),
          };
        }),
        usage: usage(ids.length, choices),
        ...(s.returnTokenIds ? { prompt_token_ids: ids } : {}),
      });
    }
    // Streaming: a role chunk per choice, content deltas as text becomes safe to send, then tool calls
    // (parsed once the turn is whole), a finish chunk per choice, the usage chunk when asked, [DONE].
    batcher.checkRoom(); // a full queue is a 429, not an error inside a 200 stream
    res.writeHead(200, { "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache", Connection: "keep-alive" });
    const open = () => !res.destroyed && !res.writableEnded; // a client that went away gets nothing more
    const event = (x: unknown) => void (open() && res.write(`data: ${JSON.stringify(x)}\n\n`));
    const chunk = (choices: unknown[]) => event({ ...head, object: "chat.completion.chunk", choices });
    const state = Array.from({ length: s.n }, () => new ContentDeltas(tok, r.tools.length > 0, s.params.stop));
    chunk(state.map((_, i) => ({ index: i, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null })));
    const onToken = (i: number, t: GenToken) => {
      const delta = isStop(t, s) ? "" : state[i].push(t.id);
      const lp = r.logprobs && !isStop(t, s) ? { content: chatLogprobs(tok, [t], s.tokenIds) } : null;
      if (delta !== "" || lp) chunk([{ index: i, delta: { content: delta }, logprobs: lp, finish_reason: null }]);
    };
    try {
      const choices = await batcher.generate({ adapter, prompts: [ids], n: s.n, params: s.params, grammar: r.grammar, signal, onToken });
      choices.forEach((c, i) => {
        const { message, finishReason } = assistantMessage(c.text, r.tools.length > 0, c.finishReason);
        const rest = state[i].rest(message.content ?? "");
        if (rest !== "") chunk([{ index: i, delta: { content: rest }, logprobs: null, finish_reason: null }]);
        if (message.tool_calls)
          chunk([
            {
              index: i,
              delta: { tool_calls: message.tool_calls.map((tc, k) => ({ index: k, ...tc })) },
              logprobs: null,
              finish_reason: null,
            },
          ]);
        chunk([{ index: i, delta: {}, logprobs: null, finish_reason: finishReason }]);
      });
      if (s.includeUsage) event({ ...head, object: "chat.completion.chunk", choices: [], usage: usage(ids.length, choices) });
    } catch (err) {
      const e = err instanceof ApiError ? err : new ApiError(500, (err as Error).message.split("\n")[0]);
      event(e.body());
    }
    if (open()) res.end("data: [DONE]\n\n");
  }

  async function complete(body: Body, res: http.ServerResponse, signal: AbortSignal): Promise<void> {
    const r = completionRequestOf(body, batcher.model.config.vocabSize);
    const adapter = adapterFor(r.model);
    for (const p of r.prompts) if (p.text !== undefined) checkChars(p.text.length, "prompt");
    const prompts = r.prompts.map((p) => p.ids ?? tok.encode(p.text!));
    for (const p of prompts) checkLength(p.length, r.sampling, "prompt");
    checkRows(prompts.length, r.sampling);
    const s = r.sampling;
    const choices = await batcher.generate({ adapter, prompts, n: s.n, params: s.params, signal });
    const logprobsOf = (tokens: GenToken[]) => {
      if (r.logprobs === null) return null;
      const names = tokens.map((t) => tokenName(tok, t.id, s.tokenIds));
      const offsets: number[] = [];
      let at = 0;
      for (const t of tokens) {
        offsets.push(at);
        at += tok.decode([t.id], { skipSpecialTokens: true }).length;
      }
      return {
        tokens: names,
        token_logprobs: tokens.map((t) => t.logprob),
        top_logprobs: tokens.map((t) => Object.fromEntries(t.top.map((a) => [tokenName(tok, a.id, s.tokenIds), a.logprob]))),
        text_offset: offsets,
      };
    };
    sendJson(res, 200, {
      id: newId("cmpl"),
      object: "text_completion",
      created: Math.floor(Date.now() / 1000),
      model: r.model,
      choices: choices.map((c, i) => ({
        index: i,
        text: c.text,
        logprobs: logprobsOf(c.tokens),
        finish_reason: c.finishReason,
        stop_reason: null,
        ...(s.returnTokenIds ? { token_ids: c.tokens.map((t) => t.id), prompt_token_ids: prompts[c.promptIndex] } : {}),
      })),
      usage: usage(
        prompts.reduce((a, p) => a + p.length, 0),
        choices,
      ),
    });
  }

  const str = (b: Body, k: string) => {
    if (typeof b[k] !== "string" || b[k] === "")
      throw badField(k, `expected a non-empty string, got ${b[k] === undefined ? "nothing" : typeof b[k]}`);
    return b[k] as string;
  };

  const routes: Record<string, Partial<Record<string, (body: Body, res: http.ServerResponse, signal: AbortSignal) => Promise<void>>>> = {
    "/health": { GET: async (_b, res) => sendJson(res, 200, { status: "ok", waiting: batcher.waiting, ...batcher.stats }) },
    "/v1/models": {
      GET: async (_b, res) => {
        const base = { object: "model", created, owned_by: "mini-agentic-rl", max_model_len: batcher.contextLength };
        sendJson(res, 200, {
          object: "list",
          data: [
            { id: o.servedModelName, ...base, root: o.servedModelName, parent: null },
            ...batcher.adapterNames().map((a) => ({ id: a.name, ...base, root: a.path, parent: o.servedModelName })),
          ],
        });
      },
    },
    "/v1/chat/completions": { POST: chat },
    "/v1/completions": { POST: complete },
    "/v1/responses": {
      POST: (body, res, signal) =>
        responses(
          { batcher, limits, toolsInPrompt: o.toolsInPrompt, adapterFor, checkChars, checkLength, newId, sendJson },
          items,
          body,
          res,
          signal,
        ),
    },
    "/v1/load_lora_adapter": {
      POST: async (b, res) => {
        const name = str(b, "lora_name");
        if (name === o.servedModelName) throw badField("lora_name", `"${name}" is the served model's own name`);
        await batcher.loadAdapter(name, str(b, "lora_path"));
        o.log?.(`loaded LoRA adapter ${name} from ${b.lora_path}`);
        res.writeHead(200, { "Content-Type": "text/plain; charset=utf-8" }).end(`Success: LoRA adapter '${name}' added successfully.`);
      },
    },
    "/v1/unload_lora_adapter": {
      POST: async (b, res) => {
        const name = str(b, "lora_name");
        batcher.unloadAdapter(name);
        res.writeHead(200, { "Content-Type": "text/plain; charset=utf-8" }).end(`Success: LoRA adapter '${name}' removed successfully.`);
      },
    },
  };

  const authorized = (req: http.IncomingMessage) => {
    if (!o.apiKey) return true;
    const got = Buffer.from(String(req.headers.authorization ?? ""));
    const want = Buffer.from(`Bearer ${o.apiKey}`);
    return got.length === want.length && timingSafeEqual(got, want);
  };

  const server = http.createServer(async (req, res) => {
    const abort = new AbortController();
    res.on("close", () => {
      if (!res.writableFinished) abort.abort(); // the client went away: its rows stop
    });
    try {
      const url = new URL(req.url ?? "/", "http://localhost");
      const route = routes[url.pathname];
      if (!route) throw new ApiError(404, `no route ${req.method} ${url.pathname}`, null, "not_found");
      const handler = route[req.method ?? ""];
      if (!handler) throw new ApiError(405, `${url.pathname} accepts ${Object.keys(route).join(", ")}`, null, "method_not_allowed");
      if (url.pathname !== "/health" && !authorized(req))
        throw new ApiError(401, "missing or wrong API key (Authorization: Bearer ...)", null, "invalid_api_key");
      const body = req.method === "POST" ? await readBody(req, cap) : {};
      await handler(body, res, abort.signal);
    } catch (err) {
      const e = err instanceof ApiError ? err : new ApiError(500, (err as Error).message.split("\n")[0]);
      if (e.status >= 500) o.log?.(`error: ${e.message}`);
      // A refused body is left unread: close the connection after answering.
      const headers: Record<string, string> = e.status === 413 ? { Connection: "close" } : e.status === 429 ? { "Retry-After": "1" } : {};
      sendJson(res, e.status, e.body(), headers);
      if (e.status === 413) req.resume();
    }
  });
  server.requestTimeout = 0; // generation may take long; clients set their own timeouts
  // Idle keep-alive connections stay open for 2 minutes (Node's default is 5 s): a client busy with a
  // training step between two requests should find its connection still there.
  server.keepAliveTimeout = 120_000;
  server.headersTimeout = 125_000;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(o.port, o.host, () => resolve());
  });
  const addr = server.address() as AddressInfo;
  const host = addr.family === "IPv6" ? `[${addr.address}]` : addr.address;
  return {
    url: `http://${host}:${addr.port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
