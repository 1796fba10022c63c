/** One run per folder at a time: `<dir>/.lock` holds the pid of the process using the folder. It is
 *  created exclusively (O_EXCL), so of two runs starting together exactly one gets it. A lock whose
 *  process is gone (killed, crashed) is taken over with a warning; a live one refuses the second run.
 *  Locks are removed when the run ends or the process exits. */
import * as fs from "node:fs";
import * as path from "node:path";

export const LOCK_FILE = ".lock";
const held = new Set<string>();
let exitHook = false;

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM"; // exists, owned by someone else
  }
}

function readPid(file: string): number | undefined {
  try {
    const n = Number(fs.readFileSync(file, "utf8").trim());
    return Number.isInteger(n) && n > 0 ? n : undefined;
  } catch {
    return undefined;
  }
}

/** Take `<dir>/.lock` (the folder must exist). Throws `refuse(pid)`'s error when a live process holds
 *  it. `warn` gets one line when a dead process's lock is taken over. Returns false when this process
 *  held it already. */
export function lockFolder(dir: string, refuse: (pid: number) => Error, warn: (line: string) => void): boolean {
  const file = path.resolve(dir, LOCK_FILE);
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      fs.writeFileSync(file, `${process.pid}\n`, { flag: "wx" });
      held.add(file);
      if (!exitHook) {
        exitHook = true;
        process.on("exit", () => {
          for (const f of held) unlockFile(f);
        });
      }
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    }
    const pid = readPid(file);
    if (pid === process.pid) {
      held.add(file);
      return false;
    }
    // A lock file being written right now reads empty: treat as live rather than steal it.
    if (pid === undefined ? Date.now() - fs.statSync(file).mtimeMs < 5000 : alive(pid)) throw refuse(pid ?? 0);
    warn(`warning: ${dir} was locked by process ${pid ?? "?"}, which is no longer running; taking the lock over`);
    fs.rmSync(file, { force: true });
  }
  throw refuse(readPid(file) ?? 0);
}

function unlockFile(file: string): void {
  if (readPid(file) === process.pid) fs.rmSync(file, { force: true });
  held.delete(file);
}

/** Give the folder's lock back (a no-op if this process does not hold it). */
export function unlockFolder(dir: string): void {
  const file = path.resolve(dir, LOCK_FILE);
  if (held.has(file)) unlockFile(file);
}
