/** Seeded arithmetic word problems in exactly GSM8K's format, for the offline `tiny` preset: one
 *  person, one kind of object, a chain of 1-4 operations on how many they have; each step is one
 *  solution line with a `<<expr=result>>` annotation, and the last line is `#### N`. Numbers are big
 *  enough that a small model needs the calculator (2-3 digit operands, products of 4-6 digits); every
 *  intermediate result is a positive integer (exact division only). The vocabulary is kept small on
 *  purpose: a tiny model learns the tool-calling pattern from it, not English. */
import { Rng } from "../util/rng.ts";
import type { Gsm8kExample } from "./gsm8k.ts";

export type SynthOp = "+" | "-" | "*" | "/";
export const SYNTH_OPS: readonly SynthOp[] = ["+", "-", "*", "/"];

export interface SyntheticOptions {
  n: number;
  seed: number;
  minSteps?: number; // default 1
  maxSteps?: number; // default 4 (at most 8)
  minOperand?: number; // default 12
  maxOperand?: number; // default 999
  maxValue?: number; // cap on every intermediate result; default 999_999
  ops?: SynthOp[]; // default all four
}

interface Person {
  name: string;
  he: string;
  his: string;
}
const PEOPLE: Person[] = [
  ["Ava", "she", "her"],
  ["Liam", "he", "his"],
  ["Mia", "she", "her"],
  ["Noah", "he", "his"],
  ["Zoe", "she", "her"],
  ["Omar", "he", "his"],
  ["Lena", "she", "her"],
  ["Ravi", "he", "his"],
  ["Sara", "she", "her"],
  ["Ben", "he", "his"],
  ["Maya", "she", "her"],
  ["Tom", "he", "his"],
].map(([name, he, his]) => ({ name, he, his }));
// [objects, container]: "boxes of pencils", "crates of apples"...
const THINGS: [string, string][] = [
  ["pencils", "box"],
  ["apples", "crate"],
  ["stickers", "sheet"],
  ["marbles", "bag"],
  ["cookies", "tray"],
  ["books", "shelf"],
  ["stamps", "album"],
  ["bottles", "pack"],
];
const plural = (c: string) => (c.endsWith("f") ? `${c.slice(0, -1)}ves` : c.endsWith("x") ? `${c}es` : `${c}s`);
const cap = (s: string) => s[0].toUpperCase() + s.slice(1);

/** n problems, the same for the same options. */
export function generateSynthetic(opts: SyntheticOptions): Gsm8kExample[] {
  const o = checkOptions(opts);
  const rng = new Rng(o.seed);
  const out: Gsm8kExample[] = [];
  for (let i = 0; i < o.n; i++) {
    const r = rng.fork(); // one stream per problem: problem i does not depend on n
    let ex: Omit<Gsm8kExample, "id"> | null = null;
    // A chain can run out of allowed moves (e.g. only "*" near maxValue); draw again, a bounded number of times.
    for (let attempt = 0; attempt < 100 && !ex; attempt++) ex = oneProblem(r, o);
    if (!ex)
      throw new Error(
        `synthetic: cannot make ${o.minSteps} steps with ops [${o.ops.join(" ")}] under maxValue ` +
          `${o.maxValue}; widen maxValue or allow + and -`,
      );
    out.push({ id: `synthetic-${o.seed}-${i}`, ...ex });
  }
  return out;
}

type Resolved = Required<SyntheticOptions>;

