/** The JSON-schema recognizer and token mask behind response_format and forced tool calls: prefixes
 *  it takes and refuses, when a value may end, the keywords it refuses with a 400, and random walks
 *  through the token mask that always end in JSON valid against the schema. */
import { describe, expect, it } from "vitest";
import type { Tokenizer } from "../../../src/model/types.ts";
import { advance, canEnd, initialState, toolCallNode, type Node } from "../../../src/serve/openai/json-grammar.ts";
import { compileSchema } from "../../../src/serve/openai/json-schema.ts";
import { takeToken, tokenMask, vocabOf } from "../../../src/serve/openai/token-mask.ts";
import { Rng } from "../../../src/util/rng.ts";

const takes = (node: Node, text: string) => advance(initialState(node), text) !== undefined;
const whole = (node: Node, text: string) => {
  const s = advance(initialState(node), text);
  return s !== undefined && canEnd(s);
};
const schema = (s: unknown, maxString = Infinity) => compileSchema(s, "response_format", { maxString });

const PERSON = schema({
  type: "object",
  properties: {
    name: { type: "string", maxLength: 5 },
    age: { type: "integer", minimum: 0, maximum: 120 },
    score: { type: "number" },
    role: { enum: ["admin", "user"] },
    tags: { type: "array", items: { type: "string" }, minItems: 1, maxItems: 2 },
    address: { type: "object", properties: { city: { type: "string" }, zip: { type: "integer" } }, required: ["city"] },
    active: { type: "boolean" },
    nick: { anyOf: [{ type: "string", maxLength: 3 }, { type: "null" }] },
  },
  required: ["name", "age", "tags"],
  additionalProperties: false,
});

