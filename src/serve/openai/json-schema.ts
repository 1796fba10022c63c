/** A JSON schema → the grammar constrained decoding enforces (json-grammar.ts). Every keyword is
 *  either enforced or refused with a 400 that names it and where it is; none is silently ignored.
 *  Enforced: type (one, or a list), properties, required, additionalProperties, items, minItems,
 *  maxItems, minLength, maxLength, minimum, maximum, exclusiveMinimum, exclusiveMaximum, enum, const;
 *  anyOf / oneOf / type lists whose alternatives start with different characters (so the first
 *  character picks one: a string or null, an object or an array; not an integer or a number); allOf
 *  of one schema; $ref to #/$defs/... or #/definitions/... (not recursive). Annotations are read and
 *  not enforced (title, description, default, examples, ...). Refused besides: a schema nested more than
 *  MAX_SCHEMA_DEPTH levels deep (its JSON, or the levels its $refs expand to), one that expands to more
 *  than MAX_SUBSCHEMAS subschemas, and bounds no value meets (minLength > maxLength, an empty type
 *  list, a number range with nothing writable in it): every schema accepted can be completed. */
import { badField } from "./errors.ts";
import { firstChars, numFeasible, NUMBER_MAX_CHARS, type Node } from "./json-grammar.ts";

/** Past this depth a request's recursion (ours, the chat template's) could overflow the stack. */
export const MAX_SCHEMA_DEPTH = 64;
/** $refs may share a definition many times over: the grammar they expand to is bounded too. */
export const MAX_SUBSCHEMAS = 10_000;

export interface GrammarLimits {
  /** The longest string a schema without maxLength gets (a weak model may never close one). */
  maxString: number;
}

const ANNOTATIONS = new Set(
  ["title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly"].concat([
    "$schema",
    "$id",
    "$comment",
    "$defs",
    "definitions",
  ]),
);
const SUPPORTED: Record<string, string[]> = {
  object: ["properties", "required", "additionalProperties"],
  array: ["items", "minItems", "maxItems"],
  string: ["minLength", "maxLength"],
  number: ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"],
  integer: ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"],
  boolean: [],
  null: [],
};
const COMBINATORS = ["anyOf", "oneOf", "allOf", "$ref"];

type Schema = Record<string, unknown>;
const isObj = (v: unknown): v is Schema => typeof v === "object" && v !== null && !Array.isArray(v);

/** `param` names the request field the schema came in, for the 400s. */
export function compileSchema(schema: unknown, param: string, limits: GrammarLimits): Node {
  checkSchemaDepth(schema, param);
  return new Compiler(param, limits, schema).compile(schema, "", [], 1);
}

const tooDeep = (param: string) =>
  badField(param, `the schema nests more than ${MAX_SCHEMA_DEPTH} levels deep; accepted: at most ${MAX_SCHEMA_DEPTH}`);

/** Refuses a value whose objects and arrays nest more than MAX_SCHEMA_DEPTH levels, without
 *  recursing (a 125 KB body can nest 5,000 deep). For every schema a request carries, compiled or not. */
