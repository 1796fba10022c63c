/** The OpenAI-compatible server driven by the official `openai` client over real HTTP on 127.0.0.1:
 *  the tiny preset's model calling the calculator through `tools` and reading the result back as a
 *  `tool` message, streaming, n, log-probs, completions from token ids, LoRA adapters loaded,
 *  selected per request and unloaded, bad requests answered in OpenAI's error shape, concurrent
 *  requests batched, and no tensors left behind. */
import { initBackend } from "../../../src/kernels/backend.ts";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs";
import OpenAI from "openai";
import { calculatorTool, shutdownCalculator } from "../../../src/agents/calculator.ts";
import { SYSTEM_PROMPT } from "../../../src/agents/prompts.ts";
import { toolSchema } from "../../../src/agents/types.ts";
import { loadModel } from "../../../src/model/load.ts";
import { TINY_BASE_DIR } from "../../../src/presets/tiny.ts";
import { defaultsOf } from "../../../src/run/flags.ts";
import { SERVE_OPENAI_FLAGS, serveOpenAi, type ServingOpenAi } from "../../../src/serve/openai/run.ts";

const QUESTION = "Each bag has 15 marbles. How many marbles are in 6 bags?";
const tools = [toolSchema(calculatorTool)];
const system = { role: "system" as const, content: SYSTEM_PROMPT };

let server: ServingOpenAi;
let client: OpenAI;
let adapterDir: string;

/** A PEFT adapter for the tiny base with random (non-zero) B, so it changes what the model says. */
async function makeAdapter(): Promise<string> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "marl-oai-adapter-"));
  const m = await loadModel(TINY_BASE_DIR, { lora: { r: 4, alpha: 16, dropout: 0, targetModules: ["q_proj", "v_proj"] }, seed: 5 });
  for (const v of m.trainableVariables()) v.assign(tf.tidy(() => tf.randomNormal(v.shape, 0, 0.5, "float32", 7)));
  await m.saveAdapter(dir);
  m.dispose();
  return dir;
}

beforeAll(async () => {
  await initBackend("wasm"); // loadModel uses the backend the caller started
  adapterDir = await makeAdapter();
  server = await serveOpenAi({
    ...defaultsOf(SERVE_OPENAI_FLAGS),
    model_path: TINY_BASE_DIR,
    served_model_name: "tiny",
    tools_in_prompt: false,
    port: 0,
    backend: "wasm",
    api_key: "test-key",
    batch_wait_ms: 200, // a wide window: the concurrent test's requests all land in it
  });
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "test-key", maxRetries: 0 });
});
afterAll(async () => {
  await server?.close();
  await shutdownCalculator();
});

