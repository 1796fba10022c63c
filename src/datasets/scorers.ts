/** What counts as a right answer, in one registry used by both the reward (rewards.ts) and evaluation
 *  (run/evaluate.ts), so training and eval can never disagree. A scorer takes the answer read out of
 *  the reply by the task's answer schema (null when the reply has none), the gold answer and the task,
 *  and returns a score in [0, 1]. Built in: `math` (numeric equality, forgiving formatting; see
 *  answersMatch), `exact` (string equality after trimming and collapsing whitespace), `contains` (the
 *  gold text appears in the answer, case-insensitive). Add one with registerScorer.
 *  judgeRollout is the single definition of "correct" and of "well formed" for a finished rollout. */
import { answersMatch, extractAnswer, lastNumber, type AnswerSchema } from "./answer.ts";

/** What a scorer and the judge need to know about a task: its gold answer, and optionally how it is scored. */
export interface TaskSpec {
  gold: string;
  /** Scorer name (default "math"). */
  scorer?: string;
  /** Where the reply puts its answer (default "boxed"). */
  answerSchema?: AnswerSchema;
}

export type Scorer = (modelAnswer: string | null, gold: string, task: TaskSpec) => number;

const squash = (s: string) => s.trim().replace(/\s+/g, " ");

const scorers = new Map<string, Scorer>([
  ["math", (a, gold) => (answersMatch(a, gold) ? 1 : 0)],
  ["exact", (a, gold) => (a !== null && squash(a) === squash(gold) ? 1 : 0)],
  ["contains", (a, gold) => (a !== null && squash(gold) !== "" && squash(a).toLowerCase().includes(squash(gold).toLowerCase()) ? 1 : 0)],
]);

/** Add a scorer under a new name. A taken name is an error (a silent replacement would change rewards). */
export function registerScorer(name: string, fn: Scorer): void {
  if (!/^[A-Za-z_][\w-]*$/.test(name)) throw new Error(`scorer name ${JSON.stringify(name)} is invalid; use letters, digits, _ and -`);
  if (typeof fn !== "function") throw new Error(`scorer "${name}" must be a function (modelAnswer, gold, task) => number`);
  if (scorers.has(name) && scorers.get(name) !== fn) throw new Error(`a different scorer named "${name}" is already registered`);
  scorers.set(name, fn);
}

export function scorerNames(): string[] {
  return [...scorers.keys()];
}

export function getScorer(name: string): Scorer {
  const fn = scorers.get(name);
  if (!fn) throw new Error(`unknown scorer "${name}", expected one of ${scorerNames().join(", ")}`);
  return fn;
}

/** The task's scorer on one answer, clamped to [0, 1]. A scorer that throws or returns a non-number
 *  scores 0; an unknown scorer name throws (task files are checked when loaded). */
export function score(modelAnswer: string | null, task: TaskSpec): number {
  const fn = getScorer(task.scorer ?? "math");
  let v: number;
  try {
    v = Number(fn(modelAnswer, task.gold, task));
  } catch {
    return 0; // a user scorer that fails on odd model text scores it 0, it does not stop training
  }
  return Number.isFinite(v) ? Math.min(1, Math.max(0, v)) : 0;
}

/** The counts of a finished rollout that decide whether it is well formed. */
export interface JudgedRollout {
  finalText: string;
  numParseErrors: number; // malformed <tool_call> blocks
  numUnknownTools?: number; // well-formed calls to a tool the run does not have
  truncated: boolean;
}

export interface Judgement {
  answer: string | null; // read by the task's answer schema
  correct: number; // the scorer's value for that answer
  lenient: number; // the scorer's value for the reply's last number
  formatValid: boolean; // every call well formed and to a known tool, an answer in the schema, not truncated
}

/** The one definition of correct and well formed, shared by the reward and by evaluation. */
export function judgeRollout(r: JudgedRollout, task: TaskSpec): Judgement {
  const answer = extractAnswer(r.finalText, task.answerSchema ?? "boxed");
  return {
    answer,
    correct: score(answer, task),
    lenient: score(lastNumber(r.finalText), task),
    formatValid: r.numParseErrors === 0 && (r.numUnknownTools ?? 0) === 0 && !r.truncated && answer !== null,
  };
}
