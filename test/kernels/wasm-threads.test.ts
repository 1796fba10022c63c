/** Threaded wasm (src/kernels/wasm/threads.ts): 1 and 2 threads give bit-identical logits and LoRA gradients
 *  (in each build of the heap module: simd128, and relaxed where the runtime has it),
 *  a process that used the threaded build exits by itself, and when the threaded build cannot start
 *  (a runtime without SharedArrayBuffer) `auto` falls back with one warning line while an explicit
 *  count fails with one error line. The backend starts once per process, so each case is a child. */
import { describe, expect, it } from "vitest";
import { execFile } from "node:child_process";
import { promises as fs } from "node:fs";
import os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { BENCH_CONFIGS } from "../../scripts/lib/bench.ts";
import { moduleDims } from "../../src/model/lora.ts";
import { LORA_TARGETS } from "../../src/model/types.ts";
import { MAX_WASM_THREADS, resolveThreads } from "../../src/kernels/wasm/threads.ts";
import { relaxedSimdAvailable, wasmSimd, WASM_SIMD_ENV, type WasmSimd } from "../../src/kernels/wasm/heap-build.ts";

const tsxCli = fileURLToPath(new URL("../../node_modules/tsx/dist/cli.mjs", import.meta.url));
const child = fileURLToPath(new URL("../fixtures/threads/logits-and-grads.ts", import.meta.url));

interface Run {
  code: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
  bytes?: Buffer;
}

/** Runs the child; a process that does not exit by itself within the timeout is killed (signal set). */
async function run(dir: string, threads: string, noSab = false, build?: WasmSimd): Promise<Run> {
  const out = path.join(dir, `out-${threads}-${noSab}-${build}.bin`);
  const env = build ? { ...process.env, [WASM_SIMD_ENV]: build } : process.env;
  const r = await new Promise<Run>((resolve) => {
    execFile(
      process.execPath,
      [tsxCli, child, threads, out, ...(noSab ? ["no-sab"] : [])],
      { timeout: 150_000, env },
      (err, stdout, stderr) =>
        resolve({
          code: err ? ((err as { code?: number }).code ?? null) : 0,
          signal: (err as { signal?: string } | null)?.signal ?? null,
          stdout,
          stderr,
        }),
    );
  });
  r.bytes = await fs.readFile(out).catch(() => undefined);
  return r;
}

describe("threaded wasm", () => {
  it("resolves thread counts: auto is the usable cores (at most 8), bad counts name what is accepted", () => {
    expect(resolveThreads("auto")).toBe(Math.min(MAX_WASM_THREADS, os.availableParallelism()));
    expect(resolveThreads(2)).toBe(2);
    expect(resolveThreads("3")).toBe(3);
    for (const bad of [0, 9, 1.5, "two", ""])
      expect(() => resolveThreads(bad as number)).toThrow(/expected auto or a whole number from 1 to 8/);
  });

  const builds: WasmSimd[] = ["simd128", ...(relaxedSimdAvailable() ? ["relaxed" as const] : [])];
  it.each(builds)("%s build: 1 and 2 threads give bit-identical logits and gradients, and the process exits by itself", async (build) => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), "threads-"));
    try {
      const [one, two] = await Promise.all([run(dir, "1", false, build), run(dir, "2", false, build)]);
      for (const [r, n] of [
        [one, 1],
        [two, 2],
      ] as const) {
        expect({ code: r.code, signal: r.signal, stdout: r.stdout.trim() }, r.stderr).toEqual({
          code: 0,
          signal: null,
          stdout: `threads ${n}, split products by columns ${n > 1 ? "yes" : "no"}, by rows ${n > 1 ? "yes" : "no"}, by slices ${n > 1 ? "yes" : "no"}, ${build}`,
        });
        expect(r.stderr).toContain(`tfjs backend: wasm (${n} thread`);
      }
      const a = new Float32Array(one.bytes!.buffer, one.bytes!.byteOffset, one.bytes!.length / 4);
      const b = new Float32Array(two.bytes!.buffer, two.bytes!.byteOffset, two.bytes!.length / 4);
      // logits [3, 96, 512], a prefill's and a decode step's [3, 512], x · wᵀ [16, 6000], then the
      // gradients of A [in, 8] and B [8, out] on 7 modules of 2 layers
      const lora = LORA_TARGETS.reduce((s, m) => s + 8 * moduleDims(BENCH_CONFIGS.small, m).reduce((x, y) => x + y), 0);
      const grads = 3 * 96 * 512 + 2 * 3 * 512 + 16 * 6000;
      expect(a.length).toBe(grads + 2 * lora);
      expect(a.every(Number.isFinite)).toBe(true);
      expect(a.subarray(grads).filter((v) => v !== 0).length).toBeGreaterThan(1000); // gradients of A and B, not zeros
      let diff = 0;
      for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) diff++;
      expect(diff).toBe(0);
      expect(one.bytes!.equals(two.bytes!)).toBe(true);
    } finally {
      await fs.rm(dir, { recursive: true, force: true });
    }
  });

  it("without SharedArrayBuffer: auto warns once and runs single-threaded, --threads 2 is a usage error in one line", async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), "threads-"));
    try {
      const [auto, two] = await Promise.all([run(dir, "auto", true), run(dir, "2", true)]);
      expect({ code: auto.code, signal: auto.signal, stdout: auto.stdout.trim() }, auto.stderr).toEqual({
        code: 0,
        signal: null,
        stdout: `threads 1, split products by columns no, by rows no, by slices no, ${wasmSimd()}`,
      });
      const warnings = auto.stderr.split("\n").filter((l) => l.startsWith("warning:"));
      if (resolveThreads("auto") > 1)
        expect(warnings).toEqual([
          `warning: threaded wasm with ${resolveThreads("auto")} threads cannot start: this runtime has no SharedArrayBuffer; using the single-threaded build`,
        ]);
      else expect(warnings).toEqual([]); // one usable core: auto never asks for the threaded build
      expect({ code: two.code, stdout: two.stdout }).toEqual({ code: 2, stdout: "" });
      expect(two.stderr.trim().split("\n")).toEqual([
        "error: threaded wasm with 2 threads cannot start: this runtime has no SharedArrayBuffer; --threads 1 uses the single-threaded build",
      ]);
    } finally {
      await fs.rm(dir, { recursive: true, force: true });
    }
  });
});
