/** Constrained decoding for the OpenAI server: a JSON schema compiled to a grammar, an incremental
 *  character-level recognizer over it, and per decode step the set of vocabulary tokens whose text
 *  keeps the recognizer on a path that can still complete (the token mask).
 *
 *  The recognizer's state is a persistent stack of frames (each step builds a new top frame and
 *  shares the rest), so one state can be tried against every token without copying. The mask walks
 *  the tokens' texts in sorted order, reusing the states of a shared prefix and skipping every token
 *  below a dead prefix.
 *  What is generated, and why:
 *  - objects with `properties` get their declared keys, in declared order, each optional one may be
 *    left out and every `required` one is written (llama.cpp's and xgrammar's choice); an object
 *    without `properties` takes any keys (with `additionalProperties` as the value schema, if given);
 *  - at most WS_MAX whitespace characters between tokens of JSON, none around the whole value;
 *  - tokens that are not whole characters (a partial UTF-8 sequence) or are control tokens
 *    (`<|...|>`) are never taken inside a constrained value; the stop tokens only once it is complete.
 *  - strings never hold the chat format's markers (<tool_call>, <|im_end|>, ...): they would end a
 *    tool call early; a string without maxLength stops at GrammarLimits.maxString characters.
 *  Every path of the grammar can be completed, so a mask is never empty.
 *  Leaves out: anyOf / oneOf / allOf, $ref, pattern, format, multipleOf, tuples (prefixItems),
 *  uniqueItems, type lists: `compileSchema` refuses them by name (a 400), never ignores them. */
import { badField } from "./errors.ts";

/** A value the recognizer reads. `lit`: one of some exact texts (enum, const, true/false/null);
 *  `branch`: one of some texts, each followed by its own node; `seq`: nodes one after another. */
export type Node =
  | { kind: "any"; maxString: number }
  | { kind: "object"; props: { key: string; node: Node; required: boolean }[] | null; values: Node }
  | { kind: "array"; items: Node; min: number; max: number }
  | { kind: "string"; min: number; max: number }
  | { kind: "number"; integer: boolean; lo: number; hi: number; loOpen: boolean; hiOpen: boolean }
  | { kind: "lit"; options: string[] }
  | { kind: "branch"; options: { text: string; then: Node }[] }
  | { kind: "seq"; parts: Node[] };

const WS_MAX = 1;
const NUMBER_MAX_CHARS = 32;

const ANNOTATIONS = new Set([
  "title",
  "description",
  "default",
  "examples",
  "$schema",
  "$id",
  "$comment",
  "deprecated",
  "readOnly",
  "writeOnly",
]);
const SUPPORTED: Record<string, string[]> = {
  object: ["properties", "required", "additionalProperties"],
  array: ["items", "minItems", "maxItems"],
  string: ["minLength", "maxLength"],
  number: ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"],
  integer: ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"],
  boolean: [],
  null: [],
};

const isObj = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

export interface GrammarLimits {
  /** The longest string a schema without maxLength gets (a weak model may never close one). */
  maxString: number;
}

/** A JSON schema → its grammar. `param` names the request field in the 400 a schema gets when it uses
 *  a keyword this recognizer cannot enforce (the keyword and where it is are in the message). */
