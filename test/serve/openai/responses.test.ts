/** POST /v1/responses through the official `openai` client's responses.create: text and message
 *  input with instructions, a function tool called and its output read back as function_call_output,
 *  the streamed event sequence (numbered, its deltas adding up to the whole reply), structured output
 *  by text.format, max_output_tokens ending a reply as "incomplete", and OpenAI-shaped 400s. */
import * as tf from "@tensorflow/tfjs";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { calculatorTool, shutdownCalculator } from "../../../src/agents/calculator.ts";
import { SYSTEM_PROMPT } from "../../../src/agents/prompts.ts";
import type { ServingOpenAi } from "../../../src/serve/openai/run.ts";
import { API_KEY, serveTiny } from "./helpers/serve-tiny.ts";

const QUESTION = "Each bag has 15 marbles. How many marbles are in 6 bags?";
const calculator = {
  type: "function" as const,
  name: calculatorTool.name,
  description: calculatorTool.description,
  parameters: calculatorTool.parameters as Record<string, unknown>,
  strict: false,
};

let server: ServingOpenAi;
let client: OpenAI;
beforeAll(async () => {
  server = await serveTiny();
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: API_KEY, maxRetries: 0 });
});
afterAll(async () => {
  await server?.close();
  await shutdownCalculator();
});

