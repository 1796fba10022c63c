import { afterAll, describe, expect, it } from "vitest";
import { WorkerSandbox } from "../../src/agents/sandbox.ts";

const HOSTILE = new URL("../fixtures/agents/hostile-worker.mjs", import.meta.url);
const sandbox = new WorkerSandbox<string, string>(HOSTILE, {
  timeoutMs: 300,
  startupTimeoutMs: 30_000,
  resourceLimits: { maxOldGenerationSizeMb: 32, maxYoungGenerationSizeMb: 8 },
});
afterAll(() => sandbox.shutdown());

describe("WorkerSandbox", () => {
  it("answers in order and reuses one warm worker for concurrent requests", async () => {
    const outs = await Promise.all(Array.from({ length: 50 }, (_, i) => sandbox.run(`echo:${i}`)));
    expect(outs.map((r) => (r.ok ? r.value : r.message))).toEqual(Array.from({ length: 50 }, (_, i) => String(i)));
    expect(sandbox.started).toBe(1);
  });

  it("does not count an answer as late when the main thread was blocked (a long tfjs op) while it arrived", async () => {
    const before = sandbox.started;
    const block = (ms: number) => {
      const t = Date.now();
      while (Date.now() - t < ms);
    };
    for (let i = 0; i < 3; i++) {
      const pending = sandbox.run(`echo:${i}`);
      await new Promise((r) => setImmediate(r)); // the request is now with the worker
      block(1000); // > timeoutMs: when the loop resumes, the timer and the answer are both due
      expect(await pending).toEqual({ ok: true, value: String(i) });
    }
    expect(sandbox.started).toBe(before);
  });

  it("terminates a runaway call instead of awaiting it, then serves the next from a fresh worker", async () => {
    const before = sandbox.started;
    const [spin, after] = await Promise.all([sandbox.run("spin"), sandbox.run("echo:alive")]);
    expect(spin).toEqual({ ok: false, reason: "timeout", message: "took longer than 300 ms" });
    expect(after).toEqual({ ok: true, value: "alive" });
    expect(sandbox.started).toBe(before + 1);
  });

  it("survives a worker that runs out of memory (V8 abort stays in the thread)", async () => {
    const oom = await sandbox.run("oom");
    expect(oom.ok).toBe(false);
    // Usually the heap limit ends it ("out of memory"); on a slow machine the time limit may come first.
    if (!oom.ok) expect(["out of memory", "took longer than 300 ms"]).toContain(oom.message);
    expect(await sandbox.run("echo:still here")).toEqual({ ok: true, value: "still here" });
  });

  it("reports a worker that exits or throws, and recovers", async () => {
    expect(await sandbox.run("exit")).toEqual({ ok: false, reason: "crashed", message: "worker exited with code 3" });
    const thrown = await sandbox.run("throw");
    expect(thrown).toMatchObject({ ok: false, reason: "crashed" });
    if (!thrown.ok) expect(thrown.message).toContain("boom");
    expect(await sandbox.run("echo:ok")).toEqual({ ok: true, value: "ok" });
  });

  it("fails requests after shutdown instead of hanging", async () => {
    const s = new WorkerSandbox<string, string>(HOSTILE, { timeoutMs: 300, startupTimeoutMs: 30_000, resourceLimits: {} });
    expect(await s.run("echo:x")).toEqual({ ok: true, value: "x" });
    await s.shutdown();
    expect(await s.run("echo:y")).toMatchObject({ ok: false, reason: "shutdown" });
  });

  it("reports a worker script that cannot start", async () => {
    const s = new WorkerSandbox<string, string>(new URL("../fixtures/agents/no-such-worker.mjs", import.meta.url), {
      timeoutMs: 300,
      startupTimeoutMs: 30_000,
      resourceLimits: {},
    });
    const r = await s.run("echo:x");
    expect(r).toMatchObject({ ok: false, reason: "crashed" });
    if (!r.ok) expect(r.message).toMatch(/^worker did not start: /);
    await s.shutdown();
  });
});
