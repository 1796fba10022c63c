/** The calculator's arithmetic: parse with a parse-only mathjs instance, check the tree against a
 *  whitelist, evaluate it with plain float64 JS, format the result like a pocket calculator.
 *  Pure and synchronous; it leaves out isolation (time and memory caps), which calculator.ts adds by
 *  running this inside a worker.
 *
 *  Why not mathjs's own evaluate: the model writes the input, and mathjs's advisories (2017 → 2026:
 *  constructor access, index getters, property setters) all live in its evaluation machinery. Here mathjs
 *  only parses — the instance holds nothing but the parser, so `import`, `createUnit`, `config`,
 *  `evaluate`… do not exist — and the tree is evaluated by the 40 lines below, which know numbers only.
 *
 *  Accepted: finite number literals (decimal, `.5`, `1e3`, hex/binary), `pi`, `e`, parentheses,
 *  + - * / ^ (power, right-associative), unary -/+, `!` (factorial), `x%` (percent: x/100, as mathjs 15
 *  reads a postfix %), `a % b` and `a mod b` (modulo, floored like mathjs), implicit multiplication
 *  `2(3)`, and the functions in FUNCTIONS. GSM8K's own annotations use only + - * / ( ) and decimals.
 *  Rejected: assignment, symbols, strings, booleans, matrices, ranges, units, comparisons, logic,
 *  conditionals, accessors, objects and every function not listed. */
import { createRequire } from "node:module";
import type { MathNode } from "mathjs";

type MathJs = typeof import("mathjs");

export const MAX_EXPRESSION_LENGTH = 200;
const MAX_FACTORIAL = 170; // 171! overflows float64
const SIGNIFICANT_DIGITS = 10;

/** Only the parser: nothing an expression could reach to reconfigure or extend the instance. Made on
 *  first use, so the trainer's own thread, which imports this file for MAX_EXPRESSION_LENGTH alone,
 *  never loads mathjs (a few hundred ms of startup); the worker loads it while warming up.
 *  mathjs's CommonJS build: it loads faster than its ~1000 ES modules, which matters most in the
 *  worker, where every ES module would also pass through tsx's loader hooks. */
let math: ReturnType<MathJs["create"]> | null = null;
function parser(): ReturnType<MathJs["create"]> {
  if (math === null) {
    const { create, parseDependencies } = createRequire(import.meta.url)("mathjs") as MathJs;
    math = create({ parseDependencies }, { number: "number" });
  }
  return math;
}

/** Thrown for any expression the calculator refuses or cannot compute; message is the model-facing text. */
export class CalcError extends Error {}

type Fn = { arity: [number, number]; f: (...x: number[]) => number };
const FUNCTIONS: Record<string, Fn> = {
  abs: { arity: [1, 1], f: Math.abs },
  sqrt: { arity: [1, 1], f: Math.sqrt },
  cbrt: { arity: [1, 1], f: Math.cbrt },
  nthRoot: { arity: [2, 2], f: (x, n) => nthRoot(x, n) },
  exp: { arity: [1, 1], f: Math.exp },
  log: { arity: [1, 2], f: (x, b) => (b === undefined ? Math.log(x) : Math.log(x) / Math.log(b)) },
  log10: { arity: [1, 1], f: Math.log10 },
  log2: { arity: [1, 1], f: Math.log2 },
  pow: { arity: [2, 2], f: Math.pow },
  round: { arity: [1, 2], f: (x, n) => roundTo(x, n ?? 0) },
  floor: { arity: [1, 1], f: Math.floor },
  ceil: { arity: [1, 1], f: Math.ceil },
  fix: { arity: [1, 1], f: Math.trunc },
  sign: { arity: [1, 1], f: Math.sign },
  min: { arity: [1, 50], f: Math.min },
  max: { arity: [1, 50], f: Math.max },
  mod: { arity: [2, 2], f: (x, y) => mod(x, y) },
  factorial: { arity: [1, 1], f: (x) => factorial(x) },
  gcd: { arity: [2, 2], f: (a, b) => gcd(a, b) },
  lcm: { arity: [2, 2], f: (a, b) => (a === 0 || b === 0 ? 0 : Math.abs((a / gcd(a, b)) * b)) },
};
const CONSTANTS: Record<string, number> = { pi: Math.PI, e: Math.E };
const UNARY: Record<string, (x: number) => number> = {
  unaryMinus: (x) => -x,
  unaryPlus: (x) => x,
  factorial: (x) => factorial(x),
};
const BINARY: Record<string, (x: number, y: number) => number> = {
  add: (x, y) => x + y,
  subtract: (x, y) => x - y,
  multiply: (x, y) => x * y,
  divide: (x, y) => {
    if (y === 0) throw new CalcError("Error: division by zero");
    return x / y;
  },
  pow: Math.pow,
  mod: (x, y) => mod(x, y),
};