describe("POST /v1/responses", () => {
  it("answers text input, and the same as /v1/chat/completions does", async () => {
    const r = await client.responses.create({ model: "tiny", input: "What is 12 plus 30?", temperature: 0, max_output_tokens: 30 });
    const chat = await client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "What is 12 plus 30?" }],
      temperature: 0,
      max_tokens: 30,
    });
    expect(r.object).toBe("response");
    expect(r.id).toMatch(/^resp-/);
    expect(r.output_text).toBe(chat.choices[0].message.content);
    expect(r.output[0]).toMatchObject({ type: "message", role: "assistant", content: [{ type: "output_text" }] });
    expect(r.usage).toMatchObject({ input_tokens: chat.usage!.prompt_tokens, output_tokens: chat.usage!.completion_tokens });
    expect(r.status).toBe(chat.choices[0].finish_reason === "length" ? "incomplete" : "completed");
  });

  it("calls a function tool, then reads its output back as a function_call_output item", async () => {
    const tensors = tf.memory().numTensors;
    const input: OpenAI.Responses.ResponseInputItem[] = [{ role: "user", content: QUESTION }];
    const first = await client.responses.create({
      model: "tiny",
      instructions: SYSTEM_PROMPT,
      input,
      tools: [calculator],
      temperature: 0,
      max_output_tokens: 80,
    });
    const call = first.output.find((o) => o.type === "function_call");
    if (call?.type !== "function_call") throw new Error(`no function call in ${JSON.stringify(first.output)}`);
    expect(call.name).toBe("calculator");
    const result = String(await calculatorTool.run(JSON.parse(call.arguments)));
    expect(result).toBe("90");
    input.push(...(first.output as OpenAI.Responses.ResponseInputItem[]), {
      type: "function_call_output",
      call_id: call.call_id,
      output: result,
    }); // the turn as it came
    const second = await client.responses.create({
      model: "tiny",
      instructions: SYSTEM_PROMPT,
      input,
      tools: [calculator],
      temperature: 0,
      max_output_tokens: 80,
    });
    expect(second.status).toBe("completed");
    expect(second.output_text).toContain("\\boxed{90}");
    expect(tf.memory().numTensors).toBe(tensors);
  });

  it("streams the Responses event sequence, numbered, its deltas adding up to the reply", async () => {
    const body = {
      model: "tiny",
      instructions: SYSTEM_PROMPT,
      input: QUESTION,
      tools: [calculator],
      temperature: 0,
      max_output_tokens: 80,
    };
    const whole = await client.responses.create(body);
    const types: string[] = [];
    const seqs: number[] = [];
    let args = "";
    let done: OpenAI.Responses.Response | undefined;
    for await (const e of await client.responses.create({ ...body, stream: true })) {
      types.push(e.type);
      seqs.push(e.sequence_number);
      if (e.type === "response.function_call_arguments.delta") args += e.delta;
      if (e.type === "response.completed") done = e.response;
    }
    expect(seqs).toEqual(seqs.map((_, i) => i));
    expect(types.slice(0, 2)).toEqual(["response.created", "response.in_progress"]);
    expect(types.slice(-5)).toEqual([
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
    ]);
    const call = whole.output.find((o) => o.type === "function_call") as OpenAI.Responses.ResponseFunctionToolCall;
    expect(args).toBe(call.arguments);
    expect(done!.output.map((o) => o.type)).toEqual(whole.output.map((o) => o.type));
    expect(done!.usage).toEqual(whole.usage);

    // Text: message item, content part, deltas, and the done events carrying the whole text.
    const text: string[] = [];
    const kinds: string[] = [];
    let final = "";
    for await (const e of await client.responses.create({
      model: "tiny",
      input: "Count to ten.",
      temperature: 0,
      max_output_tokens: 20,
      stream: true,
    })) {
      kinds.push(e.type);
      if (e.type === "response.output_text.delta") text.push(e.delta);
      if (e.type === "response.output_text.done") final = e.text;
    }
    expect(text.length).toBeGreaterThan(1);
    expect(text.join("")).toBe(final);
    expect(kinds.filter((k) => !k.endsWith(".delta"))).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.incomplete", // 20 tokens were not enough to finish
    ]);
  });

  it("honours text.format json_schema and says incomplete when max_output_tokens ends the reply", async () => {
    const schema = {
      type: "object",
      properties: { total: { type: "integer" }, unit: { enum: ["marbles", "bags"] } },
      required: ["total", "unit"],
    };
    const r = await client.responses.create({
      model: "tiny",
      input: QUESTION,
      temperature: 0,
      max_output_tokens: 60,
      text: { format: { type: "json_schema", name: "answer", schema, strict: true } },
    });
    const v = JSON.parse(r.output_text);
    expect(Number.isInteger(v.total)).toBe(true);
    expect(["marbles", "bags"]).toContain(v.unit);
    const cut = await client.responses.create({ model: "tiny", input: QUESTION, max_output_tokens: 2 });
    expect(cut.status).toBe("incomplete");
    expect(cut.incomplete_details).toEqual({ reason: "max_output_tokens" });
  });

  it("answers bad requests with OpenAI-shaped 400s", async () => {
    await expect(client.responses.create({ model: "tiny", input: [] })).rejects.toMatchObject({ status: 400, param: "input" });
    await expect(client.responses.create({ model: "tiny", input: "hi", previous_response_id: "resp_1" })).rejects.toMatchObject({
      status: 400,
      param: "previous_response_id",
    });
    await expect(client.responses.create({ model: "tiny", input: [{ type: "item_reference", id: "msg-none" }] })).rejects.toMatchObject({
      status: 400,
      param: "input[0].id",
    });
    await expect(client.responses.create({ model: "tiny", input: "hi", tools: [{ type: "web_search" }] })).rejects.toMatchObject({
      status: 400,
      param: "tools[0].type",
    });
    await expect(
      client.responses.create({
        model: "tiny",
        input: "hi",
        text: { format: { type: "json_schema", name: "x", schema: { $ref: "#/a" } } },
      }),
    ).rejects.toMatchObject({ status: 400, param: "text.format.schema", message: expect.stringContaining('"$ref"') });
    await expect(client.responses.create({ model: "tiny", input: "hi", max_output_tokens: 5000 })).rejects.toMatchObject({
      status: 400,
      param: "max_output_tokens",
    });
    // A function_call_output answers an earlier function_call of the same call_id, as OpenAI requires.
    const user = { role: "user" as const, content: "hi" };
    const output = { type: "function_call_output" as const, call_id: "call_b", output: "90" };
    await expect(client.responses.create({ model: "tiny", input: [user, output] })).rejects.toMatchObject({
      status: 400,
      param: "input[1].call_id",
      message: expect.stringMatching(/no function_call before it has call_id "call_b"/),
    });
    const callA = { type: "function_call" as const, call_id: "call_a", name: "calculator", arguments: '{"expression": "6*15"}' };
    await expect(client.responses.create({ model: "tiny", input: [user, callA, output] })).rejects.toMatchObject({
      status: 400,
      param: "input[2].call_id",
      message: expect.stringMatching(/accepted: "call_a"$/),
    });
    await expect(client.responses.create({ model: "tiny", input: [{ type: "image_generation_call" } as never] })).rejects.toMatchObject({
      status: 400,
      param: "input[0].type",
      message: expect.stringMatching(/accepted: message, function_call, function_call_output, item_reference, reasoning$/),
    });
    const ok = await client.responses.create({
      model: "tiny",
      input: [user, callA, { ...output, call_id: "call_a" }],
      max_output_tokens: 2,
    });
    expect(ok.object).toBe("response");
  });
});
