/** Task files: AgentRL-style JSONL, one task per line,
 *    {"id": "t1", "query": "What is 2+3?", "answer": "5", "scorer": "math", "answer_schema": "boxed"}
 *  `scorer` (default math) names an entry of the scorer registry (datasets/scorers.ts), `answer_schema`
 *  (default boxed) says where the reply puts its answer. A Task is a GSM8K example with those two
 *  fields, so every run takes either. Leaves out: task-specific prompts and tools per task. */
import { promises as fs } from "node:fs";
import { ANSWER_SCHEMAS, isAnswerSchema, type AnswerSchema } from "./answer.ts";
import type { Gsm8kExample } from "./gsm8k.ts";
import { scorerNames } from "./scorers.ts";
import { readLines } from "../util/jsonl.ts";

export interface Task extends Gsm8kExample {
  scorer?: string;
  answerSchema?: AnswerSchema;
}

/** True when the first JSON line of a .jsonl file has a "query" field (AgentRL tasks, not GSM8K). */
export async function isTaskFile(file: string): Promise<boolean> {
  if (!file.endsWith(".jsonl")) return false;
  const stat = await fs.stat(file).catch(() => null);
  if (!stat?.isFile()) return false;
  const handle = await fs.open(file, "r");
  try {
    const buf = Buffer.alloc(Math.min(stat.size, 64 * 1024));
    await handle.read(buf, 0, buf.length, 0);
    const first = buf
      .toString("utf8")
      .split("\n")
      .find((l) => l.trim());
    try {
      const row = JSON.parse(first ?? "null");
      return row !== null && typeof row === "object" && Object.hasOwn(row, "query");
    } catch {
      return false;
    }
  } finally {
    await handle.close();
  }
}

/** Every task of the file in order, each checked; a bad line (not UTF-8, not JSON, not a task)
 *  throws with its line number. */
export async function loadTasks(file: string, opts: { maxSamples?: number } = {}): Promise<Task[]> {
  const out: Task[] = [];
  const ids = new Set<string>();
  for (const { text, lineNo } of readLines(file)) {
    if (out.length >= (opts.maxSamples ?? Infinity)) break;
    if (!text.trim()) continue;
    const where = `${file}: line ${lineNo}`;
    let row: unknown;
    try {
      row = JSON.parse(text);
    } catch (err) {
      throw new Error(`${where}: not valid JSON (${(err as Error).message})`);
    }
    const task = toTask(row, where, `${out.length}`);
    if (ids.has(task.id)) throw new Error(`${where}: id ${JSON.stringify(task.id)} appears twice; task ids must be unique`);
    ids.add(task.id);
    out.push(task);
  }
  return out;
}

/** One row → a Task. `index` names a row without an id. */
export function toTask(row: unknown, where: string, index: string): Task {
  if (row === null || typeof row !== "object" || Array.isArray(row))
    throw new Error(`${where}: expected an object {"id", "query", "answer", "scorer"?, "answer_schema"?}`);
  const r = row as Record<string, unknown>;
  if (typeof r.query !== "string" || !r.query.trim()) throw new Error(`${where}: "query" must be non-empty text`);
  if (typeof r.answer !== "string" && typeof r.answer !== "number") throw new Error(`${where}: "answer" must be text or a number`);
  if (r.id !== undefined && typeof r.id !== "string" && typeof r.id !== "number")
    throw new Error(`${where}: "id" must be text or a number`);
  if (r.scorer !== undefined && (typeof r.scorer !== "string" || !scorerNames().includes(r.scorer)))
    throw new Error(`${where}: scorer ${JSON.stringify(r.scorer)} is unknown; registered: ${scorerNames().join(", ")}`);
  if (r.answer_schema !== undefined && !isAnswerSchema(r.answer_schema))
    throw new Error(`${where}: answer_schema ${JSON.stringify(r.answer_schema)} is unknown; expected one of ${ANSWER_SCHEMAS.join(", ")}`);
  const answer = String(r.answer).trim();
  if (!answer) throw new Error(`${where}: "answer" is empty`);
  const task: Task = { id: r.id === undefined ? `task-${index}` : String(r.id), question: r.query, answer, gold: answer };
  if (r.scorer !== undefined) task.scorer = r.scorer as string;
  if (r.answer_schema !== undefined) task.answerSchema = r.answer_schema as AnswerSchema;
  return task;
}
