/** Structured output on the OpenAI server, through the official `openai` client: response_format
 *  json_object and json_schema enforced by the token mask (the tiny model's own output does not
 *  parse; the constrained output does, and fits the schema), tool_choice "required" and a named
 *  function forcing a call with arguments valid for the tool, an honest finish_reason "length" when
 *  the budget ends mid-value, 400s naming unsupported schema keywords, and no tensors left behind. */
import * as tf from "@tensorflow/tfjs";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ServingOpenAi } from "../../../src/serve/openai/run.ts";
import { API_KEY, serveTiny } from "./helpers/serve-tiny.ts";

let server: ServingOpenAi;
let client: OpenAI;

beforeAll(async () => {
  server = await serveTiny();
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: API_KEY, maxRetries: 0 });
});
afterAll(async () => {
  await server?.close();
});

const ask = [{ role: "user" as const, content: "Each bag has 15 marbles. How many marbles are in 6 bags? Answer in JSON." }];
const ORDER = {
  type: "object",
  properties: {
    item: { type: "string", maxLength: 12 },
    count: { type: "integer", minimum: 1, maximum: 99 },
    price: { type: "number" },
    size: { enum: ["small", "large"] },
    gift: { type: "boolean" },
    tags: { type: "array", items: { type: "string", maxLength: 6 }, maxItems: 3 },
    ship: { type: "object", properties: { city: { type: "string", maxLength: 10 } }, required: ["city"], additionalProperties: false },
  },
  required: ["item", "count", "size", "ship"],
  additionalProperties: false,
};

describe("response_format", () => {
  it("json_object: the reply parses as a JSON object, where the free reply does not", async () => {
    const free = await client.chat.completions.create({ model: "tiny", messages: ask, temperature: 0, max_tokens: 60 });
    expect(() => JSON.parse(free.choices[0].message.content!)).toThrow();
    const tensors = tf.memory().numTensors;
    const r = await client.chat.completions.create({
      model: "tiny",
      messages: ask,
      temperature: 0.8,
      seed: 3,
      n: 4,
      max_tokens: 200,
      response_format: { type: "json_object" },
    });
    for (const c of r.choices) {
      if (c.finish_reason === "length") continue; // a value the budget cut: not JSON, and said so
      expect(c.finish_reason).toBe("stop");
      const v = JSON.parse(c.message.content!);
      expect(typeof v === "object" && v !== null && !Array.isArray(v)).toBe(true);
    }
    expect(r.choices.filter((c) => c.finish_reason === "stop").length).toBeGreaterThan(0);
    expect(tf.memory().numTensors).toBe(tensors);
  });

  it("json_schema: every reply parses and fits the schema (nesting, enums, integers, required)", async () => {
    const r = await client.chat.completions.create({
      model: "tiny",
      messages: ask,
      temperature: 1,
      seed: 7,
      n: 6,
      max_tokens: 300,
      response_format: { type: "json_schema", json_schema: { name: "order", schema: ORDER, strict: true } },
    });
    for (const c of r.choices) {
      expect(c.finish_reason).toBe("stop");
      const v = JSON.parse(c.message.content!);
      expect(Object.keys(v)).toEqual(expect.arrayContaining(["item", "count", "size", "ship"]));
      expect(Object.keys(v).every((k) => k in ORDER.properties)).toBe(true);
      expect(typeof v.item === "string" && v.item.length <= 12).toBe(true);
      expect(Number.isInteger(v.count) && v.count >= 1 && v.count <= 99).toBe(true);
      expect(["small", "large"]).toContain(v.size);
      expect(typeof v.ship.city).toBe("string");
      if ("price" in v) expect(typeof v.price).toBe("number");
      if ("gift" in v) expect(typeof v.gift).toBe("boolean");
      if ("tags" in v) expect(v.tags.length).toBeLessThanOrEqual(3);
    }
  });

  it("says finish_reason length when max_tokens ends the value", async () => {
    const r = await client.chat.completions.create({
      model: "tiny",
      messages: ask,
      temperature: 0,
      max_tokens: 3,
      response_format: { type: "json_schema", json_schema: { name: "order", schema: ORDER } },
    });
    expect(r.choices[0].finish_reason).toBe("length");
    const text = r.choices[0].message.content!;
    expect(text.startsWith("{")).toBe(true);
    expect(() => JSON.parse(text)).toThrow();
  });

  it("refuses a schema keyword it cannot enforce, by name, and keeps serving", async () => {
    const bad = (schema: object) =>
      client.chat.completions.create({
        model: "tiny",
        messages: ask,
        response_format: { type: "json_schema", json_schema: { name: "x", schema: schema as Record<string, unknown> } },
      });
    await expect(bad({ type: "object", properties: { a: { type: "string", pattern: "^x" } } })).rejects.toMatchObject({
      status: 400,
      param: "response_format.json_schema.schema",
      message: expect.stringContaining('"pattern"'),
    });
    await expect(bad({ oneOf: [{ type: "integer" }, { type: "number" }] })).rejects.toMatchObject({
      message: expect.stringContaining('"oneOf"'),
    });
    await expect(
      client.chat.completions.create({ model: "tiny", messages: ask, response_format: { type: "yaml" } as never }),
    ).rejects.toMatchObject({ status: 400, param: "response_format" });
    const ok = await client.chat.completions.create({ model: "tiny", messages: ask, max_tokens: 2 });
    expect(ok.choices).toHaveLength(1);
  });
});