describe("JSON recognizer", () => {
  it("takes any JSON for an empty schema and ends only on a whole value", () => {
    const any = schema({});
    for (const t of ['{"a": [1, -2.5e3, true, null, "x\\"y\\u00e9"]}', "[]", "0", '"s"', "false", "-0.5"]) expect(whole(any, t)).toBe(true);
    for (const t of ['{"a"', "[1,", "-", "1.", "tru", '"abc']) {
      expect(takes(any, t)).toBe(true);
      expect(whole(any, t)).toBe(false);
    }
    for (const t of ['{"a":}', "{,", "[1,]", "01", "1.e5", '"\\x"', "nul1", "{'a': 1}", '{"a":  1}', " {}", "{}}"])
      expect(takes(any, t), t).toBe(false);
  });

  it("holds objects to their declared keys, in order, with every required key", () => {
    const ok = '{"name": "Ann", "age": 41, "tags": ["x"]}';
    expect(whole(PERSON, ok)).toBe(true);
    expect(JSON.parse(ok)).toBeTruthy();
    expect(
      whole(PERSON, '{"name": "Ann", "age": 41, "role": "admin", "tags": ["x", "y"], "address": {"city": "Oslo"}, "active": false}'),
    ).toBe(true);
    expect(takes(PERSON, '{"name": "Ann", "tags"')).toBe(false); // age is required before tags
    expect(takes(PERSON, '{"nickname"')).toBe(false); // not declared
    expect(takes(PERSON, '{"age"')).toBe(false); // name comes first
    expect(takes(PERSON, '{"name": "Ann", "age": 41}')).toBe(false); // tags missing
    expect(takes(PERSON, '{"name": "Annabel"')).toBe(false); // maxLength 5
    expect(takes(schema({ type: "string" }, 4), '"abcde')).toBe(false); // GrammarLimits.maxString
    expect(takes(schema({ type: "string" }), '"a </tool_call>')).toBe(false); // would end a forced call early
    expect(takes(schema({ type: "string" }), '"a <|im_end|')).toBe(true);
    expect(takes(schema({ type: "string" }), '"a <|im_end|>')).toBe(false);
    expect(takes(PERSON, '{"name": "A", "age": 4.5')).toBe(false); // an integer
    expect(takes(PERSON, '{"name": "A", "age": 121')).toBe(false); // maximum 120
    expect(takes(PERSON, '{"name": "A", "age": -1')).toBe(false); // minimum 0
    expect(takes(PERSON, '{"name": "A", "age": 1, "role": "root"')).toBe(false); // enum
    expect(takes(PERSON, '{"name": "A", "age": 1, "tags": []')).toBe(false); // minItems 1
    expect(takes(PERSON, '{"name": "A", "age": 1, "tags": ["a", "b", ')).toBe(false); // maxItems 2
    expect(takes(PERSON, '{"name": "A", "age": 1, "tags": ["a"], "address": {}')).toBe(false); // city required
    expect(takes(PERSON, '{"name": "A", "age": 1, "tags": ["a"], "address": {"zip": 5')).toBe(false);
    expect(takes(PERSON, '{"name": "A", "age": 1, "tags": ["a"], "active": 1')).toBe(false); // a boolean
  });

  it("tells numbers from integers and keeps bounded numbers inside their bounds", () => {
    const n = schema({ type: "number", minimum: 1.5, exclusiveMaximum: 3 });
    expect(whole(n, "2.25")).toBe(true);
    expect(whole(n, "1.5")).toBe(true);
    expect(takes(n, "3")).toBe(false); // nothing that starts with 3 is below 3
    expect(whole(n, "2.9")).toBe(true);
    expect(takes(n, "1.4")).toBe(false);
    expect(takes(n, "0")).toBe(false);
    expect(takes(n, "-")).toBe(false);
    const i = schema({ type: "integer", exclusiveMinimum: 0 });
    expect(whole(i, "7")).toBe(true);
    expect(takes(i, "0")).toBe(false);
    expect(takes(i, "7.")).toBe(false);
    expect(takes(i, "7e")).toBe(false);
    const e = schema({ enum: [1, 12, "a"] });
    expect(whole(e, "1")).toBe(true);
    expect(whole(e, "12")).toBe(true);
    expect(takes(e, "13")).toBe(false);
  });

  it("refuses the keywords it cannot enforce by name, with the field and where", () => {
    const refused = (s: unknown) => {
      try {
        schema(s);
      } catch (err) {
        return { status: (err as { status: number }).status, param: (err as { param: string }).param, message: (err as Error).message };
      }
      throw new Error("accepted");
    };
    expect(refused({ type: "string", pattern: "^a" })).toMatchObject({
      status: 400,
      param: "response_format",
      message: expect.stringContaining('"pattern"'),
    });
    expect(refused({ type: "object", properties: { x: { anyOf: [{ type: "integer" }, { type: "number" }] } } }).message).toMatch(
      /"anyOf".*start with the same character.*\/properties\/x/,
    );
    expect(refused({ allOf: [{ type: "string" }, { maxLength: 3 }] }).message).toContain('"allOf"');
    expect(refused({ $defs: { n: { type: "object", properties: { next: { $ref: "#/$defs/n" } } } }, $ref: "#/$defs/n" }).message).toContain(
      "recursive",
    );
    expect(refused({ $ref: "https://example.com/s.json" }).message).toContain('"$ref"');
    expect(refused({ type: ["string", "null"], pattern: "a" }).message).toContain('"pattern"');
    expect(refused({ oneOf: [] }).message).toContain('"oneOf"');
    expect(refused({ $ref: "#/$defs/a" }).message).toContain('"$ref"');
    expect(refused({ type: "string", format: "email" }).message).toContain('"format"');
    expect(refused({ type: "date" }).message).toContain('"type"');
    expect(refused({ type: "object", required: ["x"] }).message).toContain('"x"');
    // $refs that share a definition expand it each time: 2^24 subschemas here, refused before they are built.
    const defs: Record<string, unknown> = { d0: { type: "integer" } };
    for (let i = 1; i <= 24; i++)
      defs[`d${i}`] = { type: "object", properties: { x: { $ref: `#/$defs/d${i - 1}` }, y: { $ref: `#/$defs/d${i - 1}` } } };
    expect(refused({ $defs: defs, $ref: "#/$defs/d24" }).message).toMatch(
      /expands to more than 10000 subschemas through its \$refs; accepted: at most 10000$/,
    );
  });

  it("takes unions the first character tells apart, and local $refs", () => {
    const nullable = schema({ anyOf: [{ type: "string", maxLength: 3 }, { type: "null" }] });
    expect(whole(nullable, '"abc"')).toBe(true);
    expect(whole(nullable, "null")).toBe(true);
    expect(takes(nullable, '"abcd')).toBe(false);
    expect(takes(nullable, "1")).toBe(false);
    const list = schema({ type: ["integer", "null"], minimum: 0 });
    expect(whole(list, "5")).toBe(true);
    expect(whole(list, "null")).toBe(true);
    expect(takes(list, "-")).toBe(false);
    // Pydantic's shape: nested models under $defs, fields by $ref.
    const pydantic = schema({
      $defs: { Pet: { type: "object", properties: { kind: { enum: ["cat", "dog"] } }, required: ["kind"], title: "Pet" } },
      properties: { pet: { $ref: "#/$defs/Pet" }, friend: { anyOf: [{ $ref: "#/$defs/Pet" }, { type: "null" }], default: null } },
      required: ["pet"],
      title: "Owner",
      type: "object",
    });
    expect(whole(pydantic, '{"pet": {"kind": "cat"}, "friend": null}')).toBe(true);
    expect(whole(pydantic, '{"pet": {"kind": "dog"}, "friend": {"kind": "cat"}}')).toBe(true);
    expect(takes(pydantic, '{"pet": {"kind": "cow')).toBe(false);
  });

  it("forces a tool call: the template's prefix, one of the names, arguments by their schema, the close", () => {
    const call = toolCallNode([
      {
        name: "calculator",
        parameters: schema({ type: "object", properties: { expression: { type: "string" } }, required: ["expression"] }),
      },
      { name: "calc2", parameters: schema({ type: "object", properties: { n: { type: "integer" } }, required: ["n"] }) },
    ]);
    expect(whole(call, '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>')).toBe(true);
    expect(whole(call, '<tool_call>\n{"name": "calc2", "arguments": {"n": 3}}\n</tool_call>')).toBe(true);
    expect(takes(call, '<tool_call>\n{"name": "calc2", "arguments": {"expression"')).toBe(false);
    expect(takes(call, '<tool_call>\n{"name": "other')).toBe(false);
    expect(takes(call, "Sure")).toBe(false);
  });
});

