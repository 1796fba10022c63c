/** Checks the calculator against GSM8K's own calculator annotations `<<16-3-4=9>>`: every annotation
 *  that is plain arithmetic (digits, . + - * / parentheses) must give what plain float64 arithmetic
 *  gives; agreement with the annotated result (written by people, sometimes rounded or wrong) is
 *  counted but not required. The plain-arithmetic reference is a separate recursive-descent evaluator
 *  below, so the check does not lean on mathjs at all. Leaves out reading files (the script does). */

export interface Annotation {
  expr: string;
  result: string; // as written after the last "="
}
export interface CheckExample {
  expr: string;
  annotated: string;
  calculator: string;
  plain: number | null;
  why: string;
}
export interface CheckReport {
  total: number;
  plainArithmetic: number;
  calculatorMatchesPlain: number; // over plain-arithmetic annotations; the requirement is all of them
  calculatorMismatchesPlain: CheckExample[];
  agreeWithAnnotation: number; // over all annotations
  disagreeWithAnnotation: number;
  disagreeExamples: CheckExample[]; // first few, with why
}

/** All `<<expr=result>>` annotations in an answer text, in order. */
export function extractAnnotations(answer: string): Annotation[] {
  const out: Annotation[] = [];
  for (const m of answer.matchAll(/<<([^<>]*)>>/g)) {
    const eq = m[1].lastIndexOf("=");
    if (eq === -1) out.push({ expr: m[1], result: "" });
    else out.push({ expr: m[1].slice(0, eq), result: m[1].slice(eq + 1) });
  }
  return out;
}

const PLAIN = /^[\d.+\-*/()\s]+$/;

/** Plain float64 arithmetic (+ - * / parentheses, unary minus, left to right) or null if the text is
 *  not that. The reference the calculator must agree with. */
export function plainArithmetic(expr: string): number | null {
  if (!PLAIN.test(expr)) return null;
  const toks = expr.match(/\d+\.?\d*|\.\d+|[+\-*/()]/g) ?? [];
  if (toks.join("") !== expr.replace(/\s+/g, "")) return null; // e.g. "1.2.3"
  let i = 0;
  const peek = () => toks[i];
  const expression = (): number => {
    let v = term();
    while (peek() === "+" || peek() === "-") v = toks[i++] === "+" ? v + term() : v - term();
    return v;
  };
  const term = (): number => {
    let v = factor();
    while (peek() === "*" || peek() === "/") v = toks[i++] === "*" ? v * factor() : v / factor();
    return v;
  };
  const factor = (): number => {
    const t = toks[i++];
    if (t === "-") return -factor();
    if (t === "+") return factor();
    if (t === "(") {
      const v = expression();
      if (toks[i++] !== ")") throw new Error("unbalanced");
      return v;
    }
    if (t !== undefined && /^[\d.]+$/.test(t)) return Number(t);
    throw new Error("unexpected token");
  };
  try {
    const v = expression();
    return i === toks.length ? v : null;
  } catch {
    return null;
  }
}

/** Same within the calculator's 10 significant digits. */
export function sameNumber(a: number, b: number): boolean {
  return a === b || Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(a), Math.abs(b));
}

/** Annotated results are written rounded ("3.33" for 10/3): agree if they match to the digits shown. */
export function matchesAnnotated(value: number, annotated: string): boolean {
  const a = Number(annotated.trim().replace(/,/g, ""));
  if (annotated.trim() === "" || !Number.isFinite(a)) return false;
  if (sameNumber(value, a)) return true;
  const decimals = annotated.includes(".") ? annotated.trim().split(".")[1].length : 0;
  return Math.abs(value - a) <= 0.5 * 10 ** -decimals + 1e-9 * Math.abs(a);
}

/** Run `calc` on every annotation and compare; `calc` is the calculator tool's text interface. */
export async function checkAnnotations(
  annotations: Annotation[],
  calc: (expr: string) => Promise<string>,
  maxExamples = 10,
): Promise<CheckReport> {
  const outputs = await Promise.all(annotations.map((a) => calc(a.expr)));
  const report: CheckReport = {
    total: annotations.length,
    plainArithmetic: 0,
    calculatorMatchesPlain: 0,
    calculatorMismatchesPlain: [],
    agreeWithAnnotation: 0,
    disagreeWithAnnotation: 0,
    disagreeExamples: [],
  };
  annotations.forEach((a, k) => {
    const out = outputs[k];
    const value = Number(out);
    const plain = plainArithmetic(a.expr);
    const example = (why: string): CheckExample => ({ expr: a.expr, annotated: a.result, calculator: out, plain, why });
    if (plain !== null) {
      report.plainArithmetic++;
      if (Number.isFinite(plain) && out.trim() !== "" && sameNumber(value, plain)) report.calculatorMatchesPlain++;
      else
        report.calculatorMismatchesPlain.push(
          example(Number.isFinite(plain) ? "calculator differs from plain arithmetic" : "plain arithmetic is not finite"),
        );
    }
    if (out.trim() !== "" && Number.isFinite(value) && matchesAnnotated(value, a.result)) report.agreeWithAnnotation++;
    else {
      report.disagreeWithAnnotation++;
      if (report.disagreeExamples.length < maxExamples) {
        const why = out.startsWith("Error")
          ? "calculator refused the expression"
          : !Number.isFinite(Number(a.result.replace(/,/g, "")))
            ? "annotated result is not a number"
            : "annotated result differs (rounded or wrong in the data)";
        report.disagreeExamples.push(example(why));
      }
    }
  });
  return report;
}
