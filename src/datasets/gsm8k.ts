/** GSM8K examples from a JSONL file, a parquet file, a folder holding the split (a downloaded copy of
 *  the hub repo), or the dataset name (`gsm8k`, `openai/gsm8k`) resolved through the Hugging Face
 *  cache (see gsm8k-hub.ts). Rows keep GSM8K's own text; the gold answer is
 *  parsed once here. Rows are returned in file order: shuffling belongs to whoever batches them. */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { asyncBufferFromFile, parquetReadObjects } from "hyparquet";
import { parseGold } from "./answer.ts";
import { readLines } from "../util/jsonl.ts";
import { resolveGsm8kSplit } from "./gsm8k-hub.ts";

export interface Gsm8kExample {
  id: string; // "<split or file stem>-<row>", stable across runs
  question: string;
  answer: string; // the full solution text, with <<expr=result>> annotations and the final "#### N"
  gold: string; // the exact number after "####", normalised ("1,000" -> "1000")
}

export type Gsm8kSplit = "train" | "test";

export interface LoadGsm8kOptions {
  split?: Gsm8kSplit; // for a dataset name (default "train"); for a file it only names the ids
  maxSamples?: number; // stop after this many good rows
  skipMalformed?: boolean; // skip bad rows (and say how many) instead of throwing on the first
  log?: (line: string) => void; // where the skipped-rows notice goes (default console.warn)
}

export interface Gsm8kLoadReport {
  examples: Gsm8kExample[];
  file: string; // the file actually read (a name resolves to a cached parquet file)
  skipped: { row: string; reason: string }[]; // "line 3" (JSONL, 1-based) or "row 2" (parquet, 0-based)
}

/** Load GSM8K; malformed rows throw with file and line/row, or are skipped and counted. */
export async function loadGsm8k(source: string, opts: LoadGsm8kOptions = {}): Promise<Gsm8kExample[]> {
  const report = await loadGsm8kWithReport(source, opts);
  if (report.skipped.length > 0) {
    const first = report.skipped[0];
    (opts.log ?? console.warn)(
      `gsm8k: skipped ${report.skipped.length} malformed row(s) in ${report.file} (first: ${first.row}: ${first.reason})`,
    );
  }
  return report.examples;
}

export async function loadGsm8kWithReport(source: string, opts: LoadGsm8kOptions = {}): Promise<Gsm8kLoadReport> {
  const split = opts.split;
  if (split !== undefined && split !== "train" && split !== "test")
    throw new Error(`gsm8k split "${split as string}" is not one of train, test`);
  const max = opts.maxSamples ?? Infinity;
  if (!(max >= 0) || (max !== Infinity && !Number.isInteger(max)))
    throw new Error(`gsm8k maxSamples ${max} must be a non-negative integer`);

  const kind = await fs.stat(source).then(
    (s) => (s.isFile() ? "file" : s.isDirectory() ? "dir" : null),
    () => null,
  );
  const file =
    kind === "file"
      ? source
      : kind === "dir"
        ? await splitInFolder(source, split ?? "train")
        : await resolveGsm8kSplit(source, split ?? "train");
  const prefix = split ?? idPrefix(file);
  const rows = file.endsWith(".parquet") ? await readParquetRows(file) : await readJsonlRows(file);

  const examples: Gsm8kExample[] = [];
  const skipped: Gsm8kLoadReport["skipped"] = [];
  for (const { where, value, index } of rows) {
    if (examples.length >= max) break;
    let ex: Gsm8kExample;
    try {
      if (value instanceof BadJson) throw new Error(`not valid JSON (${value.message})`);
      ex = toExample(value, `${prefix}-${index}`);
    } catch (err) {
      const reason = (err as Error).message;
      if (!opts.skipMalformed) throw new Error(`${file}: ${where}: ${reason}; fix or remove that row`);
      skipped.push({ row: where, reason });
      continue;
    }
    examples.push(ex);
  }
  return { examples, file, skipped };
}

/** One row ({question, answer}) checked and turned into an example. */
export function toExample(row: unknown, id: string): Gsm8kExample {
  if (row === null || typeof row !== "object" || Array.isArray(row))
    throw new Error(`row is ${Array.isArray(row) ? "an array" : typeof row}, expected an object {"question", "answer"}`);
  const { question, answer } = row as Record<string, unknown>;
  if (typeof question !== "string" || !question.trim()) throw new Error(`"question" is ${describe(question)}, expected non-empty text`);
  if (typeof answer !== "string" || !answer.trim()) throw new Error(`"answer" is ${describe(answer)}, expected non-empty text`);
  return { id, question, answer, gold: parseGold(answer) };
}

interface RawRow {
  where: string;
  index: number; // position among the file's rows (blank JSONL lines not counted)
  value: unknown;
}

async function readJsonlRows(file: string): Promise<RawRow[]> {
  const rows: RawRow[] = [];
  for (const { text, lineNo } of readLines(file)) {
    if (!text.trim()) continue;
    const where = `line ${lineNo}`;
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch (err) {
      // Defer the error to the row loop, so skipMalformed treats bad JSON like any bad row.
      value = new BadJson((err as Error).message);
    }
    rows.push({ where, index: rows.length, value });
  }
  return rows;
}

class BadJson {
  constructor(readonly message: string) {}
}

async function readParquetRows(file: string): Promise<RawRow[]> {
  let objects: Record<string, unknown>[];
  try {
    const buf = await asyncBufferFromFile(file);
    objects = (await parquetReadObjects({ file: buf, columns: ["question", "answer"] })) as Record<string, unknown>[];
  } catch (err) {
    throw new Error(`${file}: cannot read as parquet with columns "question", "answer": ${(err as Error).message}`);
  }
  return objects.map((value, index) => ({ where: `row ${index}`, index, value }));
}

function describe(v: unknown): string {
  if (v === undefined) return "missing";
  if (typeof v === "string") return "empty";
  return `a ${v === null ? "null" : typeof v}`;
}

function idPrefix(file: string): string {
  const stem = path.basename(file).replace(/\.(jsonl|parquet)$/, "");
  const m = /^(train|test)\b/.exec(stem);
  return m ? m[1] : stem;
}

/** `<split>.jsonl`, or the hub layout `main/<split>-*.parquet`, or `<split>-*.parquet`, in that order. */
async function splitInFolder(dir: string, split: Gsm8kSplit): Promise<string> {
  const list = async (d: string) => (await fs.readdir(d).catch(() => [] as string[])).sort();
  if ((await list(dir)).includes(`${split}.jsonl`)) return path.join(dir, `${split}.jsonl`);
  for (const sub of [path.join(dir, "main"), dir]) {
    const hit = (await list(sub)).find((f) => f.startsWith(`${split}-`) && f.endsWith(".parquet"));
    if (hit) return path.join(sub, hit);
  }
  throw new Error(`folder ${dir} holds no GSM8K ${split} split: expected ${split}.jsonl, main/${split}-*.parquet or ${split}-*.parquet`);
}