export function compileSchema(schema: unknown, param: string, limits: GrammarLimits, at = ""): Node {
  const ANY: Node = { kind: "any", maxString: limits.maxString };
  const refuse = (what: string) => badField(param, `${what}${at ? ` (at ${at})` : ""}`);
  if (schema === true) return ANY;
  if (!isObj(schema)) throw refuse(`expected a JSON schema object, got ${JSON.stringify(schema)}`);
  if ("enum" in schema || "const" in schema) {
    const values = "const" in schema ? [schema.const] : schema.enum;
    if (!Array.isArray(values) || values.length === 0) throw refuse(`"enum" must be a non-empty list`);
    return { kind: "lit", options: values.map((v) => JSON.stringify(v)) };
  }
  let type = schema.type;
  if (type === undefined)
    type = "properties" in schema || "additionalProperties" in schema ? "object" : "items" in schema ? "array" : undefined;
  const allowed = type === undefined ? [] : SUPPORTED[type as string];
  if (type !== undefined && allowed === undefined)
    throw refuse(`the keyword "type" with ${JSON.stringify(type)} is not supported; one type of ${Object.keys(SUPPORTED).join(", ")}`);
  for (const k of Object.keys(schema))
    if (k !== "type" && !ANNOTATIONS.has(k) && !allowed.includes(k))
      throw refuse(`the keyword "${k}" is not supported by constrained decoding here${type ? ` for type ${type}` : ""}`);
  const int = (k: string, def: number) => {
    const v = schema[k];
    if (v === undefined) return def;
    if (!Number.isInteger(v) || (v as number) < 0) throw refuse(`"${k}" must be a non-negative integer`);
    return v as number;
  };
  switch (type) {
    case undefined:
      return ANY;
    case "string":
      return { kind: "string", min: int("minLength", 0), max: int("maxLength", limits.maxString) };
    case "boolean":
      return { kind: "lit", options: ["true", "false"] };
    case "null":
      return { kind: "lit", options: ["null"] };
    case "number":
    case "integer":
      return numberNode(schema, type === "integer", refuse);
    case "array": {
      const node: Extract<Node, { kind: "array" }> = { kind: "array", items: ANY, min: int("minItems", 0), max: int("maxItems", Infinity) };
      if (schema.items !== undefined) node.items = compileSchema(schema.items, param, limits, `${at}/items`);
      if (node.min > node.max) throw refuse(`minItems ${node.min} > maxItems ${node.max}`);
      return node;
    }
    default: {
      const extra = schema.additionalProperties;
      const values =
        extra === undefined || extra === true || extra === false ? ANY : compileSchema(extra, param, limits, `${at}/additionalProperties`);
      const required = schema.required ?? [];
      if (!Array.isArray(required) || required.some((r) => typeof r !== "string")) throw refuse(`"required" must be a list of names`);
      if (schema.properties === undefined && required.length > 0)
        throw refuse(`"required" names "${required[0]}", which is not in "properties"`);
      if (schema.properties === undefined)
        return extra === false ? { kind: "lit", options: ["{}"] } : { kind: "object", props: null, values };
      if (!isObj(schema.properties)) throw refuse(`"properties" must be an object`);
      const props = Object.entries(schema.properties).map(([key, s]) => ({
        key,
        node: compileSchema(s, param, limits, `${at}/properties/${key}`),
        required: required.includes(key),
      }));
      const missing = required.find((r) => !props.some((p) => p.key === r));
      if (missing !== undefined) throw refuse(`"required" names "${missing}", which is not in "properties"`);
      return { kind: "object", props, values };
    }
  }
}

function numberNode(s: Record<string, unknown>, integer: boolean, refuse: (m: string) => Error): Node {
  const bound = (k: string) => {
    const v = s[k];
    if (v !== undefined && (typeof v !== "number" || !Number.isFinite(v))) throw refuse(`"${k}" must be a number`);
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
    // Integers: the bounds as the nearest integers inside them.
    lo = loOpen ? Math.floor(lo) + 1 : Math.ceil(lo);
    hi = hiOpen ? Math.ceil(hi) - 1 : Math.floor(hi);
    loOpen = hiOpen = false;
  }
  if (lo > hi || (lo === hi && (loOpen || hiOpen))) throw refuse(`no ${integer ? "integer" : "number"} lies within the bounds`);
  return { kind: "number", integer, lo, hi, loOpen, hiOpen };
}

/** A tool call in Qwen2.5's (Hermes) format, forced: `<tool_call>\n{"name": "<name>", "arguments": `,
 *  the arguments by their schema, then `}\n</tool_call>` — for one of `tools` (name → parameters grammar). */
export function toolCallNode(tools: { name: string; parameters: Node }[]): Node {
  return {
    kind: "branch",
    options: tools.map((t) => ({
      text: `<tool_call>\n{"name": "${t.name}", "arguments": `,
      then: { kind: "seq", parts: [t.parameters, { kind: "lit", options: ["}\n</tool_call>"] }] },
    })),
  };
}

// ---- the recognizer --------------------------------------------------------------------------