describe("schemas it cannot honour get a 400 naming the limit, on every route that takes one", () => {
  const post = (route: string, body: string) =>
    fetch(`${server.url}/v1/${route}`, {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${API_KEY}` },
      body,
    });
  /** The places a schema comes in (chat response_format, responses text.format, a forced tool's
   *  parameters, tools offered to either API), as body texts: a 5,000-deep schema overflows JSON.stringify. */
  const routes = (schema: string): [string, string][] =>
    (
      [
        [
          "chat/completions",
          { model: "tiny", messages: ask, max_tokens: 4, response_format: { type: "json_schema", json_schema: { name: "x", schema: 0 } } },
        ],
        [
          "responses",
          { model: "tiny", input: "hi", max_output_tokens: 4, text: { format: { type: "json_schema", name: "x", schema: 0 } } },
        ],
        [
          "chat/completions",
          {
            model: "tiny",
            messages: ask,
            max_tokens: 4,
            tools: [{ type: "function", function: { name: "f", parameters: 0 } }],
            tool_choice: { type: "function", function: { name: "f" } },
          },
        ],
        [
          "chat/completions",
          { model: "tiny", messages: ask, max_tokens: 4, tools: [{ type: "function", function: { name: "f", parameters: 0 } }] },
        ],
        ["responses", { model: "tiny", input: "hi", max_output_tokens: 4, tools: [{ type: "function", name: "f", parameters: 0 }] }],
      ] as const
    ).map(([route, body]) => [route, JSON.stringify(body).replace(/"(schema|parameters)":0/, `"$1":${schema}`)]);
  const nested = (levels: number, wrap: (inner: string) => string, inner: string) => {
    let text = inner;
    for (let i = 0; i < levels; i++) text = wrap(text);
    return text;
  };
  const error = async (r: Response) => ((await r.json()) as { error: { message: string } }).error.message;

  it("a schema nested 5,000 deep (125 KB): 400 naming the depth limit (64), not a 500", async () => {
    const deep = nested(5000, (s) => `{"type":"object","properties":{"a":${s}}}`, `{"type":"string"}`);
    for (const [route, body] of routes(deep)) {
      const r = await post(route, body);
      expect(r.status, route).toBe(400);
      expect(await error(r)).toMatch(/nests more than 64 levels deep; accepted: at most 64$/);
    }
    // 64 levels of objects and arrays are taken; 65 are not. $refs count as the levels they expand to.
    const items = (levels: number) => nested(levels - 1, (s) => `{"type":"array","maxItems":0,"items":${s}}`, `{"type":"integer"}`);
    for (const [route, body] of routes(items(64))) expect((await post(route, body)).status, route).toBe(200);
    for (const [route, body] of routes(items(65))) expect((await post(route, body)).status, route).toBe(400);
    const defs = Array.from({ length: 100 }, (_, i) => `"d${i}":{"type":"array","maxItems":0,"items":{"$ref":"#/$defs/d${i + 1}"}}`);
    const chain = `{"$defs":{${defs.join(",")},"d100":{"type":"integer"}},"$ref":"#/$defs/d0"}`;
    const r = await post(...routes(chain)[0]);
    expect(r.status).toBe(400);
    expect(await error(r)).toMatch(/nests more than 64 levels deep; accepted: at most 64$/);
  });

  it("contradictory bounds of every kind: 400 naming both", async () => {
    for (const [schema, message] of [
      [{ type: "string", minLength: 5, maxLength: 2 }, /minLength 5 > maxLength 2/],
      [{ type: "array", minItems: 3, maxItems: 1 }, /minItems 3 > maxItems 1/],
      [{ type: "integer", minimum: 5, maximum: 2 }, /no integer .*lies within the bounds/],
      [{ type: "number", exclusiveMinimum: 1, maximum: 1 }, /no number .*lies within the bounds/],
      [{ type: "integer", minimum: 1e40 }, /can be written in 32 characters without an exponent/],
      [{ type: [] }, /"type" must be a non-empty list/],
    ] as const)
      for (const [route, body] of routes(JSON.stringify({ type: "object", properties: { v: schema }, required: ["v"] })).slice(0, 3)) {
        const r = await post(route, body);
        expect(r.status, `${route} ${JSON.stringify(schema)}`).toBe(400);
        expect(await error(r)).toMatch(message);
      }
    // A minLength beyond --max_json_string (32 here) is honoured: the string is written that long.
    const long = await client.chat.completions.create({
      model: "tiny",
      messages: ask,
      max_tokens: 120,
      temperature: 0,
      response_format: { type: "json_schema", json_schema: { name: "s", schema: { type: "string", minLength: 40 } } },
    });
    expect(long.choices[0].finish_reason).toBe("stop");
    expect(JSON.parse(long.choices[0].message.content!).length).toBeGreaterThanOrEqual(40);
  });
});

const weather = {
  type: "function" as const,
  function: {
    name: "get_weather",
    description: "Weather in a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string", maxLength: 12 }, unit: { enum: ["c", "f"] } },
      required: ["city", "unit"],
    },
  },
};
const lookup = {
  type: "function" as const,
  function: {
    name: "lookup",
    description: "Look a word up",
    parameters: { type: "object", properties: { word: { type: "string" } }, required: ["word"] },
  },
};

describe("tool_choice", () => {
  it("a named function: the reply is a call to it with arguments valid for its schema", async () => {
    for (const stream of [false, true]) {
      const body = {
        model: "tiny",
        messages: [{ role: "user" as const, content: "What is the weather in Oslo?" }],
        tools: [lookup, weather],
        tool_choice: { type: "function" as const, function: { name: "get_weather" } },
        temperature: 0,
        max_tokens: 80,
      };
      let call: { name: string; arguments: string };
      if (!stream) {
        const r = await client.chat.completions.create(body);
        expect(r.choices[0].finish_reason).toBe("tool_calls");
        const tc = r.choices[0].message.tool_calls![0];
        call = (tc as { function: { name: string; arguments: string } }).function;
      } else {
        const s = await client.chat.completions.create({ ...body, stream: true });
        const calls = [];
        for await (const c of s) calls.push(...(c.choices[0]?.delta.tool_calls ?? []));
        call = calls[0].function as { name: string; arguments: string };
      }
      expect(call.name).toBe("get_weather");
      const args = JSON.parse(call.arguments);
      expect(typeof args.city === "string" && args.city.length <= 12).toBe(true);
      expect(["c", "f"]).toContain(args.unit);
    }
  });

  it('"required": the reply is a call to one of the tools', async () => {
    const r = await client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "Hello there" }],
      tools: [lookup, weather],
      tool_choice: "required",
      temperature: 1,
      seed: 4,
      n: 4,
      max_tokens: 80,
    });
    for (const c of r.choices) {
      expect(c.finish_reason).toBe("tool_calls");
      const f = (c.message.tool_calls![0] as { function: { name: string; arguments: string } }).function;
      expect(["lookup", "get_weather"]).toContain(f.name);
      expect(Object.keys(JSON.parse(f.arguments))).toContain(f.name === "lookup" ? "word" : "city");
    }
  });

  it("refuses a name no tool has, and a forced call without tools", async () => {
    const msg = [{ role: "user" as const, content: "hi" }];
    await expect(
      client.chat.completions.create({
        model: "tiny",
        messages: msg,
        tools: [lookup],
        tool_choice: { type: "function", function: { name: "nope" } },
      }),
    ).rejects.toMatchObject({ status: 400, param: "tool_choice", message: expect.stringContaining("nope") });
    await expect(client.chat.completions.create({ model: "tiny", messages: msg, tool_choice: "required" })).rejects.toMatchObject({
      status: 400,
      param: "tool_choice",
    });
  });
});
