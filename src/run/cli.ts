/** Command-line plumbing shared by the scripts: the flag parsers (util/flag.ts, re-exported for the
 *  scripts), `runMain` (exit codes 0 / 1 error / 2 usage / 130 interrupted; the Ctrl-C path itself is
 *  in shutdown.ts). The flag tables themselves are in flags.ts and each run's *-flags.ts; the
 *  run-folder rules are in output-dir.ts. */
import { Interrupted } from "./shutdown.ts";
import { UsageError } from "../util/errors.ts";

// ---------------------------------------------------------------- flag parsers (util/flag.ts)

export { parseChoice, parseFloatArg, parseIntArg, parseList } from "../util/flag.ts";

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