/** Frames: `want` a value of `node` starts with the next character; `obj`/`arr` inside a container
 *  (`phase` says what may come next, `ws` whitespace characters in the current gap); `str` inside a
 *  string (`esc`: 0 none, 1 after a backslash, 2–5 hex digits of \u read + 1); `num` a number's text so
 *  far; `lit` the text of one of `options` so far; `seq` and `branch` wait for their child. */
type Frame =
  | { t: "want"; node: Node; up: State }
  | {
      t: "obj";
      node: Extract<Node, { kind: "object" }>;
      phase: "open" | "key" | "colon" | "value" | "after" | "comma";
      next: number;
      cur: number;
      ws: number;
      up: State;
    }
  | { t: "arr"; node: Extract<Node, { kind: "array" }>; phase: "open" | "value" | "after" | "comma"; count: number; ws: number; up: State }
  | { t: "str"; node: { min: number; max: number }; len: number; esc: number; tail: string; up: State }
  | { t: "num"; node: Extract<Node, { kind: "number" }>; text: string; up: State }
  | { t: "lit"; options: string[]; text: string; up: State }
  | { t: "seq"; node: Extract<Node, { kind: "seq" }>; i: number; up: State }
  | { t: "branch"; node: Extract<Node, { kind: "branch" }>; up: State };

/** The recognizer's state: the top frame (its parents hang off `up`); null once the value is complete. */
export type State = Frame | null;

/** undefined: the character is refused. */
type Next = State | undefined;

export function initialState(node: Node): State {
  return { t: "want", node, up: null };
}

const isWs = (ch: string) => ch === " " || ch === "\n";
const GENERIC_START = ["true", "false", "null"];
const KEY_STRING = { min: 0, max: 64 };
/** The chat format's markers: a string holding one would end a tool call early or fake a turn. */
const RESERVED = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"];
const TAIL = Math.max(...RESERVED.map((m) => m.length)) - 1;

/** Start a value of `node` with its first character. */
function begin(node: Node, ch: string, up: State): Next {
  switch (node.kind) {
    case "any":
      if (ch === "{") return { t: "obj", node: { kind: "object", props: null, values: node }, phase: "open", next: 0, cur: -1, ws: 0, up };
      if (ch === "[") return { t: "arr", node: { kind: "array", items: node, min: 0, max: Infinity }, phase: "open", count: 0, ws: 0, up };
      if (ch === '"') return { t: "str", node: { min: 0, max: node.maxString }, len: 0, esc: 0, tail: "", up };
      if (ch === "-" || (ch >= "0" && ch <= "9"))
        return numStep(
          { t: "num", node: { kind: "number", integer: false, lo: -Infinity, hi: Infinity, loOpen: false, hiOpen: false }, text: "", up },
          ch,
        );
      return litStep({ t: "lit", options: GENERIC_START, text: "", up }, ch);
    case "object":
      return ch === "{" ? { t: "obj", node, phase: "open", next: 0, cur: -1, ws: 0, up } : undefined;
    case "array":
      return ch === "[" ? { t: "arr", node, phase: "open", count: 0, ws: 0, up } : undefined;
    case "string":
      return ch === '"' ? { t: "str", node, len: 0, esc: 0, tail: "", up } : undefined;
    case "number":
      return ch === "-" || (ch >= "0" && ch <= "9") ? numStep({ t: "num", node, text: "", up }, ch) : undefined;
    case "lit":
      return litStep({ t: "lit", options: node.options, text: "", up }, ch);
    case "branch":
      return litStep({ t: "lit", options: node.options.map((o) => o.text), text: "", up: { t: "branch", node, up } }, ch);
    case "seq":
      return begin(node.parts[0], ch, { t: "seq", node, i: 0, up });
  }
}

/** A child value ended (`text`: a literal's, for the keys and branches that chose by it). */
function finish(up: State, text = ""): Next {
  if (up === null) return null;
  switch (up.t) {
    case "obj":
      if (up.phase === "key") {
        const cur = up.node.props === null ? -1 : up.node.props.findIndex((p) => JSON.stringify(p.key) === text);
        return { ...up, phase: "colon", cur, next: cur + 1 || up.next };
      }
      return { ...up, phase: "after", ws: 0 };
    case "arr":
      return { ...up, phase: "after", count: up.count + 1, ws: 0 };
    case "seq":
      return up.i + 1 < up.node.parts.length ? { t: "want", node: up.node.parts[up.i + 1], up: { ...up, i: up.i + 1 } } : finish(up.up);
    case "branch":
      return { t: "want", node: up.node.options.find((o) => o.text === text)!.then, up: up.up };
    default:
      throw new Error(`a ${up.t} frame has no children`);
  }
}

