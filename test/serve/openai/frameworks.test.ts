/** Agent frameworks in their default modes against the served tiny model, over real HTTP:
 *  the Vercel AI SDK's default openai provider (the Responses API) with generateText + a tool,
 *  streamText and generateObject; LangChain's ChatOpenAI withStructuredOutput(zod) by its default
 *  method (response_format json_schema) and by method "functionCalling" (a forced tool call).
 *  The tiny model's free text is not JSON: the objects parse because the server constrains them. */
import { createOpenAI } from "@ai-sdk/openai";
import { ChatOpenAI } from "@langchain/openai";
import { generateObject, generateText, stepCountIs, streamText, tool } from "ai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { calculatorTool, shutdownCalculator } from "../../../src/agents/calculator.ts";
import { SYSTEM_PROMPT } from "../../../src/agents/prompts.ts";
import type { ServingOpenAi } from "../../../src/serve/openai/run.ts";
import { API_KEY, serveTiny } from "./helpers/serve-tiny.ts";

const QUESTION = "Each bag has 15 marbles. How many marbles are in 6 bags?";
const Answer = z.object({
  total: z.number().int(),
  unit: z.enum(["marbles", "bags"]),
  note: z.string(),
  steps: z.array(z.object({ op: z.string(), value: z.number() })).max(2),
  sure: z.boolean(),
  comment: z.string().nullable(), // anyOf [string, null]
});

let server: ServingOpenAi;
beforeAll(async () => {
  server = await serveTiny();
});
afterAll(async () => {
  await server?.close();
  await shutdownCalculator();
});

const checkAnswer = (v: z.infer<typeof Answer>) => {
  expect(Answer.parse(v)).toEqual(v); // the client parsed it; it also fits the schema
  expect(Number.isInteger(v.total)).toBe(true);
  expect(["marbles", "bags"]).toContain(v.unit);
};

describe("Vercel AI SDK, default openai provider (Responses API)", () => {
  const provider = () => createOpenAI({ baseURL: `${server.url}/v1`, apiKey: API_KEY });

  it("generateText with a tool: the model calls it, the SDK runs it, the next step answers", async () => {
    const calculator = tool({
      description: calculatorTool.description,
      inputSchema: z.object({ expression: z.string() }),
      execute: async ({ expression }) => calculatorTool.run({ expression }),
    });
    const r = await generateText({
      model: provider()("tiny"),
      system: SYSTEM_PROMPT,
      prompt: QUESTION,
      tools: { calculator },
      temperature: 0,
      maxOutputTokens: 80,
      stopWhen: stepCountIs(2),
      maxRetries: 0,
    });
    expect(r.steps[0].toolCalls.map((c) => c.toolName)).toEqual(["calculator"]);
    expect(r.steps[0].toolResults.map((t) => t.output)).toEqual(["90"]);
    expect(r.steps[0].finishReason).toBe("tool-calls");
    expect(r.text).toContain("\\boxed{90}");
    expect(r.totalUsage.inputTokens).toBeGreaterThan(0);
  });

  it("streamText streams the reply in pieces", async () => {
    const r = streamText({ model: provider()("tiny"), prompt: "Count to ten.", temperature: 0, maxOutputTokens: 24, maxRetries: 0 });
    const parts: string[] = [];
    for await (const t of r.textStream) parts.push(t);
    expect(parts.length).toBeGreaterThan(1);
    expect(parts.join("")).toBe(await r.text);
    expect(await r.finishReason).toBe("length");
    const whole = await generateText({
      model: provider()("tiny"),
      prompt: "Count to ten.",
      temperature: 0,
      maxOutputTokens: 24,
      maxRetries: 0,
    });
    expect(parts.join("")).toBe(whole.text);
  });

  it("generateObject gets a parsed object valid against the schema", async () => {
    const r = await generateObject({
      model: provider()("tiny"),
      schema: Answer,
      prompt: QUESTION,
      temperature: 0.7,
      seed: 1,
      maxRetries: 0,
    });
    checkAnswer(r.object);
  });
});

describe("LangChain ChatOpenAI", () => {
  const chat = () =>
    new ChatOpenAI({ model: "tiny", apiKey: API_KEY, configuration: { baseURL: `${server.url}/v1` }, temperature: 0, maxRetries: 0 });

  it("withStructuredOutput(zod), default method (json_schema): a parsed object", async () => {
    const v = await chat().withStructuredOutput(Answer).invoke(QUESTION);
    checkAnswer(v);
  });

  it('withStructuredOutput(zod, {method: "functionCalling"}): a parsed object from a forced tool call', async () => {
    const v = await chat().withStructuredOutput(Answer, { method: "functionCalling", name: "answer" }).invoke(QUESTION);
    checkAnswer(v);
  });
});
