import { describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { Command } from "commander";
import { parseChoice, parseFloatArg, parseIntArg, parseList, runMain } from "../../src/run/cli.ts";
import { UsageError } from "../../src/util/errors.ts";
import { StopRequest } from "../../src/run/shutdown.ts";

const tmp = () => fs.mkdtemp(path.join(os.tmpdir(), "marl-cli-"));

describe("flag parsers", () => {
  it("parse good values and reject bad ones with value and accepted range", () => {
    expect(parseIntArg("steps", 1)("200")).toBe(200);
    expect(() => parseIntArg("steps", 1)("0")).toThrow('--steps "0": expected a whole number >= 1');
    expect(() => parseIntArg("steps")("12abc")).toThrow(UsageError);
    expect(() => parseIntArg("steps")("1e3")).toThrow(/whole number/);
    expect(parseFloatArg("lr", 0)("3e-5")).toBe(3e-5);
    expect(() => parseFloatArg("temperature", 0, 2)("2.5")).toThrow('--temperature "2.5": expected a number between 0 and 2');
    expect(() => parseFloatArg("lr")("")).toThrow(UsageError);
    expect(() => parseFloatArg("lr")("nan")).toThrow(UsageError);
    expect(parseChoice("quant", ["int8", "nf4", "none"])("nf4")).toBe("nf4");
    expect(() => parseChoice("quant", ["int8", "nf4"])("fp4")).toThrow('--quant "fp4": expected one of int8, nf4');
    expect(parseList("targets")("q_proj, v_proj")).toEqual(["q_proj", "v_proj"]);
    expect(() => parseList("targets", ["q_proj", "v_proj"])("q_proj,x_proj")).toThrow(
      /unknown x_proj; expected a comma-separated list of q_proj, v_proj/,
    );
    expect(() => parseList("targets")("a,,b")).toThrow(UsageError);
  });

  it("let UsageError escape commander so runMain can report it", async () => {
    const lines: string[] = [];
    let code = -1;
    await runMain(
      async () => {
        const cmd = new Command().exitOverride().option("--steps <n>", "steps", parseIntArg("steps", 1));
        await cmd.parseAsync(["node", "x", "--steps", "-3"]);
      },
      { exit: (c) => (code = c), stderr: (l) => lines.push(l), env: {} },
    );
    expect(code).toBe(2);
    expect(lines).toEqual(['error: --steps "-3": expected a whole number >= 1']);
  });
});

describe("runMain", () => {
  it("maps errors to one line and exit codes; stack only with DEBUG", async () => {
    const run = async (fn: () => Promise<void>, env: Record<string, string> = {}) => {
      const lines: string[] = [];
      let code: number | undefined;
      await runMain(fn, { exit: (c) => (code = c), stderr: (l) => lines.push(l), env });
      return { code, lines };
    };
    expect(await run(async () => {})).toEqual({ code: undefined, lines: [] });
    expect(
      await run(async () => {
        throw new Error("boom\nmore");
      }),
    ).toEqual({ code: 1, lines: ["error: boom"] });
    const dbg = await run(
      async () => {
        throw new Error("boom");
      },
      { DEBUG: "1" },
    );
    expect(dbg.code).toBe(1);
    expect(dbg.lines.length).toBe(2);
    expect(dbg.lines[1]).toMatch(/at /);
  });
});

describe("StopRequest", () => {
  it("a first signal asks for a stop; a second exits 130 at once, unless it is the same Ctrl-C arriving within a second", () => {
    const codes: number[] = [];
    const lines: string[] = [];
    let t = 1000;
    const stop = new StopRequest({ exit: (c) => codes.push(c), stderr: (l) => lines.push(l) }, () => t);
    expect(stop.requested).toBe(false);
    stop.signal();
    expect(stop.requested).toBe(true);
    expect(codes).toEqual([]);
    t += 400;
    stop.signal(); // the same interrupt, relayed a second way
    expect(codes).toEqual([]);
    t += 700;
    stop.signal();
    expect(codes).toEqual([130]);
    expect(lines[1]).toMatch(/exiting without saving/);
    // a stop asked for otherwise (the launcher gone), then the relayed Ctrl-C: one interrupt
    const other = new StopRequest({ exit: (c) => codes.push(c), stderr: (l) => lines.push(l) }, () => t);
    other.request("interrupted: the launching process is gone");
    other.signal();
    expect(codes).toEqual([130]);
  });
});

function runChild(args: string[], onStdout?: (s: string, kill: (sig: NodeJS.Signals) => void) => void) {
  return new Promise<{ code: number | null; stderr: string }>((resolve) => {
    const child = spawn(process.execPath, ["--import", "tsx", path.join(__dirname, "..", "fixtures", "run", "cli-child.ts"), ...args], {
      cwd: path.join(__dirname, "..", ".."),
      env: { ...process.env, DEBUG: "" },
    });
    let stderr = "";
    child.stderr.on("data", (d) => (stderr += d));
    child.stdout.on("data", (d) => onStdout?.(String(d), (sig) => child.kill(sig)));
    child.on("close", (code) => resolve({ code, stderr }));
  });
}

describe("exit codes of a real process", () => {
  it("usage error → 2, error → 1, Ctrl-C saves then → 130", async () => {
    const dir = await tmp();
    const out = path.join(dir, "ckpt");
    const [usage, fail, intr] = await Promise.all([
      runChild(["usage"]),
      runChild(["fail"]),
      runChild(["interrupt", out], (s, kill) => {
        if (s.includes("ready")) kill("SIGINT");
      }),
    ]);
    expect(usage.code).toBe(2);
    expect(usage.stderr.trim()).toBe('error: --steps "x": expected a whole number >= 1');
    expect(fail.code).toBe(1);
    expect(fail.stderr.trim()).toBe("error: model folder /nope not found");
    expect(intr.code).toBe(130);
    expect(await fs.readFile(out, "utf8")).toMatch(/^saved [1-9]/);
    expect(intr.stderr).toMatch(/interrupted: saved step/);
  });
});

/** The fixture under the tsx CLI in its own process group; SIGINT goes to the whole group, as a
 *  terminal sends Ctrl-C. Its "busy" steps block the thread for 2 s, as a long kernel does. */
function runGroup(out: string, sigintAfterMs: number[]) {
  return new Promise<{ code: number | null; stderr: string; ms: number }>((resolve) => {
    const tsx = path.join(__dirname, "..", "..", "node_modules", "tsx", "dist", "cli.mjs");
    const child = spawn(process.execPath, [tsx, path.join(__dirname, "..", "fixtures", "run", "cli-child.ts"), "busy", out], {
      cwd: path.join(__dirname, "..", ".."),
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, DEBUG: "" },
    });
    let stderr = "";
    let t0 = 0;
    child.stderr.on("data", (d) => (stderr += d));
    child.stdout.on("data", (d) => {
      if (!String(d).includes("ready")) return;
      t0 = Date.now();
      for (const ms of sigintAfterMs) setTimeout(() => process.kill(-child.pid!, "SIGINT"), ms);
    });
    child.on("close", (code) => resolve({ code, stderr, ms: Date.now() - t0 }));
  });
}