/** A tokenizer over a made-up vocabulary: single characters and some longer pieces. */
function fakeTokenizer(): Tokenizer {
  const pieces = [
    '{"',
    '":',
    '": ',
    '", "',
    '"}',
    "true",
    "false",
    "null",
    "12",
    "<tool_call>",
    "\n</tool_call>",
    "<|im_end|>",
    "\uFFFD",
    "ab",
    " [",
  ];
  for (let c = 32; c < 127; c++) pieces.push(String.fromCharCode(c));
  pieces.push("\n");
  return {
    vocabSize: pieces.length,
    eosTokenId: pieces.indexOf("<|im_end|>"),
    padTokenId: 0,
    decode: (ids: number[]) => ids.map((i) => pieces[i]).join(""),
  } as unknown as Tokenizer;
}

describe("token mask", () => {
  const tok = fakeTokenizer();
  const vocab = vocabOf(tok, tok.vocabSize);
  const stop = [tok.eosTokenId];

  /** Draw allowed tokens at random until the stop token: the mask is never empty on the way. */
  function walk(node: Node, seed: number, maxSteps = 400): { text: string; stopped: boolean } {
    const rng = new Rng(seed);
    let s = initialState(node);
    let text = "";
    for (let n = 0; n < maxSteps; n++) {
      const mask = tokenMask(s, vocab, stop);
      const ids = [...mask.keys()].filter((i) => mask[i] === 1);
      expect(ids.length, `empty mask after ${JSON.stringify(text)}`).toBeGreaterThan(0);
      // Lean towards closing so walks end: the stop token and closing characters are drawn more often.
      const closing = ids.filter((i) => i === tok.eosTokenId || /^[\]}"]/.test(vocab.textOf[i] ?? ""));
      const pool = closing.length > 0 && rng.next() < 0.5 ? closing : ids;
      const id = pool[Math.floor(rng.next() * pool.length)];
      if (id === tok.eosTokenId) return { text, stopped: true };
      s = takeToken(s, vocab, id)!;
      expect(s).not.toBeUndefined();
      text += vocab.textOf[id];
      if (s === null) return { text, stopped: true };
    }
    return { text, stopped: false };
  }

  it("leaves out partial characters and control tokens, and allows the stop token only at the end", () => {
    expect(vocab.textOf[tok.eosTokenId]).toBeNull();
    expect(vocab.texts).not.toContain("\uFFFD");
    const any = schema({ type: "integer" });
    expect(tokenMask(initialState(any), vocab, stop)[tok.eosTokenId]).toBe(0);
    expect(tokenMask(advance(initialState(any), "12")!, vocab, stop)[tok.eosTokenId]).toBe(1);
  });

  it("walks to JSON that parses and fits the schema, every time", () => {
    let stopped = 0;
    for (let seed = 1; seed <= 60; seed++) {
      const { text, stopped: done } = walk(PERSON, seed);
      if (!done) continue; // ran out of steps mid-value, as max_tokens would
      stopped++;
      const v = JSON.parse(text);
      expect(Object.keys(v)).toEqual(expect.arrayContaining(["name", "age", "tags"]));
      expect(typeof v.name === "string" && v.name.length <= 5).toBe(true);
      expect(Number.isInteger(v.age) && v.age >= 0 && v.age <= 120).toBe(true);
      expect(v.tags.length >= 1 && v.tags.length <= 2).toBe(true);
      if ("role" in v) expect(["admin", "user"]).toContain(v.role);
      if ("address" in v) expect(typeof v.address.city).toBe("string");
      if ("active" in v) expect(typeof v.active).toBe("boolean");
      if ("nick" in v) expect(v.nick === null || (typeof v.nick === "string" && v.nick.length <= 3)).toBe(true);
    }
    expect(stopped).toBeGreaterThan(40);
  });

  it("walks a forced tool call to one the tool-call parser reads", async () => {
    const { parseToolCalls } = await import("../../../src/agents/toolcall.ts");
    const call = toolCallNode([
      {
        name: "calculator",
        parameters: schema({ type: "object", properties: { expression: { type: "string" } }, required: ["expression"] }),
      },
    ]);
    for (let seed = 1; seed <= 10; seed++) {
      const { text, stopped } = walk(call, seed);
      if (!stopped) continue;
      const parsed = parseToolCalls(text);
      expect(parsed.errors).toEqual([]);
      expect(parsed.calls[0].name).toBe("calculator");
      expect(typeof parsed.calls[0].arguments.expression).toBe("string");
    }
  });
});
