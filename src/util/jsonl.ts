/** Step logs (metrics.jsonl, trajectories.jsonl): JSON lines with a `step` field, appended as a run
 *  goes. Before a run appends to one, `openStepLog` makes the file fit to continue: it cuts a torn
 *  last line (a crash mid-write) so the next line does not glue onto it, and with `resumeStep` drops
 *  the lines of later steps, which the resumed run makes again and must not appear twice. */
import * as fs from "node:fs";
import * as path from "node:path";

export function openStepLog(file: string, opts: { resumeStep?: number } = {}): void {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  if (!fs.existsSync(file)) return;
  const text = fs.readFileSync(file, "utf8");
  const whole = text.slice(0, text.lastIndexOf("\n") + 1);
  const keep =
    opts.resumeStep === undefined
      ? whole
      : whole
          .split("\n")
          .filter((line) => line.trim() !== "" && stepOf(line, file) <= opts.resumeStep!)
          .map((line) => line + "\n")
          .join("");
  if (keep === text) return;
  const tmp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, keep);
  fs.renameSync(tmp, file);
}

function stepOf(line: string, file: string): number {
  let step: unknown;
  try {
    step = (JSON.parse(line) as { step?: unknown }).step;
  } catch {
    throw new Error(`${file}: a line is not JSON: ${line.slice(0, 80)}`);
  }
  if (typeof step !== "number") throw new Error(`${file}: a line has no numeric "step": ${line.slice(0, 80)}`);
  return step;
}
