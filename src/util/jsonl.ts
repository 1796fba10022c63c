/** Step logs (metrics.jsonl, trajectories.jsonl): JSON lines with a `step` field, appended as a run
 *  goes. Before a run appends to one, `openStepLog` makes the file fit to continue: it cuts a torn
 *  last line (a crash mid-write) so the next line does not glue onto it, and with `resumeStep` drops
 *  the lines of later steps, which the resumed run makes again and must not appear twice. */
import * as fs from "node:fs";
import * as path from "node:path";
import { writeFileAtomicSync } from "./fs.ts";

export interface StepLine {
  step: number;
  record: Record<string, unknown>;
  line: string;
}

/** Every line of a step log in file order. A torn last line is skipped; a bad line anywhere else is
 *  an error naming the file and line. */
export function parseStepLines(text: string, file: string): StepLine[] {
  const lines = text.split("\n");
  const out: StepLine[] = [];
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].trim();
    if (line === "") continue;
    let rec: unknown;
    try {
      rec = JSON.parse(line);
    } catch {
      if (lines.slice(i + 1).every((l) => l.trim() === "")) break;
      throw new Error(`${file}:${i + 1}: not a JSON object: ${line.slice(0, 60)}`);
    }
    const step = (rec as { step?: unknown } | null)?.step;
    if (typeof rec !== "object" || typeof step !== "number") throw new Error(`${file}:${i + 1}: expected an object with a numeric "step"`);
    out.push({ step, record: rec as Record<string, unknown>, line });
  }
  return out;
}

export function openStepLog(file: string, opts: { resumeStep?: number } = {}): void {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  if (!fs.existsSync(file)) return;
  const text = fs.readFileSync(file, "utf8");
  const keep = parseStepLines(text, file)
    .filter((l) => opts.resumeStep === undefined || l.step <= opts.resumeStep)
    .map((l) => l.line + "\n")
    .join("");
  if (keep !== text) writeFileAtomicSync(file, keep);
}
