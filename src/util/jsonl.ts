/** JSON-lines files. `readLines` is the one way they are read: in chunks, never holding more than one
 *  line, each line capped (a 50 MB line is an error naming it, not a 4 GB heap), a UTF-8 BOM skipped,
 *  and a line that is not UTF-8 (a Latin-1 file, random bytes) an error naming it, not U+FFFD.
 *
 *  Step logs (metrics.jsonl, trajectories.jsonl): JSON lines with a `step` field, appended as a run
 *  goes. Before a run appends to one, `openStepLog` makes the file fit to continue: it cuts a torn
 *  last line (a crash mid-write) so the next line does not glue onto it, and with `resumeStep` drops
 *  the lines of later steps, which the resumed run makes again and must not appear twice. It cuts by
 *  truncating, so a log of any size (trajectories pass 512 MB, V8's longest string) is fine. */
import * as fs from "node:fs";
import * as path from "node:path";

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

/** The longest line any JSONL input may have. GSM8K rows are ~1 KB, a trajectory line of a few
 *  thousand tokens a few hundred KB. */
export const MAX_LINE_BYTES = 16 * 1024 * 1024;

export interface Line {
  text: string; // without the newline (and without a BOM on line 1)
  lineNo: number; // 1-based
  offset: number; // byte offset of the line's start
  terminated: boolean; // ended by "\n" (false only for a last line cut short)
}

const mb = (n: number) => `${(n / 1024 / 1024).toFixed(1)} MB`;

// fatal: invalid bytes throw instead of becoming U+FFFD; ignoreBOM: the BOM is ours to skip, on line 1 only.
const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** The lines of `file`, streamed (synchronous reads of 1 MB chunks). A line longer than
 *  `maxLineBytes` throws "<file>: line N is X MB; the limit is Y MB"; one that is not UTF-8 throws
 *  "<file>: line N is not UTF-8 text (...)" and quotes none of its bytes. */
export function* readLines(file: string, maxLineBytes = MAX_LINE_BYTES): Generator<Line> {
  const fd = fs.openSync(file, "r");
  try {
    const chunk = Buffer.alloc(1 << 20);
    let parts: Buffer[] = [];
    let partBytes = 0; // bytes of the current line seen so far (kept only while under the cap)
    let lineNo = 1;
    let offset = 0; // file offset of the current line
    let pos = 0; // file offset of `chunk`
    const lineOf = (buf: Buffer, terminated: boolean): Line => {
      let text: string;
      try {
        text = utf8.decode(buf);
      } catch {
        throw new Error(`${file}: line ${lineNo} is not UTF-8 text (a binary file, or text in another encoding); save it as UTF-8`);
      }
      if (lineNo === 1 && text.charCodeAt(0) === 0xfeff) text = text.slice(1);
      return { text, lineNo, offset, terminated };
    };
    for (;;) {
      const n = fs.readSync(fd, chunk, 0, chunk.length, pos);
      if (n === 0) break;
      let start = 0;
      for (;;) {
        const nl = chunk.indexOf(0x0a, start);
        const end = nl === -1 || nl >= n ? n : nl;
        partBytes += end - start;
        if (partBytes > maxLineBytes) {
          // Measure the whole line for the message without keeping it.
          let total = partBytes;
          let at = pos + end;
          for (let k; (k = fs.readSync(fd, chunk, 0, chunk.length, at)) > 0; at += k) {
            const i = chunk.subarray(0, k).indexOf(0x0a);
            total += i === -1 ? k : i;
            if (i !== -1) break;
          }
          throw new Error(`${file}: line ${lineNo} is ${mb(total)}; the limit is ${mb(maxLineBytes)}`);
        }
        parts.push(Buffer.from(chunk.subarray(start, end)));
        if (end === n) break; // the line goes on in the next chunk
        yield lineOf(parts.length === 1 ? parts[0] : Buffer.concat(parts), true);
        lineNo++;
        offset = pos + end + 1;
        parts = [];
        partBytes = 0;
        start = end + 1;
      }
      pos += n;
    }
    if (partBytes > 0) yield lineOf(Buffer.concat(parts), false);
  } finally {
    fs.closeSync(fd);
  }
}

export function openStepLog(file: string, opts: { resumeStep?: number } = {}): void {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  if (!fs.existsSync(file)) return;
  let cut: number | undefined; // truncate here: first line of a later step, or a torn last line
  let bad: Line | undefined; // a line that is not JSON: fine only as the last one (torn)
  let last: Line | undefined;
  for (const l of readLines(file)) {
    if (l.text.trim() === "") continue;
    if (bad) throw new Error(`${file}:${bad.lineNo}: not a JSON object: ${bad.text.slice(0, 60)}`);
    let rec: { step?: unknown } | null;
    try {
      rec = JSON.parse(l.text);
    } catch {
      bad = l;
      continue;
    }
    if (typeof rec !== "object" || rec === null || typeof rec.step !== "number")
      throw new Error(`${file}:${l.lineNo}: expected an object with a numeric "step"`);
    if (opts.resumeStep !== undefined && rec.step > opts.resumeStep) {
      cut = l.offset; // steps are appended in order: everything from here on is later
      break;
    }
    last = l;
  }
  if (bad && cut === undefined) cut = bad.offset;
  if (cut !== undefined) fs.truncateSync(file, cut);
  else if (last && !last.terminated) fs.appendFileSync(file, "\n"); // a complete last line without its newline
}