/** Keys an object may write next: declared ones from `next` on, up to and including the first required. */
function keyOptions(f: Extract<Frame, { t: "obj" }>): string[] {
  const out: string[] = [];
  for (let i = f.next; i < f.node.props!.length; i++) {
    out.push(JSON.stringify(f.node.props![i].key));
    if (f.node.props![i].required) break;
  }
  return out;
}

const canClose = (f: Extract<Frame, { t: "obj" }>) => f.node.props === null || !f.node.props.slice(f.next).some((p) => p.required);

function objStep(f: Extract<Frame, { t: "obj" }>, ch: string): Next {
  const gap = f.phase === "open" || f.phase === "value" || f.phase === "after" || f.phase === "comma";
  if (gap && isWs(ch)) return f.ws < WS_MAX ? { ...f, ws: f.ws + 1 } : undefined;
  const startKey = () => {
    if (ch !== '"') return undefined;
    const key = { ...f, phase: "key" as const };
    if (f.node.props === null) return { t: "str" as const, node: KEY_STRING, len: 0, esc: 0, tail: "", up: key };
    const options = keyOptions(f);
    return options.length > 0 ? litStep({ t: "lit", options, text: "", up: key }, ch) : undefined;
  };
  switch (f.phase) {
    case "open":
      return ch === "}" ? (canClose(f) ? finish(f.up) : undefined) : startKey();
    case "comma":
      return startKey();
    case "colon":
      return ch === ":" ? { ...f, phase: "value", ws: 0 } : undefined;
    case "value":
      return begin(f.node.props === null ? f.node.values : f.node.props[f.cur].node, ch, f);
    case "after":
      if (ch === "}") return canClose(f) ? finish(f.up) : undefined;
      if (ch === ",") return f.node.props === null || keyOptions(f).length > 0 ? { ...f, phase: "comma", ws: 0 } : undefined;
      return undefined;
    default:
      return undefined; // "key": the key's own frame reads it
  }
}

function arrStep(f: Extract<Frame, { t: "arr" }>, ch: string): Next {
  if (f.phase !== "value" && isWs(ch)) return f.ws < WS_MAX ? { ...f, ws: f.ws + 1 } : undefined;
  if (ch === "]" && (f.phase === "open" || f.phase === "after")) return f.count >= f.node.min ? finish(f.up) : undefined;
  if (f.phase === "after") return ch === "," && f.count < f.node.max ? { ...f, phase: "comma", ws: 0 } : undefined;
  if (f.phase === "open" && f.node.max === 0) return undefined;
  return begin(f.node.items, ch, { ...f, phase: "value" });
}

function strStep(f: Extract<Frame, { t: "str" }>, ch: string): Next {
  if (f.esc === 1) {
    if (ch === "u") return { ...f, esc: 2 };
    return '"\\/bfnrt'.includes(ch) ? { ...f, esc: 0, len: f.len + 1 } : undefined;
  }
  if (f.esc >= 2) {
    if (!/[0-9a-fA-F]/.test(ch)) return undefined;
    return f.esc === 5 ? { ...f, esc: 0, len: f.len + 1 } : { ...f, esc: f.esc + 1 };
  }
  if (ch === '"') return f.len >= f.node.min ? finish(f.up) : undefined;
  if (ch < " " || f.len >= f.node.max) return undefined;
  if (ch === "\\") return { ...f, esc: 1 };
  const tail = f.tail + ch;
  if (ch === ">" && RESERVED.some((m) => tail.endsWith(m))) return undefined;
  return { ...f, len: f.len + 1, tail: tail.slice(-TAIL) };
}

const NUMBER_PREFIX = /^-?(?:0|[1-9]\d*)?(?:(?<=\d)\.\d*)?(?:(?<=\d)[eE][+-]?\d*)?$/;
const NUMBER_WHOLE = /^-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?$/;

