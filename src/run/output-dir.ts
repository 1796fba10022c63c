/** The run-folder rules: never mix two runs in one folder. A run locks its --output_dir while it lives
 *  (util/lock.ts); a folder that holds a run is continued only with --resume (and only by a run of
 *  its kind) or replaced only with --overwrite; a folder that does not look like a run is never
 *  emptied; a new run that failed leaves nothing behind. run.json holds the resolved config. */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { UsageError } from "../util/errors.ts";
import { cleanTempFiles, writeFileAtomic } from "../util/fs.ts";
import { LOCK_FILE, lockFolder, unlockFolder } from "../util/lock.ts";

/** Files whose presence means a folder already holds a run. */
export const RUN_MARKERS = ["run.json", "metrics.jsonl", "latest"] as const;
export const RUN_CONFIG_FILE = "run.json";

export interface PrepareOptions {
  overwrite?: boolean;
  resume?: boolean;
  /** "sft", "grpo", "eval", ...: resuming a folder written by another kind of run is refused. */
  runKind: string;
  /** Flag name used in messages (default "--output_dir"). */
  flag?: string;
  /** Whether this kind of run can be continued with --resume (default true; an evaluation cannot). */
  resumable?: boolean;
}

function hasRunMarker(names: string[]): boolean {
  return names.some((n) => (RUN_MARKERS as readonly string[]).includes(n) || /^checkpoint-\d+$/.test(n));
}

/** Make `dir` ready for a run and lock it for this process (util/lock.ts: a second run is refused
 *  while this one lives). A folder that already holds a run is refused unless `overwrite` (then
 *  emptied) or `resume` (then kept, its run kind must match, and temp files of interrupted writes are
 *  cleaned up). A non-empty folder that does not look like a run is always refused, so a mistyped
 *  path never empties someone's files. Nothing is written when refusing. Returns whether a previous
 *  run is being continued. */
export async function prepareOutputDir(dir: string, opts: PrepareOptions): Promise<{ resumed: boolean }> {
  if (opts.overwrite && opts.resume) throw new UsageError(`--overwrite and --resume together: pick one (fresh run or continue ${dir})`);
  const flag = opts.flag ?? "--output_dir";
  const stat = await fs.stat(dir).catch(() => undefined);
  if (stat && !stat.isDirectory()) throw new UsageError(`${flag} ${dir} is a file: expected a folder path`);
  if (!stat) {
    await mkdirChecked(dir, flag);
    created.add(path.resolve(dir));
    lock(dir, flag);
    return { resumed: false };
  }
  const locked = lock(dir, flag);
  try {
    const names = (await fs.readdir(dir)).filter((n) => n !== LOCK_FILE);
    const isRun = hasRunMarker(names);
    if (opts.resume) {
      if (!isRun)
        throw new UsageError(`--resume: ${dir} holds no run to continue (no ${RUN_MARKERS.join(" / ")}); drop --resume to start one`);
      const kind = await readRunKind(dir);
      if (kind !== undefined && kind !== opts.runKind)
        throw new UsageError(`--resume: ${dir} holds a ${kind} run, not ${opts.runKind}; pick another ${flag}`);
      await cleanTempFiles(dir);
      return { resumed: true };
    }
    if (names.length > 0 && !isRun) throw new UsageError(`${flag} ${dir} is not empty and does not hold a run; pick a new or empty folder`);
    if (isRun) {
      if (!opts.overwrite)
        throw new UsageError(
          opts.resumable === false
            ? `${flag} ${dir} already holds a run; pass --overwrite to replace it or pick another ${flag}`
            : `${flag} ${dir} already holds a run; pass --resume to continue it or --overwrite to replace it`,
        );
      for (const n of names) await fs.rm(path.join(dir, n), { recursive: true, force: true });
    }
    return { resumed: false };
  } catch (err) {
    if (locked) unlockFolder(dir);
    throw err;
  }
}

const created = new Set<string>();

