/** Run the calculator tool on every GSM8K calculator annotation `<<expr=result>>` in a JSONL file and
 *  report how it compares with plain arithmetic (must always agree) and with the annotated results.
 *  Exit code 1 if any plain-arithmetic annotation disagrees.
 *
 *    npx tsx scripts/check-annotations.ts --data ../shared/data/gsm8k/test.jsonl */
import { Command } from "commander";
import { promises as fs } from "node:fs";
import { calculatorTool, shutdownCalculator } from "../src/agents/calculator.ts";
import { checkAnnotations, extractAnnotations, type Annotation } from "./lib/calculator-check.ts";

const DEFAULTS = { data: "../shared/data/gsm8k/test.jsonl", examples: 10 };

const opts = new Command()
  .description("Check the calculator against GSM8K's <<expr=result>> annotations")
  .option("--data <path>", "GSM8K JSONL file with {question, answer} lines", DEFAULTS.data)
  .option("--examples <n>", "disagreements to print", (v) => Number.parseInt(v, 10), DEFAULTS.examples)
  .parse()
  .opts<typeof DEFAULTS>();

const lines = (await fs.readFile(opts.data, "utf8")).split("\n").filter((l) => l.trim() !== "");
const annotations: Annotation[] = [];
lines.forEach((line, i) => {
  let answer: unknown;
  try {
    answer = (JSON.parse(line) as { answer?: unknown }).answer;
  } catch {
    throw new Error(`${opts.data}:${i + 1} is not valid JSON; expected one {"question", "answer"} object per line`);
  }
  if (typeof answer !== "string") throw new Error(`${opts.data}:${i + 1} has no "answer" string`);
  annotations.push(...extractAnnotations(answer));
});

const t0 = performance.now();
const r = await checkAnnotations(annotations, (expression) => calculatorTool.run({ expression }), opts.examples);
const seconds = (performance.now() - t0) / 1000;
await shutdownCalculator();

console.log(
  `${opts.data}: ${lines.length} problems, ${r.total} annotations (${seconds.toFixed(1)} s, ${((seconds * 1000) / Math.max(1, r.total)).toFixed(2)} ms each)`,
);
console.log(`plain arithmetic:       ${r.plainArithmetic}`);
console.log(`  calculator = plain:   ${r.calculatorMatchesPlain}`);
console.log(`  calculator ≠ plain:   ${r.calculatorMismatchesPlain.length}`);
console.log(`agree with annotation:  ${r.agreeWithAnnotation}`);
console.log(`disagree:               ${r.disagreeWithAnnotation}`);
for (const e of r.calculatorMismatchesPlain.slice(0, opts.examples))
  console.log(`  ≠ plain   <<${e.expr}=${e.annotated}>> calculator ${JSON.stringify(e.calculator)} plain ${e.plain} (${e.why})`);
for (const e of r.disagreeExamples)
  console.log(`  ≠ annot.  <<${e.expr}=${e.annotated}>> calculator ${JSON.stringify(e.calculator)} (${e.why})`);
process.exitCode = r.calculatorMismatchesPlain.length === 0 ? 0 : 1;
