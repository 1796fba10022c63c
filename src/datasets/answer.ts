/** Reading numeric answers out of text: GSM8K's gold `#### N`, the model's final answer in one of the
 *  answer schemas (`boxed`, `gsm8k`, `answer`, `last_number`), and a numeric
 *  comparison that forgives formatting (commas, `$`, `%`, trailing `.0`, unit words, fractions).
 *  Plain numbers only: no algebra, no mixed numbers like `1 3/4`, no scientific notation.
 *  Model-written text is untrusted: every parser here is linear-time and never evaluates code. */

/** Where a reply puts its final answer. boxed: the last `\boxed{…}` or `\fbox{…}`; answer: the last
 *  `<answer>…</answer>`; gsm8k: the rest of the line after the last `####`; last_number: the last
 *  number anywhere in the text (lenient: nothing marks it as the answer). */
export type AnswerSchema = "boxed" | "answer" | "gsm8k" | "last_number";
export const ANSWER_SCHEMAS: readonly AnswerSchema[] = ["boxed", "answer", "gsm8k", "last_number"];
/** The sentence of the system prompt that asks for each schema. */
export const ANSWER_INSTRUCTIONS: Record<AnswerSchema, string> = {
  boxed: "Put the final answer in \\boxed{}.",
  answer: "Put the final answer in <answer></answer>.",
  gsm8k: 'End with a line "#### " followed by the final answer.',
  last_number: "End with the final answer as a number.",
};

/** Canonical decimal string of a plain number, or null: "1,000" -> "1000", "$5.50" -> "5.5",
 *  "12.0" -> "12", ".5" -> "0.5", "+3" -> "3", "-0" -> "0". Kept as a string so big integers stay exact. */
export function normalizeNumber(text: string): string | null {
  let s = text.trim().replace(/^\\?\$\s*/, "");
  let sign = "";
  if (s.startsWith("-") || s.startsWith("+")) {
    sign = s[0] === "-" ? "-" : "";
    s = s
      .slice(1)
      .trim()
      .replace(/^\\?\$\s*/, ""); // "-$5" as well as "$-5"
  }
  if (!/^(\d{1,3}(,\d{3})+|\d+)?(\.\d*)?$/.test(s) || !/\d/.test(s)) return null;
  s = s.replace(/,/g, "");
  let [int, frac = ""] = s.split(".");
  int = int.replace(/^0+(?=\d)/, "") || "0";
  frac = frac.replace(/0+$/, "");
  const out = frac ? `${int}.${frac}` : int;
  return out === "0" ? "0" : sign + out;
}

/** The gold answer of a GSM8K solution: the number after the last `####`, normalised
 *  ("#### 1,000" -> "1000"). Throws when there is no `####` line or it does not hold one number. */
export function parseGold(solution: string): string {
  const at = solution.lastIndexOf("####");
  if (at < 0) throw new Error(`GSM8K answer has no "#### N" line (expected a final line like "#### 42"): ${preview(solution)}`);
  const raw = solution
    .slice(at + 4)
    .split("\n")[0]
    .trim();
  const gold = normalizeNumber(raw);
  if (gold === null) throw new Error(`GSM8K answer's "####" line holds "${raw}", expected one number like 42, -3, 0.5 or 1,000`);
  return gold;
}

/** The final answer in an answer schema (see AnswerSchema), raw (trimmed; last_number normalised), or
 *  null when absent or empty. boxed keeps nested braces (`\boxed{\frac{3}{4}}`). */
export function extractAnswer(text: string, schema: AnswerSchema): string | null {
  let out: string | null;
  if (schema === "boxed") out = lastBoxed(text);
  else if (schema === "gsm8k") {
    const at = text.lastIndexOf("####");
    out = at < 0 ? null : text.slice(at + 4).split("\n")[0];
  } else if (schema === "answer") {
    const end = text.lastIndexOf("</answer>");
    const start = end < 0 ? -1 : text.lastIndexOf("<answer>", end);
    out = start < 0 ? null : text.slice(start + "<answer>".length, end);
  } else if (schema === "last_number") {
    out = lastNumber(text);
  } else {
    throw new Error(`unknown answer schema "${schema as string}", expected one of ${ANSWER_SCHEMAS.join(", ")}`);
  }
  out = out?.trim() ?? null;
  return out ? out : null;
}