/** After a new run failed: if it left nothing to continue from (no checkpoint, no logged step), remove
 *  what it wrote (the folder was empty, or emptied by --overwrite, when it began) and a folder it
 *  created, so the same command can simply be run again. Gives the folder's lock back. */
export async function discardFailedRun(dir: string): Promise<void> {
  const names = (await fs.readdir(dir).catch(() => [] as string[])).filter((n) => n !== LOCK_FILE);
  const metrics = await fs.stat(path.join(dir, "metrics.jsonl")).then(
    (s) => s.size,
    () => 0,
  );
  if (metrics === 0 && !names.some((n) => /^checkpoint-\d+$/.test(n))) {
    for (const n of names) await fs.rm(path.join(dir, n), { recursive: true, force: true });
    unlockFolder(dir);
    if (created.delete(path.resolve(dir))) await fs.rmdir(dir).catch(() => {});
  }
  unlockFolder(dir);
}

/** The run in `dir` ended: give its lock back. */
export function releaseOutputDir(dir: string): void {
  unlockFolder(dir);
}

function lock(dir: string, flag: string): boolean {
  return lockFolder(
    dir,
    (pid) => new UsageError(`${flag} ${dir} is in use by another run (process ${pid}); wait for it to end or pick another folder`),
    (line) => process.stderr.write(line + "\n"),
  );
}

/** mkdir -p, one level at a time (Node's recursive mkdir never returns for a path under /proc), with
 *  a one-line usage error for a place where no folder can be made. */
async function mkdirChecked(dir: string, flag: string): Promise<void> {
  const missing: string[] = [];
  for (
    let d = path.resolve(dir);
    !(await fs.stat(d).then(
      () => true,
      () => false,
    ));
    d = path.dirname(d)
  )
    missing.unshift(d);
  for (const d of missing) {
    try {
      await fs.mkdir(d);
    } catch (err) {
      const e = err as NodeJS.ErrnoException;
      if (e.code === "EEXIST") continue;
      throw new UsageError(`${flag} ${dir}: cannot create the folder (${e.code ?? e.message}); pick a writable folder path`);
    }
  }
}

async function readRunKind(dir: string): Promise<string | undefined> {
  const text = await fs.readFile(path.join(dir, RUN_CONFIG_FILE), "utf8").catch(() => undefined);
  if (text === undefined) return undefined;
  try {
    const kind = (JSON.parse(text) as { runKind?: unknown }).runKind;
    return typeof kind === "string" ? kind : undefined;
  } catch {
    throw new Error(`${path.join(dir, RUN_CONFIG_FILE)} is not valid JSON; fix or remove it`);
  }
}

/** Write the resolved config as `run.json` (atomic): `{ runKind, createdAt, config }`. */
export async function writeRunConfig(dir: string, config: unknown, runKind?: string): Promise<string> {
  const file = path.join(dir, RUN_CONFIG_FILE);
  const body = { runKind, createdAt: new Date().toISOString(), config };
  await writeFileAtomic(file, JSON.stringify(body, null, 2) + "\n");
  return file;
}

/** Add entries to run.json beside its config (atomic): what the run settles only once it runs. The
 *  config, which a resumed run compares, is left as it is. */
export async function annotateRunConfig(dir: string, entries: Record<string, unknown>): Promise<void> {
  const file = path.join(dir, RUN_CONFIG_FILE);
  const body = JSON.parse(await fs.readFile(file, "utf8")) as Record<string, unknown>;
  await writeFileAtomic(file, JSON.stringify({ ...body, ...entries }, null, 2) + "\n");
}

/** Read back what writeRunConfig wrote. */
export async function readRunConfig(dir: string): Promise<{ runKind?: string; createdAt?: string; config: unknown }> {
  const file = path.join(dir, RUN_CONFIG_FILE);
  const text = await fs.readFile(file, "utf8").catch(() => {
    throw new Error(`${file} not found: expected a run folder written by this project`);
  });
  try {
    return JSON.parse(text);
  } catch {
    throw new Error(`${file} is not valid JSON`);
  }
}
