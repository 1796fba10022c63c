/** Command-line plumbing shared by the scripts: flag parsers for commander that reject bad values
 *  with one clear line, `runMain` (exit codes 0 / 1 error / 2 usage / 130 interrupted; the Ctrl-C
 *  path itself is in shutdown.ts). The flag tables themselves are in flags.ts and each run's *-flags.ts;
 *  the run-folder rules are in output-dir.ts. */
import { Interrupted } from "./shutdown.ts";
import { UsageError } from "../util/errors.ts";

// ---------------------------------------------------------------- flag parsers (commander argParser)

function rangeText(min?: number, max?: number): string {
  if (min !== undefined && max !== undefined) return `between ${min} and ${max}`;
  if (min !== undefined) return `>= ${min}`;
  if (max !== undefined) return `<= ${max}`;
  return "any value";
}

/** `--name` as a whole number in [min, max]. Accepts plain decimal integers only ("1e3", "12abc" fail). */
export function parseIntArg(name: string, min?: number, max?: number): (value: string) => number {
  return (value: string) => {
    const v = value.trim();
    const n = /^[+-]?\d+$/.test(v) ? Number(v) : NaN;
    if (!Number.isSafeInteger(n) || (min !== undefined && n < min) || (max !== undefined && n > max))
      throw new UsageError(`--${name} ${JSON.stringify(value)}: expected a whole number ${rangeText(min, max)}`);
    return n;
  };
}

/** `--name` as a finite number in [min, max] ("3e-5", "0.1", "-2" are fine). */
export function parseFloatArg(name: string, min?: number, max?: number): (value: string) => number {
  return (value: string) => {
    const v = value.trim();
    const n = v === "" ? NaN : Number(v);
    if (!Number.isFinite(n) || (min !== undefined && n < min) || (max !== undefined && n > max))
      throw new UsageError(`--${name} ${JSON.stringify(value)}: expected a number ${rangeText(min, max)}`);
    return n;
  };
}

/** `--name` as one of a fixed set of words. */
export function parseChoice<T extends string>(name: string, choices: readonly T[]): (value: string) => T {
  return (value: string) => {
    if (!(choices as readonly string[]).includes(value))
      throw new UsageError(`--${name} ${JSON.stringify(value)}: expected one of ${choices.join(", ")}`);
    return value as T;
  };
}

/** `--name a,b,c` as a list of non-empty items, each one of `allowed` when given. */
export function parseList(name: string, allowed?: readonly string[]): (value: string) => string[] {
  return (value: string) => {
    const items = value.split(",").map((s) => s.trim());
    const what = allowed ? `a comma-separated list of ${allowed.join(", ")}` : "a comma-separated list of non-empty items";
    if (items.some((s) => s === "")) throw new UsageError(`--${name} ${JSON.stringify(value)}: expected ${what}`);
    if (allowed) {
      const bad = items.filter((s) => !allowed.includes(s));
      if (bad.length > 0) throw new UsageError(`--${name} ${JSON.stringify(value)}: unknown ${bad.join(", ")}; expected ${what}`);
    }
    return items;
  };
}

// ---------------------------------------------------------------- main and exit codes

export interface ProcessIo {
  exit: (code: number) => void;
  stderr: (line: string) => void;
  env: Record<string, string | undefined>;
}

const defaultIo: ProcessIo = {
  exit: (code) => process.exit(code),
  stderr: (line) => process.stderr.write(line + "\n"),
  env: process.env,
};

/** Run a script's body. UsageError → `error: ...` and exit 2; Interrupted (a training loop stopped
 *  at its safe point after Ctrl-C) → its message and exit 130; any other error → `error: <message>`
 *  and exit 1, with the stack only when DEBUG is set (a stack helps us, not the user). */
export async function runMain(fn: () => Promise<void>, io: ProcessIo = defaultIo): Promise<void> {
  try {
    await fn();
  } catch (err) {
    if (err instanceof Interrupted) {
      io.stderr(`interrupted: ${err.message}`);
      io.exit(130);
      return;
    }
    const usage = err instanceof UsageError;
    const message = err instanceof Error ? err.message : String(err);
    io.stderr(`error: ${printable(message.split("\n")[0])}`);
    if (io.env.DEBUG && err instanceof Error && err.stack) io.stderr(err.stack);
    io.exit(usage ? 2 : 1);
  }
}

/** Error text can quote bytes from a user's files: control characters (escape sequences, NUL) are
 *  shown escaped (\x1b) instead of acting on the terminal. */
export function printable(text: string): string {
  return text.replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g, (c) => `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`);
}