/** Evaluate one expression to calculator text ("9", "0.3") or a short "Error: ..." text. Never throws. */
export function evaluateExpression(expression: unknown): string {
  try {
    return formatNumber(evaluateNumber(expression));
  } catch (e) {
    if (e instanceof CalcError) return e.message;
    // Not ours: e.g. a RangeError (stack) from a pathological parse. One short line, never a stack.
    const msg = e instanceof Error ? e.message : String(e);
    return `Error: cannot evaluate (${msg.slice(0, 80)})`;
  }
}

/** The expression's value as a finite number; throws CalcError otherwise. */
export function evaluateNumber(expression: unknown): number {
  if (typeof expression !== "string") throw new CalcError(`Error: expression must be a string, got ${typeOf(expression)}`);
  // Typographic operators models and web text use; the parser knows only ASCII.
  const text = expression.replace(/[×✕]/g, "*").replace(/÷/g, "/").replace(/[−–]/g, "-");
  if (text.trim() === "") throw new CalcError("Error: empty expression");
  if (text.length > MAX_EXPRESSION_LENGTH)
    throw new CalcError(`Error: expression is ${text.length} characters; at most ${MAX_EXPRESSION_LENGTH} accepted`);
  let tree: MathNode;
  try {
    tree = parser().parse(text);
  } catch (e) {
    if (/\d,\d{3}(?!\d)/.test(text)) throw new CalcError("Error: write numbers without thousands separators (1000, not 1,000)");
    throw new CalcError(`Error: cannot parse expression (${(e as Error).message.slice(0, 80)})`);
  }
  const value = evalNode(tree);
  return value === 0 ? 0 : value; // -0 → 0
}

function evalNode(node: MathNode): number {
  const n = node as MathNode & Record<string, any>;
  switch (node.type) {
    case "ConstantNode": {
      if (typeof n.value !== "number")
        throw new CalcError(`Error: only numbers are accepted, not ${typeOf(n.value)} ${clip(String(n.value))}`);
      return finite(n.value, "number literal");
    }
    case "ParenthesisNode":
      return evalNode(n.content);
    case "SymbolNode": {
      if (Object.hasOwn(CONSTANTS, n.name)) return CONSTANTS[n.name];
      throw new CalcError(`Error: unknown symbol "${clip(n.name)}"; only numbers, pi and e are accepted`);
    }
    case "OperatorNode": {
      const args: MathNode[] = n.args;
      if (args.length === 1 && Object.hasOwn(UNARY, n.fn)) return finite(UNARY[n.fn](evalNode(args[0])), n.op);
      if (args.length === 2 && Object.hasOwn(BINARY, n.fn)) {
        const x = evalNode(args[0]);
        const y = evalNode(args[1]);
        return finite(BINARY[n.fn](x, y), n.op);
      }
      throw new CalcError(`Error: operator "${clip(n.op)}" is not supported; use + - * / ^ % ( )`);
    }
    case "FunctionNode": {
      const name = n.fn?.type === "SymbolNode" ? (n.fn.name as string) : null;
      if (name === null || !Object.hasOwn(FUNCTIONS, name))
        throw new CalcError(`Error: unknown function "${clip(name ?? n.fn?.toString?.() ?? "?")}"`);
      const { arity, f } = FUNCTIONS[name];
      const args: MathNode[] = n.args;
      if (args.length < arity[0] || args.length > arity[1])
        throw new CalcError(
          `Error: ${name} takes ${arity[0] === arity[1] ? arity[0] : `${arity[0]} to ${arity[1]}`} arguments, got ${args.length}`,
        );
      return finite(f(...args.map(evalNode)), name);
    }
    case "AssignmentNode":
    case "FunctionAssignmentNode":
      throw new CalcError("Error: assignment is not supported; write a single arithmetic expression");
    default:
      throw new CalcError(`Error: ${describeNode(node.type)} not supported; write a single arithmetic expression`);
  }
}

