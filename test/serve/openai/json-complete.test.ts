/** Every schema the compiler accepts can be completed: random schemas (bounds drawn to collide often:
 *  minLength above maxLength, number ranges too narrow or too far out to write, empty type lists,
 *  $refs, unions) are compiled; each one accepted is walked character by character, taking any
 *  character the recognizer allows, until it may end. The walk never meets a dead end, and what it
 *  writes parses. A refused schema is refused with a 400 naming the field, never another error. */
import { describe, expect, it } from "vitest";
import { ApiError } from "../../../src/serve/openai/errors.ts";
import { canEnd, initialState, step, type Node, type State } from "../../../src/serve/openai/json-grammar.ts";
import { compileSchema } from "../../../src/serve/openai/json-schema.ts";
import { Rng } from "../../../src/util/rng.ts";

type Schema = Record<string, unknown>;

const BOUNDS = [-1e40, -1e21, -100, -1.5, -1, -0.1, 0, 1e-7, 0.1, 1 / 3, 0.5, 1, 1.0000000000000002, 2, 10, 99, 1e15, 1e21, 1e30, 1e40];
const NUMBER_KEYS = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];

function randomSchema(rng: Rng, depth: number): Schema {
  const leaf = depth >= 3;
  const kind = rng.pick(
    leaf ? ["string", "number", "integer", "lit"] : ["string", "number", "integer", "lit", "array", "object", "union", "types"],
  );
  const maybe = (p: number, k: string, v: () => unknown): Schema => (rng.next() < p ? { [k]: v() } : {});
  switch (kind) {
    case "string":
      return { type: "string", ...maybe(0.5, "minLength", () => rng.int(0, 6)), ...maybe(0.5, "maxLength", () => rng.int(0, 6)) };
    case "number":
    case "integer": {
      const s: Schema = { type: kind };
      for (const k of NUMBER_KEYS) if (rng.next() < 0.35) s[k] = rng.pick(BOUNDS);
      return s;
    }
    case "lit":
      return rng.pick([{ type: "boolean" }, { type: "null" }, { enum: rng.pick([[1, 12, "a"], ["x"], [null, true, 0.5], [{ a: [1] }]]) }]);
    case "array":
      return {
        type: "array",
        items: randomSchema(rng, depth + 1),
        ...maybe(0.4, "minItems", () => rng.int(0, 3)),
        ...maybe(0.4, "maxItems", () => rng.int(0, 3)),
      };
    case "object": {
      const keys = ["a", "b", "c"].slice(0, rng.int(0, 3));
      const properties = Object.fromEntries(keys.map((k) => [k, randomSchema(rng, depth + 1)]));
      return {
        type: "object",
        ...(keys.length > 0 || rng.next() < 0.5 ? { properties } : {}),
        required: keys.filter(() => rng.next() < 0.5),
        ...maybe(0.4, "additionalProperties", () => rng.pick<unknown>([false, true, randomSchema(rng, depth + 1)])),
      };
    }
    case "union":
      return { anyOf: [randomSchema(rng, depth + 1), randomSchema(rng, depth + 1)] };
    default: {
      const types = ["string", "null", "integer", "boolean", "array", "object"].filter(() => rng.next() < 0.3);
      const s: Schema = { type: types, ...maybe(0.5, "minLength", () => rng.int(0, 4)), ...maybe(0.5, "maxLength", () => rng.int(0, 4)) };
      if (types.includes("integer")) for (const k of NUMBER_KEYS) if (rng.next() < 0.3) s[k] = rng.pick(BOUNDS);
      return s;
    }
  }
}

/** Printable ASCII and a newline: every character JSON's grammar can need. */
const ALPHABET = [...Array.from({ length: 95 }, (_, i) => String.fromCharCode(32 + i)), "\n"];

/** One walk: any allowed character, closing ones more often, ending at random once it may
 *  (`endRate` 0: only when nothing else is allowed, which drives numbers to their longest). */
function walk(node: Node, rng: Rng, maxSteps = 400, endRate = 0.3): { text: string; dead: boolean; ended: boolean } {
  let s: State = initialState(node);
  let text = "";
  for (let n = 0; n < maxSteps; n++) {
    const allowed = ALPHABET.filter((c) => step(s, c) !== undefined);
    const mayEnd = canEnd(s);
    if (allowed.length === 0 && !mayEnd) return { text, dead: true, ended: false };
    if (mayEnd && (allowed.length === 0 || rng.next() < endRate)) return { text, dead: false, ended: true };
    const closing = allowed.filter((c) => c === '"' || c === "]" || c === "}");
    const c = rng.pick(closing.length > 0 && rng.next() < 0.5 ? closing : allowed);
    s = step(s, c)!;
    text += c;
  }
  return { text, dead: false, ended: false }; // out of steps mid-value, as max_tokens would end it
}

describe("every schema the compiler accepts can be completed", () => {
  it("random schemas: no dead end on any walk, and every finished walk parses", () => {
    const rng = new Rng(49);
    let accepted = 0;
    let refused = 0;
    let ended = 0;
    for (let i = 0; i < 400; i++) {
      const schema = randomSchema(rng, 0);
      const maxString = rng.pick([4, Infinity]);
      let node: Node;
      try {
        node = compileSchema(schema, "response_format", { maxString });
      } catch (err) {
        expect(err, JSON.stringify(schema)).toBeInstanceOf(ApiError);
        expect((err as ApiError).status).toBe(400);
        expect((err as Error).message).not.toContain("\n");
        refused++;
        continue;
      }
      accepted++;
      for (let w = 0; w < 3; w++) {
        const r = walk(node, rng);
        expect(r.dead, `dead end after ${JSON.stringify(r.text)} for ${JSON.stringify(schema)}`).toBe(false);
        if (!r.ended) continue;
        ended++;
        expect(() => JSON.parse(r.text), `${JSON.stringify(r.text)} for ${JSON.stringify(schema)}`).not.toThrow();
      }
    }
    // Both sides are exercised: most schemas are accepted and walked, and some are refused.
    expect(accepted).toBeGreaterThan(200);
    expect(refused).toBeGreaterThan(20);
    expect(ended).toBeGreaterThan(500);
  });

  it("numbers between every two bounds, written as long as they may be: no dead end, and each parses inside its bounds", () => {
    const rng = new Rng(50);
    for (const type of ["number", "integer"])
      for (const [kLo, kHi] of [
        ["minimum", "maximum"],
        ["exclusiveMinimum", "exclusiveMaximum"],
      ])
        for (const lo of BOUNDS)
          for (const hi of [...BOUNDS, undefined]) {
            const schema = { type, [kLo]: lo, ...(hi === undefined ? {} : { [kHi]: hi }) };
            let node: Node;
            try {
              node = compileSchema(schema, "response_format", { maxString: Infinity });
            } catch (err) {
              expect((err as ApiError).status, JSON.stringify(schema)).toBe(400);
              continue;
            }
            const r = walk(node, rng, 40, 0);
            expect(r.dead, `dead end after ${JSON.stringify(r.text)} for ${JSON.stringify(schema)}`).toBe(false);
            const v = JSON.parse(r.text) as number;
            const inside = (kLo === "minimum" ? v >= lo : v > lo) && (hi === undefined || (kHi === "maximum" ? v <= hi : v < hi));
            expect(inside && (type === "number" || Number.isInteger(v)), `${r.text} for ${JSON.stringify(schema)}`).toBe(true);
          }
  });
});