/** A usage-level check for schema names from flags and task files. */
export function isAnswerSchema(name: unknown): name is AnswerSchema {
  return typeof name === "string" && (ANSWER_SCHEMAS as readonly string[]).includes(name);
}

/** The body of the last `\boxed{…}` or `\fbox{…}` (whichever starts later), braces balanced. */
function lastBoxed(text: string): string | null {
  let start = -1,
    open = -1;
  for (const cmd of ["\\boxed{", "\\fbox{"]) {
    const at = text.lastIndexOf(cmd);
    if (at > start) [start, open] = [at, at + cmd.length - 1];
  }
  if (start < 0) return null;
  let depth = 0;
  for (let i = open; i < text.length; i++) {
    if (text[i] === "{") depth++;
    else if (text[i] === "}" && --depth === 0) return text.slice(open + 1, i);
  }
  return null; // unclosed: the model stopped mid-answer
}

// A number as people write it: optional sign (not when glued to a word or ")" as in "5-3"), optional
// $, thousands groups or plain digits, optional decimals; or a bare ".5".
const NUMBER_RE = /(?:(?<![\w)])-)?\$?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|(?:(?<![\w)])-)?\.\d+/g;

/** The last number in the text, normalised ("... so 1,200 apples." -> "1200"), or null. The lenient
 *  parser: for logging and for comparing against the strict formats, never for the reward. */
export function lastNumber(text: string): string | null {
  let last: string | null = null;
  for (const m of text.matchAll(NUMBER_RE)) last = m[0];
  return last === null ? null : normalizeNumber(last);
}

/** The value of an answer as written: a plain number, a fraction "3/4" or "\frac{3}{4}", with `$`,
 *  `%`, a trailing "." and unit words after it forgiven ("18 dollars", "50%", "$1,000."). Null when it
 *  is not one number (another number after the first, or no number at all). */
export function answerValue(text: string): number | null {
  let s = text
    .trim()
    .replace(/\\[,!; ]/g, "")
    .replace(/\\%/g, "%")
    .replace(/^\\text\{(.*)\}$/, "$1");
  const frac = /^(-?)\\d?frac\{([^{}]+)\}\{([^{}]+)\}(.*)$/.exec(s);
  if (frac) s = `${frac[1]}${frac[2]}/${frac[3]}${frac[4]}`;
  const m = /^([-+]?\s*\\?\$?\s*[\d.,]*\d[\d.,]*)(?:\s*\/\s*([\d.,]*\d[\d.,]*))?(.*)$/.exec(s);
  if (!m) return null;
  const rest = m[3].replace(/\\text\{([^{}]*)\}/g, "$1");
  if (/\d/.test(rest)) return null; // "3 apples and 4 pears" is not one answer
  const num = normalizeNumber(m[1].replace(/\.$/, ""));
  if (num === null) return null;
  if (m[2] === undefined) return Number(num);
  const den = normalizeNumber(m[2].replace(/\.$/, ""));
  if (den === null || Number(den) === 0) return null;
  return Number(num) / Number(den);
}

/** Numeric equality of a predicted answer and the gold one after normalisation (see answerValue),
 *  within a relative tolerance of 1e-6. False when either side is not a number. */
export function answersMatch(pred: string | null, gold: string, relTol = 1e-6): boolean {
  if (pred === null) return false;
  const a = answerValue(pred);
  const b = answerValue(gold);
  if (a === null || b === null) return false;
  return Math.abs(a - b) <= relTol * Math.max(Math.abs(a), Math.abs(b));
}

function preview(text: string): string {
  const one = text.replace(/\s+/g, " ").trim();
  return JSON.stringify(one.length > 80 ? `${one.slice(0, 80)}...` : one);
}