/** Whether some number that starts with `text` lies within the node's bounds (checked on the
 *  interval of values its completions can take; bounded numbers are written without exponents). */
function numFeasible(node: Extract<Node, { kind: "number" }>, text: string): boolean {
  if (!Number.isFinite(node.lo) && !Number.isFinite(node.hi)) return true;
  if (/[eE]/.test(text)) return false;
  const neg = text.startsWith("-");
  const body = neg ? text.slice(1) : text;
  // Magnitudes in [a, b) (integers: a .. b - 1) → values, then whether one of them is within the bounds.
  const { lo, hi, loOpen, hiOpen } = node;
  const hit = (a: number, b: number) => {
    if (node.integer) return neg ? -(b - 1) <= hi && -a >= lo : a <= hi && b - 1 >= lo;
    if (neg) return -b < hi && (loOpen ? -a > lo : -a >= lo); // values in (-b, -a]
    return (hiOpen ? a < hi : a <= hi) && b > lo; // values in [a, b)
  };
  if (body === "") return neg ? node.lo < 0 : true;
  const dot = body.indexOf(".");
  if (dot !== -1) {
    const f = body.length - dot - 1;
    const v = Number(body.slice(0, dot) + "." + (body.slice(dot + 1) || "0"));
    return hit(v, v + 10 ** -f);
  }
  const v = Number(body);
  if (v === 0) return hit(0, 1);
  for (let k = 0; k < 24; k++) if (hit(v * 10 ** k, (v + 1) * 10 ** k)) return true;
  return false;
}

function numComplete(f: Extract<Frame, { t: "num" }>): boolean {
  if (!NUMBER_WHOLE.test(f.text) || (f.node.integer && /[.eE]/.test(f.text))) return false;
  const v = Number(f.text);
  const n = f.node;
  return (n.loOpen ? v > n.lo : v >= n.lo) && (n.hiOpen ? v < n.hi : v <= n.hi);
}

function numStep(f: Extract<Frame, { t: "num" }>, ch: string): Next {
  const text = f.text + ch;
  const more = text.length <= NUMBER_MAX_CHARS && NUMBER_PREFIX.test(text) && !(f.node.integer && /[.eE]/.test(text));
  if (more && numFeasible(f.node, text)) return { ...f, text };
  // The number ends here: the character belongs to what follows it.
  if (!numComplete(f)) return undefined;
  const after = finish(f.up);
  return after ? step(after, ch) : undefined;
}

function litStep(f: Extract<Frame, { t: "lit" }>, ch: string): Next {
  const text = f.text + ch;
  const options = f.options.filter((o) => o.startsWith(text));
  if (options.length === 0) {
    // One option ended before this character (a prefix of a longer one, e.g. enum 1 and 12).
    if (!f.options.includes(f.text)) return undefined;
    const after = finish(f.up, f.text);
    return after ? step(after, ch) : undefined;
  }
  if (options.length === 1 && options[0] === text) return finish(f.up, text);
  return { ...f, options, text };
}

/** The state after one more character, or undefined if the grammar refuses it. */
export function step(s: State, ch: string): Next {
  if (s === null) return undefined;
  switch (s.t) {
    case "want":
      return begin(s.node, ch, s.up);
    case "obj":
      return objStep(s, ch);
    case "arr":
      return arrStep(s, ch);
    case "str":
      return strStep(s, ch);
    case "num":
      return numStep(s, ch);
    case "lit":
      return litStep(s, ch);
    default:
      throw new Error(`a ${s.t} frame is never on top`);
  }
}

/** The state after a whole text, or undefined. */
export function advance(s: State, text: string): Next {
  let cur: Next = s;
  for (let i = 0; i < text.length; i++) {
    cur = step(cur!, text[i]); // UTF-16 units, as the token mask walks them
    if (cur === undefined) return undefined;
  }
  return cur;
}

/** Whether the value may end here: complete, or a number / literal that is whole as it stands. */
export function canEnd(s: State): boolean {
  if (s === null) return true;
  if (s.t === "num") return numComplete(s) && finish(s.up) === null;
  if (s.t === "lit") return s.options.includes(s.text) && finish(s.up, s.text) === null;
  return false;
}
