/** Data files that are not UTF-8 text: a task file saved as Latin-1, a GSM8K file with one such line,
 *  random bytes named .jsonl. Each is refused with one line naming the file and the line (a usage
 *  error: exit 2), never read with U+FFFD in place of the bytes, never echoing the bytes. */
import { afterAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { loadExamples } from "../../src/run/data.ts";
import { UsageError } from "../../src/util/errors.ts";
import { readLines } from "../../src/util/jsonl.ts";
import { Rng } from "../../src/util/rng.ts";

const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await fs.rm(d, { recursive: true, force: true });
});

async function file(name: string, bytes: Buffer): Promise<string> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "marl-enc-"));
  dirs.push(dir);
  const f = path.join(dir, name);
  await fs.writeFile(f, bytes);
  return f;
}

const utf8 = (s: string) => Buffer.from(s, "utf8");
const latin1 = (s: string) => Buffer.from(s, "latin1");

async function refusal(f: string): Promise<Error> {
  const err = await loadExamples({ dataset: f, purpose: "eval" }).then(
    () => null,
    (e: Error) => e,
  );
  expect(err).toBeInstanceOf(UsageError);
  return err!;
}

function expectOneCleanLine(message: string): void {
  expect(message.split("\n")).toHaveLength(1);
  expect(message).not.toContain("\ufffd");
  expect(message).not.toMatch(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/);
}

describe("data files that are not UTF-8", () => {
  it("a task file with a Latin-1 line: refused at that line", async () => {
    const first = utf8('{"id": "a", "query": "What is 2+3?", "answer": "5"}\n');
    const f = await file("tasks.jsonl", Buffer.concat([first, latin1('{"id": "b", "query": "Café: 2+2?", "answer": "4"}\n')]));
    const err = await refusal(f);
    expect(err.message).toMatch(new RegExp(`${f}: line 2 is not UTF-8 text`));
    expectOneCleanLine(err.message);
    // The same rows in UTF-8 load, the accent intact.
    const ok = await file("tasks.jsonl", Buffer.concat([first, utf8('{"id": "b", "query": "Café: 2+2?", "answer": "4"}\n')]));
    expect((await loadExamples({ dataset: ok, purpose: "eval" })).map((t) => t.question)).toEqual(["What is 2+3?", "Café: 2+2?"]);
  });

  it("a GSM8K file with a Latin-1 line: refused at that line", async () => {
    const row = (q: string) => JSON.stringify({ question: q, answer: "2+2=<<2+2=4>>4\n#### 4" }) + "\n";
    const f = await file("train.jsonl", Buffer.concat([utf8(row("a")), utf8(row("b")), latin1(row("Crème brûlée: 2+2?"))]));
    const err = await refusal(f);
    expect(err.message).toMatch(new RegExp(`${f}: line 3 is not UTF-8 text`));
    expectOneCleanLine(err.message);
  });

  it("random bytes named .jsonl: refused at line 1 without echoing them", async () => {
    const rng = new Rng(7);
    const bytes = Buffer.from(Array.from({ length: 4096 }, () => Math.floor(rng.next() * 256)));
    const f = await file("data.jsonl", bytes);
    const err = await refusal(f);
    expect(err.message).toMatch(new RegExp(`${f}: line \\d+ is not UTF-8 text`));
    expectOneCleanLine(err.message);
    expect([...readLines(await file("ok.jsonl", utf8("é\n")))].map((l) => l.text)).toEqual(["é"]);
  });
});
