/** The folders the README's commands write into (the grading server's --workspace, every --output_dir
 *  and --state_dir it names) are git-ignored, so following the README leaves `git status` clean. */
import { describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import * as path from "node:path";

const ROOT = path.join(import.meta.dirname, "..", "..");

/** Relative folder paths given to --workspace, --output_dir or --state_dir on README command lines. */
function readmeFolders(): string[] {
  const text = readFileSync(path.join(ROOT, "README.md"), "utf8");
  const found = new Set<string>();
  for (const m of text.matchAll(/--(?:workspace|output_dir|state_dir)[ =]([A-Za-z0-9_.\/-]+)/g))
    if (!path.isAbsolute(m[1]) && m[1] !== "DIR") found.add(m[1]);
  return [...found];
}

function ignored(file: string): boolean {
  return spawnSync("git", ["check-ignore", "-q", "--no-index", file], { cwd: ROOT }).status === 0;
}

describe("README commands", () => {
  it("write only into git-ignored folders", () => {
    const folders = readmeFolders();
    // the grading server's workspace is among them
    expect(readFileSync(path.join(ROOT, "README.md"), "utf8")).toMatch(/scripts\/serve\.ts[^\n]*--workspace [A-Za-z0-9_./-]+/);
    // Anything written there: a run's files, a submission's adapter, the grading state (<workspace>/grading).
    const files = folders.map((f) => path.join(f, "grading", "adapter_config.json"));
    expect(files.filter((f) => !ignored(f))).toEqual([]);
    expect(ignored("src/index.ts")).toBe(false); // the check does tell ignored from tracked
  });
});
