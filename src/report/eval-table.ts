/** How an evaluation is compared and shown: the paired improvement of one model over another on the
 *  same questions, its line, and the table of every model's figures (eval.ts prints and reports them).
 *  Reads an evaluation's result through the types below (run/evaluate.ts EvalResult has them). */
import { meanCI, type Interval } from "../trainer/stats.ts";

/** One model's figures over an evaluation's samples (k per question). */
export interface EvalFigures {
  k: number;
  strict: Interval & { correct: number; total: number };
  lenient: Interval;
  passAtK: number;
  formatValid: number;
  toolCallsPerRollout: number;
  envReward?: number;
  envErrorRate?: number;
}

/** An evaluation's questions as pairing reads them: each one's id and its samples' strict verdicts. */
export interface JudgedQuestions {
  questions: ReadonlyArray<{ id: string; samples: ReadonlyArray<{ strict: boolean }> }>;
}

/** A compared pair's paired improvement, as eval.json keeps it. */
export type Improvement = { model: string; baseline: string } & Interval & { n: number };

/** Paired difference in strict accuracy, model − baseline, over the same questions: per question
 *  (correct_model − correct_baseline) / k, mean with a 95% normal interval clamped to [-1, 1].
 *  Pairing removes the between-question variance, so the interval is narrower than two separate ones. */
export function pairedImprovement(model: JudgedQuestions, baseline: JudgedQuestions): Interval & { n: number } {
  if (model.questions.length !== baseline.questions.length)
    throw new Error(`paired improvement needs the same questions: ${model.questions.length} vs ${baseline.questions.length}`);
  const acc = (q: JudgedQuestions["questions"][number]) => q.samples.filter((s) => s.strict).length / q.samples.length;
  const diffs = model.questions.map((q, i) => {
    const b = baseline.questions[i];
    if (q.id !== b.id) throw new Error(`paired improvement: question ${i} is ${q.id} in one result and ${b.id} in the other`);
    return acc(q) - acc(b);
  });
  const ci = meanCI(diffs, 1.96, [-1, 1]);
  return { value: ci.value, lo: ci.lo, hi: ci.hi, n: ci.n };
}

export const f3 = (x: number) => x.toFixed(3);
const signed = (x: number) => (x >= 0 ? "+" : "") + x.toFixed(3);

export function formatImprovement(model: string, baseline: string, d: Interval & { n: number }): string {
  const ci = `[${signed(d.lo)}, ${signed(d.hi)}]`;
  return `improvement ${model} vs ${baseline}: strict ${signed(d.value)} ${ci} (paired over ${d.n} questions, 95% CI)`;
}

/** The comparison table, one row per model, columns padded to line up. */
export function formatEvalTable(results: Array<{ name: string; result: EvalFigures }>): string {
  const k = Math.max(1, ...results.map((r) => r.result.k));
  const env = results.some((r) => r.result.envReward !== undefined); // episodes: success and mean reward
  const head = [
    "model",
    "strict acc [95% CI]",
    "lenient acc",
    `pass@${k}`,
    "format",
    ...(env ? ["env reward", "env errors"] : ["tools/rollout"]),
  ];
  const rows = results.map(({ name, result: r }) => [
    name,
    `${f3(r.strict.value)} [${f3(r.strict.lo)}, ${f3(r.strict.hi)}]`,
    f3(r.lenient.value),
    f3(r.passAtK),
    f3(r.formatValid),
    ...(env ? [f3(r.envReward ?? 0), f3(r.envErrorRate ?? 0)] : [r.toolCallsPerRollout.toFixed(2)]),
  ]);
  const widths = head.map((h, c) => Math.max(h.length, ...rows.map((r) => r[c].length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => c.padEnd(widths[i]))
      .join(" | ")
      .trimEnd();
  return [line(head), widths.map((w) => "-".repeat(w)).join("-|-"), ...rows.map(line)].join("\n");
}
