/** No loop of value imports in src/ (scripts/lib/import-cycles.ts), and the check does find one: in a
 *  made-up folder, through `export … from` and `import(…)`, and not through type-only imports. */
import { describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { importCycles, importGraph, valueImports } from "../scripts/lib/import-cycles.ts";

const root = path.join(__dirname, "..");

/** A folder of files (name → text), removed after f. */
function withFolder(files: Record<string, string>, f: (dir: string) => void): void {
  const dir = mkdtempSync(path.join(tmpdir(), "import-cycles-"));
  try {
    for (const [name, text] of Object.entries(files)) {
      mkdirSync(path.dirname(path.join(dir, name)), { recursive: true });
      writeFileSync(path.join(dir, name), text);
    }
    f(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe("import loops", () => {
  it("src/ has none", () => {
    expect(importCycles(importGraph(path.join(root, "src")))).toEqual([]);
  });

  it("reads value imports and skips type-only ones", () => {
    const text = [
      'import type { A } from "./a.ts";',
      'import { type B, type C } from "./b.ts";',
      'import { type D, d } from "./d.ts";',
      'import e, { type E } from "./e.ts";',
      "import {\n  f,\n  g,\n} from './f.ts';",
      'import "./side.ts";',
      'export type { H } from "./h.ts";',
      'export * from "./i.ts";',
      'import * as tf from "@tensorflow/tfjs";',
      'type J = typeof import("./j.ts");',
      '// const k = await import("./k.ts");',
      'const l = await import("./l.ts");',
    ].join("\n");
    expect(valueImports(text).sort()).toEqual(["./d.ts", "./e.ts", "./f.ts", "./i.ts", "./l.ts", "./side.ts"]);
  });

  it("finds a loop in a made-up folder, and the script exits 1 on it", () => {
    const files = {
      "a.ts": 'import { b } from "./sub/b.ts";\nimport type { T } from "./t.ts";\nexport const a = b + 1;\n',
      "sub/b.ts": 'export { c as b } from "../c.ts";\n',
      "c.ts": 'export const c = 1;\nexport async function late() {\n  return (await import("./a.ts")).a;\n}\n',
      "t.ts": 'import { a } from "./a.ts";\nexport type T = typeof a;\n',
    };
    withFolder(files, (dir) => {
      expect(importCycles(importGraph(dir))).toEqual([{ loop: ["a.ts", "sub/b.ts", "c.ts", "a.ts"], files: ["a.ts", "c.ts", "sub/b.ts"] }]);
      const run = spawnSync(process.execPath, ["--import", "tsx", path.join(root, "scripts/lib/import-cycles.ts"), dir], {
        cwd: root,
        encoding: "utf8",
      });
      expect(run.status).toBe(1);
      expect(run.stdout).toContain("a.ts → sub/b.ts → c.ts → a.ts");
    });
    // the same files with the deferred load gone: no loop, exit 0
    withFolder({ ...files, "c.ts": "export const c = 1;\n" }, (dir) => {
      expect(importCycles(importGraph(dir))).toEqual([]);
      const run = spawnSync(process.execPath, ["--import", "tsx", path.join(root, "scripts/lib/import-cycles.ts"), dir], {
        cwd: root,
        encoding: "utf8",
      });
      expect(run.status).toBe(0);
    });
  });
});