export function checkSchemaDepth(schema: unknown, param: string): void {
  const stack: [unknown, number][] = [[schema, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (typeof v !== "object" || v === null) continue;
    if (depth > MAX_SCHEMA_DEPTH) throw tooDeep(param);
    for (const child of Object.values(v)) stack.push([child, depth + 1]);
  }
}

class Compiler {
  private subschemas = 0;

  constructor(
    readonly param: string,
    readonly limits: GrammarLimits,
    readonly root: unknown,
  ) {}

  refuse(what: string, at: string): Error {
    return badField(this.param, `${what}${at ? ` (at ${at})` : ""}`);
  }

  /** `refs`: the $refs being expanded on the way here (a repeat is recursion); `depth`: this schema's
   *  level, counting the levels $refs expand to. */
  compile(schema: unknown, at: string, refs: string[], depth: number): Node {
    if (depth > MAX_SCHEMA_DEPTH) throw tooDeep(this.param);
    if (++this.subschemas > MAX_SUBSCHEMAS)
      throw this.refuse(
        `the schema expands to more than ${MAX_SUBSCHEMAS} subschemas through its $refs; accepted: at most ${MAX_SUBSCHEMAS}`,
        "",
      );
    const ANY: Node = { kind: "any", maxString: this.limits.maxString };
    if (schema === true) return ANY;
    if (!isObj(schema)) throw this.refuse(`expected a JSON schema object, got ${JSON.stringify(schema)}`, at);
    const combinator = COMBINATORS.find((k) => k in schema);
    if (combinator) {
      const extra = Object.keys(schema).find((k) => k !== combinator && !ANNOTATIONS.has(k));
      if (extra) throw this.refuse(`"${extra}" beside "${combinator}" is not supported by constrained decoding here`, at);
      return this.combine(combinator, schema[combinator], at, refs, depth);
    }
    if ("enum" in schema || "const" in schema) {
      const values = "const" in schema ? [schema.const] : schema.enum;
      if (!Array.isArray(values) || values.length === 0) throw this.refuse(`"enum" must be a non-empty list`, at);
      return { kind: "lit", options: values.map((v) => JSON.stringify(v)) };
    }
    let type = schema.type;
    if (Array.isArray(type)) {
      if (type.length === 0) throw this.refuse(`"type" must be a non-empty list of types`, at);
      // A list of types: one schema per type, each with the keywords that apply to it.
      const known = new Set(type.flatMap((t) => SUPPORTED[t as string] ?? []));
      const bad = Object.keys(schema).find((k) => k !== "type" && !ANNOTATIONS.has(k) && !known.has(k));
      if (bad) throw this.refuse(`the keyword "${bad}" is not supported by constrained decoding here for types ${type.join(", ")}`, at);
      const pick = (t: string) => Object.fromEntries(Object.entries(schema).filter(([k]) => SUPPORTED[t]?.includes(k)));
      return this.union(
        type.map((t, i) => this.compile({ ...pick(t as string), type: t }, `${at}/type/${i}`, refs, depth)),
        "type",
        at,
      );
    }
    if (type === undefined)
      type = "properties" in schema || "additionalProperties" in schema ? "object" : "items" in schema ? "array" : undefined;
    const allowed = type === undefined ? [] : SUPPORTED[type as string];
    if (type !== undefined && allowed === undefined)
      throw this.refuse(
        `the keyword "type" with ${JSON.stringify(type)} is not supported; accepted: ${Object.keys(SUPPORTED).join(", ")}`,
        at,
      );
    for (const k of Object.keys(schema))
      if (k !== "type" && !ANNOTATIONS.has(k) && !allowed.includes(k))
        throw this.refuse(`the keyword "${k}" is not supported by constrained decoding here${type ? ` for type ${type}` : ""}`, at);
    const int = (k: string, def: number) => {
      const v = schema[k];
      if (v === undefined) return def;
      if (!Number.isInteger(v) || (v as number) < 0) throw this.refuse(`"${k}" must be a non-negative integer`, at);
      return v as number;
    };
    switch (type) {
      case undefined:
        return ANY;
      case "string": {
        // Without maxLength, at most GrammarLimits.maxString characters, or minLength if that is more.
        const min = int("minLength", 0);
        const max = schema.maxLength === undefined ? Math.max(min, this.limits.maxString) : int("maxLength", 0);
        if (min > max) throw this.refuse(`minLength ${min} > maxLength ${max}`, at);
        return { kind: "string", min, max };
      }
      case "boolean":
        return { kind: "lit", options: ["true", "false"] };
      case "null":
        return { kind: "lit", options: ["null"] };
      case "number":
      case "integer":
        return this.number(schema, type === "integer", at);
      case "array": {
        const items = schema.items === undefined ? ANY : this.compile(schema.items, `${at}/items`, refs, depth + 1);
        const node: Node = { kind: "array", items, min: int("minItems", 0), max: int("maxItems", Infinity) };
        if (node.min > node.max) throw this.refuse(`minItems ${node.min} > maxItems ${node.max}`, at);
        return node;
      }
      default:
        return this.object(schema, at, refs, ANY, depth);
    }
  }

  object(schema: Schema, at: string, refs: string[], ANY: Node, depth: number): Node {
    const extra = schema.additionalProperties;
    const values =
      extra === undefined || extra === true || extra === false ? ANY : this.compile(extra, `${at}/additionalProperties`, refs, depth + 1);
    const required = schema.required ?? [];
    if (!Array.isArray(required) || required.some((r) => typeof r !== "string"))
      throw this.refuse(`"required" must be a list of names`, at);
    if (schema.properties === undefined && required.length > 0)
      throw this.refuse(`"required" names "${required[0]}", which is not in "properties"`, at);
    if (schema.properties === undefined)
      return extra === false ? { kind: "lit", options: ["{}"] } : { kind: "object", props: null, values };
    if (!isObj(schema.properties)) throw this.refuse(`"properties" must be an object`, at);
    const props = Object.entries(schema.properties).map(([key, s]) => ({
      key,
      node: this.compile(s, `${at}/properties/${key}`, refs, depth + 1),
      required: required.includes(key),
    }));
    const missing = required.find((r) => !props.some((p) => p.key === r));
    if (missing !== undefined) throw this.refuse(`"required" names "${missing}", which is not in "properties"`, at);
    return { kind: "object", props, values };
  }

  combine(k: string, v: unknown, at: string, refs: string[], depth: number): Node {
    if (k === "$ref") {
      const m = typeof v === "string" ? /^#\/(\$defs|definitions)\/([^/]+)$/.exec(v) : null;
      if (!m) throw this.refuse(`"$ref" ${JSON.stringify(v)} is not supported; only #/$defs/<name> and #/definitions/<name>`, at);
      if (refs.includes(v as string))
        throw this.refuse(`the "$ref" ${v} is recursive, which constrained decoding here does not support`, at);
      const defs = isObj(this.root) ? this.root[m[1]] : undefined;
      const target = isObj(defs) ? defs[m[2]] : undefined;
      if (target === undefined) throw this.refuse(`"$ref" ${v} names nothing in the schema`, at);
      return this.compile(target, v as string, [...refs, v as string], depth + 1);
    }
    if (!Array.isArray(v) || v.length === 0) throw this.refuse(`"${k}" must be a non-empty list of schemas`, at);
    if (k === "allOf") {
      if (v.length > 1) throw this.refuse(`"allOf" of more than one schema is not supported by constrained decoding here`, at);
      return this.compile(v[0], `${at}/allOf/0`, refs, depth + 1);
    }
    return this.union(
      v.map((s, i) => this.compile(s, `${at}/${k}/${i}`, refs, depth + 1)),
      k,
      at,
    );
  }

  /** Alternatives the first character tells apart (then anyOf and oneOf are the same thing). */
  union(options: Node[], k: string, at: string): Node {
    if (options.length === 1) return options[0];
    const seen = new Set<string>();
    for (const o of options)
      for (const c of firstChars(o)) {
        if (seen.has(c))
          throw this.refuse(
            `the alternatives of "${k}" can start with the same character (${JSON.stringify(c)}); constrained ` +
              `decoding here tells them apart by it`,
            at,
          );
        seen.add(c);
      }
    return { kind: "union", options };
  }

  number(s: Schema, integer: boolean, at: string): Node {
    const bound = (k: string) => {
      const v = s[k];
      if (v !== undefined && (typeof v !== "number" || !Number.isFinite(v))) throw this.refuse(`"${k}" must be a number`, at);
      return v as number | undefined;
    };
    const [min, max, xmin, xmax] = [bound("minimum"), bound("maximum"), bound("exclusiveMinimum"), bound("exclusiveMaximum")];
    let lo = min ?? -Infinity;
    let hi = max ?? Infinity;
    let loOpen = false;
    let hiOpen = false;
    if (xmin !== undefined && xmin >= lo) [lo, loOpen] = [xmin, true];
    if (xmax !== undefined && xmax <= hi) [hi, hiOpen] = [xmax, true];
    if (integer) {
      // Integers: the bounds as the nearest integers inside them; past 2^53, where a double cannot
      // step by 1, an exclusive bound stays exclusive.
      const [ilo, ihi] = [loOpen ? Math.floor(lo) + 1 : Math.ceil(lo), hiOpen ? Math.ceil(hi) - 1 : Math.floor(hi)];
      [lo, loOpen] = ilo > lo || !loOpen ? [ilo, false] : [lo, true];
      [hi, hiOpen] = ihi < hi || !hiOpen ? [ihi, false] : [hi, true];
    }
    const what = integer ? "integer" : "number";
    const given = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]
      .filter((k) => s[k] !== undefined)
      .map((k) => `${k} ${s[k]}`);
    if (lo > hi || (lo === hi && (loOpen || hiOpen))) throw this.refuse(`no ${what} lies within the bounds (${given.join(", ")})`, at);
    const node: Node = { kind: "number", integer, lo, hi, loOpen, hiOpen };
    if (!numFeasible(node, ""))
      throw this.refuse(
        `no ${what} within the bounds (${given.join(", ")}) can be written in ${NUMBER_MAX_CHARS} characters without an exponent; ` +
          "accepted: bounds with one that can",
        at,
      );
    return node;
  }
}
