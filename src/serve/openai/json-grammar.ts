/** Constrained decoding for the OpenAI server: the grammar a JSON schema compiles to (json-schema.ts)
 *  and an incremental character-level recognizer over it; token-mask.ts turns it into the set of
 *  vocabulary tokens that keep the recognizer on a path that can still complete.
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
 *    tool call early; a string without maxLength stops at GrammarLimits.maxString characters (or
 *    at its minLength, if that is more).
 *  Every path of the grammar can be completed, so a mask is never empty.
 *  Leaves out: alternatives that start alike (a union is told apart by its first character), pattern,
 *  format, multipleOf, tuples, uniqueItems: json-schema.ts refuses them by name (a 400). */
/** A value the recognizer reads. `lit`: one of some exact texts (enum, const, true/false/null);
 *  `branch`: one of some texts, each followed by its own node; `seq`: nodes one after another;
 *  `union`: one of some nodes, no two of which start with the same character. */
export type Node =
  | { kind: "any"; maxString: number }
  | { kind: "object"; props: { key: string; node: Node; required: boolean }[] | null; values: Node }
  | { kind: "array"; items: Node; min: number; max: number }
  | { kind: "string"; min: number; max: number }
  | { kind: "number"; integer: boolean; lo: number; hi: number; loOpen: boolean; hiOpen: boolean }
  | { kind: "lit"; options: string[] }
  | { kind: "branch"; options: { text: string; then: Node }[] }
  | { kind: "seq"; parts: Node[] }
  | { kind: "union"; options: Node[] };

const WS_MAX = 1;
export const NUMBER_MAX_CHARS = 32;

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

const NUMBER_START = "-0123456789";

/** The characters a value of `node` can start with. */
export function firstChars(node: Node): Set<string> {
  switch (node.kind) {
    case "any":
      return new Set(`{["tfn${NUMBER_START}`);
    case "object":
      return new Set("{");
    case "array":
      return new Set("[");
    case "string":
      return new Set('"');
    case "number":
      return new Set(NUMBER_START);
    case "lit":
      return new Set(node.options.map((o) => o[0]));
    case "branch":
      return new Set(node.options.map((o) => o.text[0]));
    case "seq":
      return firstChars(node.parts[0]);
    case "union":
      return new Set(node.options.flatMap((o) => [...firstChars(o)]));
  }
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
    case "union":
      for (const o of node.options) {
        const next = begin(o, ch, up);
        if (next !== undefined) return next; // the only one: options start with different characters
      }
      return undefined;
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

/** Whether some number that starts with `text` can still be written that `numComplete` takes:
 *  within NUMBER_MAX_CHARS characters, inside the bounds as the double JSON.parse reads, and for a
 *  bounded node without an exponent. Tried on a few completions: `text` followed by zeros (then
 *  perhaps a 1), and the plain decimals of the bounds and their midpoint. That family keeps a
 *  completion for each longer prefix of it, so a number the recognizer takes can always be finished;
 *  it may refuse a prefix whose only completions are elsewhere (e.g. 0.0999… rounding up to 0.1). */
export function numFeasible(node: Extract<Node, { kind: "number" }>, text: string): boolean {
  const bounded = Number.isFinite(node.lo) || Number.isFinite(node.hi);
  if (bounded && /[eE]/.test(text)) return false;
  if (text.startsWith("-") && node.lo >= 0) return false; // -0 is 0, but not what a non-negative bound asks for
  for (let j = 0; text.length + j <= NUMBER_MAX_CHARS; j++) {
    const zeros = text + "0".repeat(j);
    if (numWhole(node, zeros) || numWhole(node, zeros + "1")) return true;
    if (!bounded) return false; // a prefix of JSON's number grammar is whole as it is, or with a 0 or a 1 more
  }
  const mid = node.integer ? Math.round((node.lo + node.hi) / 2) : node.lo + (node.hi - node.lo) / 2;
  return [node.lo, node.hi, mid].some((b) => Number.isFinite(b) && plainDecimal(b).startsWith(text) && numWhole(node, plainDecimal(b)));
}

/** A double as JSON's number grammar writes it without an exponent (1e30 -> 1000000000000000019884624838656). */
function plainDecimal(x: number): string {
  const s = String(x);
  if (!/e/.test(s)) return s;
  return Math.abs(x) >= 1 ? BigInt(x).toString() : x.toFixed(100).replace(/0+$/, "");
}

/** `text` is a whole number of the node, short enough, inside its bounds. */
function numWhole(node: Extract<Node, { kind: "number" }>, text: string): boolean {
  return text.length <= NUMBER_MAX_CHARS && numComplete({ t: "num", node, text, up: null });
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