/** One problem, or null when the chain ran out of allowed moves before minSteps. */
function oneProblem(rng: Rng, o: Resolved): Omit<Gsm8kExample, "id"> | null {
  const p = rng.pick(PEOPLE);
  const [things, box] = rng.pick(THINGS);
  const steps = rng.int(o.minSteps, o.maxSteps);
  const question: string[] = [];
  const lines: string[] = [];
  const line = (pre: string, a: number, op: SynthOp, b: number, v: number, post: string) =>
    lines.push(`${pre}${a} ${op} ${b} = <<${a}${op}${b}=${v}>>${v}${post}`);

  // Step 1 sets the starting amount from two numbers.
  let v: number;
  const first = rng.pick(o.ops);
  if (first === "*") {
    const a = rng.int(o.minOperand, Math.min(o.maxOperand, Math.floor(o.maxValue / o.minOperand)));
    const b = rng.int(o.minOperand, Math.min(o.maxOperand, Math.floor(o.maxValue / a)));
    v = a * b;
    question.push(`${p.name} buys ${a} ${plural(box)} of ${things}. Each ${box} holds ${b} ${things}.`);
    line(`${p.name} has `, a, "*", b, v, ` ${things}.`);
  } else if (first === "+") {
    const a = rng.int(o.minOperand, o.maxOperand);
    const b = rng.int(o.minOperand, o.maxOperand);
    v = a + b;
    question.push(`${p.name} has ${a} ${things} and buys ${b} more.`);
    line(`${p.name} has `, a, "+", b, v, ` ${things}.`);
  } else if (first === "-") {
    const a = rng.int(o.minOperand + 1, o.maxOperand);
    const b = rng.int(o.minOperand, a - 1);
    v = a - b;
    question.push(`${p.name} has ${a} ${things} and gives away ${b} of them.`);
    line(`${p.name} has `, a, "-", b, v, ` ${things} left.`);
  } else {
    const b = rng.int(2, Math.min(99, o.maxOperand, Math.floor(o.maxValue / o.minOperand)));
    v = rng.int(o.minOperand, Math.min(o.maxOperand, Math.floor(o.maxValue / b))); // a = v * b <= maxValue
    const a = v * b;
    question.push(`${p.name} shares ${a} ${things} equally among ${b} people, keeping one share.`);
    line(`${p.name} keeps `, a, "/", b, v, ` ${things}.`);
  }

  let last: SynthOp = first;
  for (let s = 1; s < steps; s++) {
    const step = nextStep(rng, o, v);
    if (!step) {
      if (s < o.minSteps) return null;
      break; // no allowed operation fits this amount: a shorter problem, still within the knobs
    }
    const [op, c] = step;
    const w = op === "+" ? v + c : op === "-" ? v - c : op === "*" ? v * c : v / c;
    const He = cap(p.he);
    if (op === "+") {
      question.push(`${He} then ${rng.pick(["buys", "finds", "gets"])} ${c} more ${things}.`);
      line(`${He} now has `, v, "+", c, w, ` ${things}.`);
    } else if (op === "-") {
      question.push(`${He} ${rng.pick(["gives away", "sells", "loses"])} ${c} ${things}.`);
      line(`${He} has `, v, "-", c, w, ` ${things} left.`);
    } else if (op === "*") {
      question.push(`Later, ${p.his} collection grows to ${c} times its size.`);
      line(`${He} now has `, v, "*", c, w, ` ${things}.`);
    } else {
      question.push(`${He} shares the ${things} equally among ${c} people, keeping one share.`);
      line(`${He} keeps `, v, "/", c, w, ` ${things}.`);
    }
    v = w;
    last = op;
  }
  question.push(`How many ${things} does ${p.name} have ${last === "-" ? "left" : "now"}?`);
  return { question: question.join(" "), answer: `${lines.join("\n")}\n#### ${v}`, gold: String(v) };
}

/** An allowed operation and operand that keep the amount a positive integer within maxValue. */
function nextStep(rng: Rng, o: Resolved, v: number): [SynthOp, number] | null {
  for (const op of rng.shuffle([...o.ops])) {
    if (op === "+" && v + o.minOperand <= o.maxValue) return [op, rng.int(o.minOperand, Math.min(o.maxOperand, o.maxValue - v))];
    if (op === "-" && v - 1 >= o.minOperand) return [op, rng.int(o.minOperand, Math.min(o.maxOperand, v - 1))];
    if (op === "*") {
      const hi = Math.min(9, Math.floor(o.maxValue / v)); // "grows to c times": small factors read naturally
      if (hi >= 2) return [op, rng.int(2, hi)];
    }
    if (op === "/") {
      const divisors: number[] = [];
      for (let d = 2; d <= Math.min(99, v - 1); d++) if (v % d === 0) divisors.push(d);
      if (divisors.length > 0) return [op, rng.pick(divisors)];
    }
  }
  return null;
}

function checkOptions(opts: SyntheticOptions): Resolved {
  const o: Resolved = {
    minSteps: 1,
    maxSteps: 4,
    minOperand: 12,
    maxOperand: 999,
    maxValue: 999_999,
    ops: [...SYNTH_OPS],
    ...opts,
  };
  const int = (name: keyof Resolved, lo: number) => {
    const x = o[name] as number;
    if (!Number.isInteger(x) || x < lo) throw new Error(`synthetic ${name} ${x} must be an integer >= ${lo}`);
  };
  int("n", 0);
  int("seed", 0);
  int("minSteps", 1);
  int("maxSteps", 1);
  int("minOperand", 2);
  int("maxOperand", 2);
  int("maxValue", 2);
  if (o.maxSteps > 8 || o.minSteps > o.maxSteps)
    throw new Error(`synthetic steps ${o.minSteps}..${o.maxSteps}: need 1 <= minSteps <= maxSteps <= 8`);
  if (o.minOperand >= o.maxOperand)
    throw new Error(`synthetic operand range ${o.minOperand}..${o.maxOperand}: need minOperand < maxOperand`);
  if (o.ops.length === 0 || o.ops.some((op) => !SYNTH_OPS.includes(op)))
    throw new Error(`synthetic ops [${o.ops.join(", ")}] must be a non-empty subset of ${SYNTH_OPS.join(" ")}`);
  // Sums of two operands and the smallest product must fit under maxValue.
  const need = Math.max(2 * o.maxOperand, o.ops.includes("*") ? o.minOperand * o.minOperand : 0);
  if (o.maxValue < need) throw new Error(`synthetic maxValue ${o.maxValue} must be at least ${need} for operands up to ${o.maxOperand}`);
  return o;
}
