/** The code reaches into tfjs internals (tape state, kernel re-registration), so the tfjs packages are
 *  pinned to one exact version, and CI type-checks before it tests. */
import { describe, expect, it } from "vitest";
import { readFileSync } from "node:fs";
import * as path from "node:path";

const root = path.join(__dirname, "..", "..");

describe("dependency pins and CI", () => {
  it("pins every @tensorflow package to one exact version", () => {
    const pkg = JSON.parse(readFileSync(path.join(root, "package.json"), "utf8"));
    const tfjs = Object.entries({ ...pkg.dependencies, ...pkg.devDependencies }).filter(([name]) => name.startsWith("@tensorflow/"));
    expect(tfjs.length).toBeGreaterThan(0);
    for (const [name, version] of tfjs) expect(version, name).toMatch(/^\d+\.\d+\.\d+$/);
    expect(new Set(tfjs.map(([, v]) => v)).size).toBe(1);
  });

  it(".ci/run type-checks, checks the formatting and runs the README's test command", () => {
    const ci = readFileSync(path.join(root, ".ci", "run"), "utf8")
      .split("\n")
      .map((l) => l.trim());
    expect(ci.some((l) => l === "npm run typecheck" || /^npx tsc --noEmit/.test(l))).toBe(true);
    expect(ci).toContain("npm run format:check");
    expect(ci).toContain("npm test");
  });
});
