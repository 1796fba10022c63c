/** The one streaming line reader and what rests on it: a huge line is one clear error (not a 4 GB
 *  heap and a V8 crash), a BOM is read past, and a step log larger than V8's longest string
 *  (512 MB) is cut for resume without being read as one string. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as fsSync from "node:fs";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { loadGsm8k } from "../../src/datasets/gsm8k.ts";
import { MAX_LINE_BYTES, openStepLog, readLines } from "../../src/util/jsonl.ts";

let dir: string;
beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "marl-jsonl-"));
});
afterAll(async () => {
  await fs.rm(dir, { recursive: true, force: true });
});

const row = (q: string, a: number) => JSON.stringify({ question: q, answer: `It is <<1+1=2>>2.\n#### ${a}` });

describe("readLines", () => {
  it("streams lines across chunk borders with multi-byte text, numbers them, and says if the last was cut", async () => {
    const file = path.join(dir, "lines.txt");
    const long = "é".repeat(700_000); // 1.4 MB: spans chunks, and a 2-byte char sits on a border
    await fs.writeFile(file, `a\n${long}\n\nlast`);
    const lines = [...readLines(file)];
    expect(lines.map((l) => [l.lineNo, l.text.length, l.terminated])).toEqual([
      [1, 1, true],
      [2, 700_000, true],
      [3, 0, true],
      [4, 4, false],
    ]);
    expect(lines[1].text).toBe(long);
    expect(lines[3].offset).toBe(2 + 1_400_000 + 2);
  });

  it("a line over the cap is one error naming the line and both sizes", async () => {
    const file = path.join(dir, "huge.jsonl");
    const fd = fsSync.openSync(file, "w");
    fsSync.writeSync(fd, row("ok?", 2) + "\n" + '{"question": "');
    const mbBlock = Buffer.alloc(1 << 20, "x");
    for (let i = 0; i < 20; i++) fsSync.writeSync(fd, mbBlock);
    fsSync.writeSync(fd, '", "answer": "#### 1"}\n');
    fsSync.closeSync(fd);
    await expect(loadGsm8k(file)).rejects.toThrow(/huge\.jsonl: line 2 is 20\.0 MB; the limit is 16\.0 MB$/);
    expect(MAX_LINE_BYTES).toBe(16 * 1024 * 1024);
  });

  it("a UTF-8 BOM before the first row is read past", async () => {
    const file = path.join(dir, "bom.jsonl");
    await fs.writeFile(file, "\uFEFF" + row("Two?", 2) + "\n" + row("Three?", 3) + "\n");
    expect((await loadGsm8k(file)).map((e) => e.gold)).toEqual(["2", "3"]);
  });
});

describe("openStepLog on a log larger than the longest string", () => {
  it("cuts a 600 MB trajectories.jsonl at the resume step by truncation, reading only up to the cut", async () => {
    // Steps 1-4, then (sparse, so the test writes almost nothing) the rest of a 600 MB log.
    const file = path.join(dir, "trajectories.jsonl");
    const head = [1, 2, 3, 4].map((s) => `{"step":${s},"completionText":"…"}\n`).join("");
    await fs.writeFile(file, head);
    await fs.truncate(file, 600 * 1024 * 1024);
    openStepLog(file, { resumeStep: 3 });
    expect(await fs.readFile(file, "utf8")).toBe(head.split("\n").slice(0, 3).join("\n") + "\n");
  });
});