/** Calculator display: exact integers as integers, everything else to 10 significant digits
 *  without float noise (0.1+0.2 → "0.3"). */
export function formatNumber(x: number): string {
  if (!Number.isFinite(x)) throw new CalcError("Error: result is not a finite number");
  if (Number.isInteger(x) && Math.abs(x) <= Number.MAX_SAFE_INTEGER) return String(x === 0 ? 0 : x);
  const r = Number(x.toPrecision(SIGNIFICANT_DIGITS));
  return String(r === 0 ? 0 : r);
}

function finite(x: number, what: string): number {
  if (Number.isNaN(x)) throw new CalcError(`Error: ${what} gives a result that is not a real number`);
  if (!Number.isFinite(x)) throw new CalcError(`Error: ${what} gives a result too large for the calculator`);
  return x;
}

function factorial(x: number): number {
  if (!Number.isInteger(x) || x < 0 || x > MAX_FACTORIAL)
    throw new CalcError(`Error: factorial needs an integer from 0 to ${MAX_FACTORIAL}, got ${formatLoose(x)}`);
  let r = 1;
  for (let i = 2; i <= x; i++) r *= i;
  return r;
}

// Floored modulo (result has the divisor's sign), as mathjs defines `mod` for numbers.
function mod(x: number, y: number): number {
  if (y === 0) throw new CalcError("Error: modulo by zero");
  return x - y * Math.floor(x / y);
}

// Half away from zero, on the decimal digits a person sees: round(1.005, 2) = 1.01, round(-2.5) = -3.
function roundTo(x: number, n: number): number {
  if (!Number.isInteger(n) || n < 0 || n > 15)
    throw new CalcError(`Error: round digits must be an integer from 0 to 15, got ${formatLoose(n)}`);
  const p = 10 ** n;
  return (Math.sign(x) * Math.round(Number((Math.abs(x) * p).toPrecision(15)))) / p;
}

function nthRoot(x: number, n: number): number {
  if (!Number.isInteger(n) || n === 0) throw new CalcError(`Error: nthRoot needs a non-zero integer root, got ${formatLoose(n)}`);
  if (x < 0 && n % 2 === 0) throw new CalcError("Error: even root of a negative number is not a real number");
  const r = Math.sign(x) * Math.abs(x) ** (1 / n);
  const rounded = Math.round(r); // exact roots stay exact: nthRoot(27, 3) = 3, not 3.0000000000000004
  return rounded ** n === x ? rounded : r;
}

function gcd(a: number, b: number): number {
  if (!Number.isSafeInteger(a) || !Number.isSafeInteger(b)) throw new CalcError("Error: gcd and lcm need integers");
  a = Math.abs(a);
  b = Math.abs(b);
  while (b) [a, b] = [b, a % b];
  return a;
}

function describeNode(type: string): string {
  const names: Record<string, string> = {
    ArrayNode: "matrices are",
    RangeNode: "ranges are",
    AccessorNode: "property access is",
    IndexNode: "indexing is",
    ObjectNode: "objects are",
    ConditionalNode: "conditionals are",
    BlockNode: "several statements are",
    RelationalNode: "comparisons are",
  };
  return names[type] ?? `${type} is`;
}

function typeOf(v: unknown): string {
  return v === null ? "null" : Array.isArray(v) ? "array" : typeof v;
}
function clip(s: string): string {
  return s.length > 30 ? `${s.slice(0, 30)}…` : s;
}
function formatLoose(x: number): string {
  return Number.isFinite(x) ? String(Number(x.toPrecision(SIGNIFICANT_DIGITS))) : String(x);
}