const post = (route: string, body: unknown, key = "test-key") =>
  fetch(`${server.url}/v1/${route}`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${key}` },
    body: JSON.stringify(body),
  });

describe("OpenAI-compatible server", () => {
  it("lists the served model", async () => {
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual(["tiny"]);
  });

  it("runs a tool round trip: the model calls the calculator, reads the result, answers", async () => {
    const messages: OpenAI.ChatCompletionMessageParam[] = [system, { role: "user", content: QUESTION }];
    const first = await client.chat.completions.create({ model: "tiny", messages, tools, temperature: 0, max_tokens: 80 });
    const call = first.choices[0].message.tool_calls?.[0];
    expect(first.choices[0].finish_reason).toBe("tool_calls");
    expect(call?.type).toBe("function");
    if (call?.type !== "function") throw new Error("no function call");
    expect(call.function.name).toBe("calculator");
    const args = JSON.parse(call.function.arguments); // arguments come as a JSON string
    expect(typeof args.expression).toBe("string");
    const out = await calculatorTool.run(args);
    const result = String((out as { text?: string }).text ?? out); // a tool's output: text, or {text, isError}
    expect(result).toBe("90"); // 15 × 6
    messages.push(first.choices[0].message, { role: "tool", tool_call_id: call.id, content: result });
    const second = await client.chat.completions.create({ model: "tiny", messages, tools, temperature: 0, max_tokens: 80 });
    expect(second.choices[0].finish_reason).toBe("stop");
    expect(second.choices[0].message.content).toContain("\\boxed{90}");
    expect(second.usage!.prompt_tokens).toBeGreaterThan(first.usage!.prompt_tokens);
  });

  it("streams the same reply as deltas, tool calls at the end, then a usage chunk", async () => {
    const body = { model: "tiny", messages: [system, { role: "user" as const, content: QUESTION }], tools, temperature: 0, max_tokens: 80 };
    const whole = await client.chat.completions.create(body);
    const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
    let content = "";
    let calls: OpenAI.ChatCompletionChunk.Choice.Delta.ToolCall[] = [];
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | undefined;
    let chunks = 0;
    for await (const c of stream) {
      chunks++;
      if (c.usage) usage = c.usage;
      const d = c.choices[0];
      if (!d) continue;
      content += d.delta.content ?? "";
      if (d.delta.tool_calls) calls = calls.concat(d.delta.tool_calls);
      if (d.finish_reason) finish = d.finish_reason;
    }
    expect(chunks).toBeGreaterThan(3);
    expect(content).toBe(whole.choices[0].message.content ?? "");
    expect(finish).toBe("tool_calls");
    const wholeCall = whole.choices[0].message.tool_calls![0];
    expect(calls.map((c) => c.function)).toEqual([wholeCall.type === "function" ? wholeCall.function : null]);
    expect(usage).toEqual(whole.usage);
  });

  it("samples n = 4 choices, reproducibly for a seed", async () => {
    const body = {
      model: "tiny",
      messages: [{ role: "user" as const, content: "What is 12 plus 30?" }],
      n: 4,
      temperature: 1,
      seed: 11,
      max_tokens: 24,
    };
    const a = await client.chat.completions.create(body);
    const b = await client.chat.completions.create(body);
    expect(a.choices.map((c) => c.index)).toEqual([0, 1, 2, 3]);
    expect(new Set(a.choices.map((c) => c.message.content)).size).toBeGreaterThan(1);
    expect(b.choices.map((c) => c.message.content)).toEqual(a.choices.map((c) => c.message.content));
  });

  it("stops at a stop string, which the text leaves out", async () => {
    const body = { model: "tiny", prompt: "Each bag has 15 marbles.", temperature: 0, max_tokens: 40 };
    const free = (await client.completions.create(body)).choices[0];
    const at = free.text.indexOf(" ", 3);
    expect(at).toBeGreaterThan(0);
    const stop = free.text.slice(at, at + 2);
    const cut = (await client.completions.create({ ...body, stop: [stop] })).choices[0];
    expect(cut.finish_reason).toBe("stop");
    expect(cut.text).toBe(free.text.slice(0, free.text.indexOf(stop)));
  });

  it("returns log-probs with their top alternatives", async () => {
    const r = await client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "What is 5 times 6?" }],
      temperature: 0,
      max_tokens: 12,
      logprobs: true,
      top_logprobs: 3,
    });
    const lp = r.choices[0].logprobs!.content!;
    expect(lp.length).toBeGreaterThan(0);
    expect(lp.map((t) => t.token).join("")).toBe(r.choices[0].message.content);
    for (const t of lp) {
      expect(t.logprob).toBeLessThanOrEqual(0);
      expect(t.top_logprobs).toHaveLength(3);
      expect(t.top_logprobs[0].token).toBe(t.token); // greedy: the sampled token is the most likely
      expect(t.top_logprobs[0].logprob).toBeCloseTo(t.logprob, 5);
    }
  });

  it("completes a token-id prompt and returns token ids with their log-probs", async () => {
    const tok = server.batcher.tokenizer;
    const ids = tok.encode(tok.applyChatTemplate([system, { role: "user", content: QUESTION }], { addGenerationPrompt: true }));
    const r = await client.completions.create({
      model: "tiny",
      prompt: ids,
      temperature: 0,
      max_tokens: 80,
      logprobs: 0,
      return_tokens_as_token_ids: true,
    } as OpenAI.CompletionCreateParamsNonStreaming);
    const c = r.choices[0];
    const out = c.logprobs!.tokens!.map((t) => {
      expect(t).toMatch(/^token_id:\d+$/);
      return Number(t.slice("token_id:".length));
    });
    expect(c.logprobs!.token_logprobs!.every((x) => x <= 0)).toBe(true);
    expect(out.at(-1)).toBe(tok.eosTokenId); // the closing <|im_end|> is part of what was generated
    expect(tok.decode(out, { skipSpecialTokens: true })).toBe(c.text);
    expect(c.text).toContain("<tool_call>");
    expect(r.usage!.prompt_tokens).toBe(ids.length);
  });

  it("loads a LoRA adapter, serves it by name, and unloads it", async () => {
    const before = tf.memory().numTensors;
    const ask = (model: string) => client.completions.create({ model, prompt: "A box holds", temperature: 0, max_tokens: 8, logprobs: 0 });
    const base = await ask("tiny");
    expect((await post("load_lora_adapter", { lora_name: "sharp", lora_path: adapterDir })).status).toBe(200);
    expect((await post("load_lora_adapter", { lora_name: "sharp", lora_path: adapterDir })).status).toBe(400); // the name is taken
    expect((await client.models.list()).data.map((m) => m.id)).toEqual(["tiny", "sharp"]);
    const [tuned, base2] = await Promise.all([ask("sharp"), ask("tiny")]); // one request each, different adapters
    expect(tuned.choices[0].logprobs!.token_logprobs).not.toEqual(base.choices[0].logprobs!.token_logprobs);
    expect(base2.choices[0].logprobs!.token_logprobs).toEqual(base.choices[0].logprobs!.token_logprobs);
    expect((await post("unload_lora_adapter", { lora_name: "sharp" })).status).toBe(200);
    await expect(ask("sharp")).rejects.toMatchObject({ status: 404 });
    expect((await post("unload_lora_adapter", { lora_name: "sharp" })).status).toBe(404);
    const bad = await post("load_lora_adapter", { lora_name: "nope", lora_path: path.join(adapterDir, "missing") });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { param: string } }).error.param).toBe("lora_path");
    expect(tf.memory().numTensors).toBe(before); // adapters, caches and logits all freed
  });

  it("answers bad requests with OpenAI-shaped 4xx errors and keeps serving", async () => {
    const msg = [{ role: "user" as const, content: "hi" }];
    await expect(client.chat.completions.create({ model: "gpt-4o", messages: msg })).rejects.toMatchObject({
      status: 404,
      code: "model_not_found",
      param: "model",
    });
    await expect(
      client.chat.completions.create({ model: "tiny", messages: msg, temperature: "hot" as unknown as number }),
    ).rejects.toMatchObject({ status: 400, param: "temperature", type: "invalid_request_error" });
    await expect(
      client.chat.completions.create({ model: "tiny", messages: [{ role: "wizard", content: "x" }] as never }),
    ).rejects.toMatchObject({ status: 400, param: "messages[0].role" });
    // A tool message answers a tool call of the assistant message before it, by id, as OpenAI requires.
    const toolMsg = { role: "tool" as const, tool_call_id: "call_b", content: "90" };
    await expect(client.chat.completions.create({ model: "tiny", messages: [...msg, toolMsg] })).rejects.toMatchObject({
      status: 400,
      param: "messages[1]",
      message: expect.stringMatching(/accepted: tool messages right after an assistant message with tool_calls$/),
    });
    const called = {
      role: "assistant" as const,
      content: null,
      tool_calls: [{ id: "call_a", type: "function" as const, function: { name: "calculator", arguments: '{"expression": "6*15"}' } }],
    };
    await expect(client.chat.completions.create({ model: "tiny", messages: [...msg, called, toolMsg] })).rejects.toMatchObject({
      status: 400,
      param: "messages[2].tool_call_id",
      message: expect.stringMatching(/"call_b" names no tool call of messages\[1\]; accepted: "call_a"$/),
    });
    await expect(
      client.chat.completions.create({ model: "tiny", messages: [...msg, called, { ...toolMsg, tool_call_id: "call_a" }, toolMsg] }),
    ).rejects.toMatchObject({ status: 400, param: "messages[3].tool_call_id" });
    await expect(
      client.chat.completions.create({ model: "tiny", messages: [...msg, called, { role: "user", content: "and?" }, toolMsg] }),
    ).rejects.toMatchObject({ status: 400, param: "messages[3]" });
    await expect(client.chat.completions.create({ model: "tiny", messages: msg, max_tokens: 5000 })).rejects.toMatchObject({
      status: 400,
      param: "max_tokens",
    });
    await expect(
      client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "x".repeat(10 * 1024 * 1024) }] }),
    ).rejects.toMatchObject({ status: 413 });
    await expect(client.completions.create({ model: "tiny", prompt: Array.from({ length: 65 }, () => [1, 2]) })).rejects.toMatchObject({
      status: 400,
      param: "prompt",
    });
    const noKey = await post("chat/completions", { model: "tiny", messages: msg }, "wrong");
    expect(noKey.status).toBe(401);
    const broken = await fetch(`${server.url}/v1/completions`, {
      method: "POST",
      headers: { Authorization: "Bearer test-key" },
      body: "{not json",
    });
    expect(broken.status).toBe(400);
    const e = (await broken.json()) as { error: Record<string, unknown> };
    expect(Object.keys(e.error).sort()).toEqual(["code", "message", "param", "type"]);
    const ok = await client.chat.completions.create({ model: "tiny", messages: msg, max_tokens: 4, temperature: 0 });
    expect(ok.choices).toHaveLength(1);
  });

  it("answers 8 concurrent requests, sharing decode batches, with no tensors left behind", async () => {
    const tensors = tf.memory().numTensors;
    const batches = server.batcher.stats.batches;
    const replies = await Promise.all(
      Array.from({ length: 8 }, (_, i) =>
        client.chat.completions.create({
          model: "tiny",
          messages: [{ role: "user", content: `What is ${i + 10} times 3?` }],
          temperature: 0.7,
          seed: i,
          max_tokens: 16,
        }),
      ),
    );
    expect(replies.map((r) => r.choices.length)).toEqual(new Array(8).fill(1));
    expect(server.batcher.stats.batches - batches).toBeLessThan(8);
    expect(server.batcher.stats.maxRowsInBatch).toBeGreaterThan(1);
    // A client that leaves mid-stream stops its rows; the server goes on.
    const abort = new AbortController();
    const stream = await client.chat.completions.create(
      { model: "tiny", messages: [{ role: "user", content: "Count to fifty." }], stream: true, max_tokens: 200 },
      { signal: abort.signal },
    );
    let chunks = 0;
    try {
      for await (const _ of stream) {
        chunks++;
        abort.abort();
      }
    } catch {
      // the client may end the iteration with an abort error or silently
    }
    expect(chunks).toBe(1);
    const after = await client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 4,
      temperature: 0,
    });
    expect(after.choices).toHaveLength(1);
    expect(tf.memory().numTensors).toBe(tensors);
  });
});

describe("batcher queue", () => {
  it("refuses a request with 429 once --max_queue requests wait", async () => {
    const { Batcher } = await import("../../../src/serve/openai/batcher.ts");
    const e = new Batcher(server.batcher.model, server.batcher.tokenizer, { maxQueue: 1, maxBatchRows: 8, batchWaitMs: 0 });
    const params = { temperature: 0, topP: 1, topK: 0, maxTokens: 2, stop: [], stopTokenIds: [], topLogprobs: 0 };
    const first = e.generate({ adapter: null, prompts: [[1, 2, 3]], n: 1, params });
    expect(() => e.generate({ adapter: null, prompts: [[1, 2, 3]], n: 1, params })).toThrow(expect.objectContaining({ status: 429 }));
    expect((await first)[0].tokens).toHaveLength(2);
  });
});
