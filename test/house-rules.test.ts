/** The size rules of src/: no file over 500 lines, no line over 140 characters (Prettier leaves long
 *  strings and comments as they are, so this is where they are caught). */
import { describe, expect, it } from "vitest";
import { readdirSync, readFileSync } from "node:fs";
import * as path from "node:path";

const SRC = path.join(__dirname, "..", "src");
const MAX_FILE_LINES = 500;
const MAX_LINE_CHARS = 140;

const sources = (readdirSync(SRC, { recursive: true }) as string[])
  .filter((f) => /\.(ts|mjs)$/.test(f))
  .map((f) => ({ file: f, lines: readFileSync(path.join(SRC, f), "utf8").split("\n") }));

describe("src/ size rules", () => {
  it("reads the sources", () => {
    expect(sources.length).toBeGreaterThan(100);
  });

  it(`no file is over ${MAX_FILE_LINES} lines`, () => {
    expect(sources.filter((s) => s.lines.length > MAX_FILE_LINES).map((s) => `${s.file}: ${s.lines.length}`)).toEqual([]);
  });

  it(`no line is over ${MAX_LINE_CHARS} characters`, () => {
    const long = sources.flatMap((s) =>
      s.lines.flatMap((l, i) => ([...l].length > MAX_LINE_CHARS ? [`${s.file}:${i + 1}: ${[...l].length}`] : [])),
    );
    expect(long).toEqual([]);
  });
});
