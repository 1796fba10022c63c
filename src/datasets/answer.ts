/** Reading numeric answers out of text: GSM8K's gold `#### N`, the model's final answer in a strict
 *  format (`\boxed{}`, `#### N`, `<answer></answer>`), a lenient last-number fallback, and a numeric
 *  comparison that forgives formatting (commas, `$`, `%`, trailing `.0`, unit words, fractions).
 *  Plain numbers only: no algebra, no mixed numbers like `1 3/4`, no scientific notation.
 *  Model-written text is untrusted: every parser here is linear-time and never evaluates code. */

export type AnswerFormat = "boxed" | "hash" | "answer_tag";
export const ANSWER_FORMATS: readonly AnswerFormat[] = ["boxed", "hash", "answer_tag"];

/** Canonical decimal string of a plain number, or null: "1,000" -> "1000", "$5.50" -> "5.5",
 *  "12.0" -> "12", ".5" -> "0.5", "+3" -> "3", "-0" -> "0". Kept as a string so big integers stay exact. */
export function normalizeNumber(text: string): string | null {
  let s = text.trim().replace(/^\\?\$\s*/, "");
  let sign = "";
  if (s.startsWith("-") || s.startsWith("+")) {
    sign = s[0] === "-" ? "-" : "";
    s = s.slice(1).trim().replace(/^\\?\$\s*/, ""); // "-$5" as well as "$-5"
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
  const raw = solution.slice(at + 4).split("\n")[0].trim();
  const gold = normalizeNumber(raw);
  if (gold === null) throw new Error(`GSM8K answer's "####" line holds "${raw}", expected one number like 42, -3, 0.5 or 1,000`);
  return gold;
}

/** The final answer in a strict format, raw (trimmed, not normalised), or null when absent or empty.
 *  boxed: the last `\boxed{...}` with nested braces (`\boxed{\frac{3}{4}}`); hash: the rest of the line
 *  after the last `####`; answer_tag: the last `<answer>...</answer>`. */
export function extractAnswer(text: string, format: AnswerFormat): string | null {
  let out: string | null;
  if (format === "boxed") out = lastBoxed(text);
  else if (format === "hash") {
    const at = text.lastIndexOf("####");
    out = at < 0 ? null : text.slice(at + 4).split("\n")[0];
  } else if (format === "answer_tag") {
    const end = text.lastIndexOf("</answer>");
    const start = end < 0 ? -1 : text.lastIndexOf("<answer>", end);
    out = start < 0 ? null : text.slice(start + "<answer>".length, end);
  } else {
    throw new Error(`unknown answer format "${format as string}", expected one of ${ANSWER_FORMATS.join(", ")}`);
  }
  out = out?.trim() ?? null;
  return out ? out : null;
}

function lastBoxed(text: string): string | null {
  const start = text.lastIndexOf("\\boxed{");
  if (start < 0) return null;
  let depth = 0;
  for (let i = start + "\\boxed".length; i < text.length; i++) {
    if (text[i] === "{") depth++;
    else if (text[i] === "}" && --depth === 0) return text.slice(start + "\\boxed{".length, i);
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
  let s = text.trim().replace(/\\[,!; ]/g, "").replace(/\\%/g, "%").replace(/^\\text\{(.*)\}$/, "$1");
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
