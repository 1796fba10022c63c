/** The quickstart's steps run out of order: GRPO with --preset tiny before step 1 (SFT) made the
 *  model it starts from. One line says which command comes first; nothing is written. */
import { afterAll, describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { ROOT, TSX } from "./helpers/run-script.ts";

const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await fs.rm(d, { recursive: true, force: true });
});

/** The script run from `cwd` (a fresh clone's folder where no step has run yet). */
function runIn(cwd: string, script: string, args: string[]): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve) => {
    const p = spawn(TSX, [path.join(ROOT, "scripts", script), ...args], {
      cwd,
      stdio: ["ignore", "ignore", "pipe"],
      env: { ...process.env, CI: "true" },
    });
    let stderr = "";
    p.stderr.on("data", (d) => (stderr += d));
    p.on("close", (code) => resolve({ code, stderr }));
  });
}

describe("GRPO --preset tiny before SFT", () => {
  it("exits 2 naming quickstart step 1's command, and writes nothing", async () => {
    const cwd = await fs.mkdtemp(path.join(os.tmpdir(), "marl-order-"));
    dirs.push(cwd);
    const r = await runIn(cwd, "train-gsm8k-agent.ts", ["--preset", "tiny"]);
    expect(r.code, r.stderr).toBe(2);
    const errors = r.stderr.split("\n").filter((l) => l.startsWith("error:"));
    expect(errors, r.stderr).toHaveLength(1);
    expect(errors[0]).toMatch(
      /outputs\/tiny\/sft\/final.*not there yet; run quickstart step 1 first: npx tsx scripts\/train-sft\.ts --preset tiny$/,
    );
    expect(await fs.readdir(cwd)).toEqual([]);
  });
});