describe("Ctrl-C under npx tsx in a terminal's process group", () => {
  it("a busy trainer still stops at its safe point and saves; a second Ctrl-C exits at once without saving", async () => {
    const dir = await tmp();
    const [once, twice] = await Promise.all([runGroup(path.join(dir, "once"), [500]), runGroup(path.join(dir, "twice"), [500, 2500])]);
    expect(once.code, once.stderr).toBe(130);
    expect(await fs.readFile(path.join(dir, "once"), "utf8")).toMatch(/^saved [1-9]/);
    expect(twice.code, twice.stderr).toBe(130);
    expect(twice.stderr).toMatch(/interrupted again: exiting without saving/);
    await expect(fs.stat(path.join(dir, "twice"))).rejects.toThrow();
  }, 120_000);
});

describe("run-folder lock", () => {
  it("refuses a second run while the first lives; takes over the lock of a dead process with a warning", async () => {
    const out = path.join(await tmp(), "run");
    let ready!: () => void;
    const isReady = new Promise<void>((r) => (ready = r));
    const first = runChild(["hold", out], (s) => {
      if (s.includes("ready")) ready();
    });
    await isReady;
    const second = await runChild(["hold", out]);
    expect(second.code).toBe(2);
    expect(second.stderr.trim()).toMatch(
      /^error: --output_dir .*run is in use by another run \(process \d+\); wait for it to end or pick another folder$/,
    );
    expect(await fs.readFile(path.join(out, "metrics.jsonl"), "utf8")).toMatch(/^\{"step":1,"pid":\d+\}\n$/); // untouched
    const pid = JSON.parse(await fs.readFile(path.join(out, "metrics.jsonl"), "utf8")).pid;
    process.kill(pid, "SIGKILL"); // the run dies holding the lock
    await first;
    expect(await fs.readFile(path.join(out, ".lock"), "utf8")).toMatch(/^\d+\n$/);
    await fs.rm(path.join(out, "metrics.jsonl"));
    const third = runChild(["hold", out], (s, k) => {
      if (s.includes("ready")) k("SIGTERM");
    });
    const r = await third;
    expect(r.stderr).toMatch(/warning: .* was locked by process \d+, which is no longer running; taking the lock over/);
  }, 120_000);
});
