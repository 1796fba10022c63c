/** A llama run says once what llama.cpp runs on: node-llama-cpp's own note that a GPU build does not
 *  load here (it came once per load, twice a run) is silenced, and with --engine_gpu auto on a CPU the
 *  engine's line explains it. Skips where node-llama-cpp cannot load, except under CI, where that fails. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { importLlama } from "../../src/rollout/engines/llama-package.ts";
import { ROOT, TSX } from "../run/helpers/run-script.ts";

const loadError: unknown = await importLlama()
  .then(async ({ getLlama }) => (await getLlama({ gpu: false, build: "never" })).dispose())
  .then(() => null)
  .catch((e: unknown) => e ?? new Error("node-llama-cpp failed to load"));

let cache: string;
beforeAll(async () => {
  cache = await fs.mkdtemp(path.join(os.tmpdir(), "llama-warnings-"));
});
afterAll(async () => {
  await fs.rm(cache, { recursive: true, force: true });
});

/** scripts/chat.ts with one question on stdin; its stderr. */
function chat(args: string[], input: string): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve) => {
    const p = spawn(TSX, [path.join("scripts", "chat.ts"), ...args], {
      cwd: ROOT,
      stdio: ["pipe", "pipe", "pipe"],
      env: { ...process.env, CI: "true", XDG_CACHE_HOME: cache },
    });
    let stderr = "";
    p.stderr.on("data", (d) => (stderr += d));
    p.stdout.on("data", (d) => (stderr += d));
    p.on("close", (code) => resolve({ code, stderr }));
    p.stdin.end(input);
  });
}

describe.skipIf(loadError !== null && !process.env.CI)("the llama engine's messages", () => {
  it("one line on what llama.cpp runs on; none of node-llama-cpp's fallback notes", async () => {
    if (loadError) throw loadError; // only reached under CI (the suite is skipped otherwise)
    const r = await chat(
      ["--preset", "tiny", "--rollout_engine", "llama", "--engine_gpu", "auto", "--max_new_tokens", "8"],
      "What is 2+3?\n",
    );
    expect(r.code, r.stderr).toBe(0);
    expect(r.stderr).toContain("llama engine: base written"); // the engine opened and generated
    expect(r.stderr).not.toMatch(/\[node-llama-cpp\].*(falling back|not compatible)/i);
    const lines = r.stderr.split("\n").filter((l) => l.startsWith("rollout engine: llama.cpp"));
    expect(lines).toHaveLength(1);
    if (lines[0].includes(" on cpu"))
      expect(lines[0]).toContain("on cpu (--engine_gpu auto: no CUDA, Vulkan or Metal build of llama.cpp loads here)");
  });
});
