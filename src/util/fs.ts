/** Writes that never leave a half-written file or folder behind: write to a temp name beside the
 *  target, then rename into place (rename is atomic within one file system). Whether a path exists,
 *  and whether a folder takes new files. */
import * as fsSync from "node:fs";
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { UsageError } from "./errors.ts";

export async function writeFileAtomic(file: string, data: string | Uint8Array): Promise<void> {
  await fs.mkdir(path.dirname(file), { recursive: true });
  const tmp = `${file}.${process.pid}.${Date.now()}.tmp`;
  try {
    await fs.writeFile(tmp, data);
    await fs.rename(tmp, file);
  } catch (err) {
    await fs.rm(tmp, { force: true });
    throw err;
  }
}

/** writeFileAtomic for synchronous callers. */
export function writeFileAtomicSync(file: string, data: string | Uint8Array): void {
  fsSync.mkdirSync(path.dirname(file), { recursive: true });
  const tmp = `${file}.${process.pid}.${Date.now()}.tmp`;
  try {
    fsSync.writeFileSync(tmp, data);
    fsSync.renameSync(tmp, file);
  } catch (err) {
    fsSync.rmSync(tmp, { force: true });
    throw err;
  }
}

/** Fill a temp folder with `fill(tmpDir)`, then replace `dir` with it. An old `dir` is moved aside
 *  first and removed only after the new one is in place, so a crash leaves either the old or the new. */
export async function writeDirAtomic(dir: string, fill: (tmpDir: string) => Promise<void>): Promise<void> {
  const parent = path.dirname(path.resolve(dir));
  await fs.mkdir(parent, { recursive: true });
  const stamp = `${process.pid}.${Date.now()}`;
  const tmp = path.join(parent, `.${path.basename(dir)}.${stamp}.tmp`);
  const old = path.join(parent, `.${path.basename(dir)}.${stamp}.old`);
  await fs.rm(tmp, { recursive: true, force: true });
  await fs.mkdir(tmp, { recursive: true });
  try {
    await fill(tmp);
  } catch (err) {
    await fs.rm(tmp, { recursive: true, force: true });
    throw err;
  }
  const hadOld = await fs.stat(dir).then(
    () => true,
    () => false,
  );
  if (hadOld) await fs.rename(dir, old);
  await fs.rename(tmp, dir);
  if (hadOld) await fs.rm(old, { recursive: true, force: true });
}

/** What interrupted atomic writes leave in `dir`: files and folders named `<name>.<pid>.<stamp>.tmp`
 *  are removed; a folder moved aside as `.<name>.<pid>.<stamp>.old` is removed when `<name>` is in
 *  place, else renamed back (the crash came between the two renames, so it is the only copy).
 *  Call only while no other process writes to `dir` (under its run lock). Returns what it removed. */
export async function cleanTempFiles(dir: string): Promise<string[]> {
  const removed: string[] = [];
  for (const n of await fs.readdir(dir).catch(() => [] as string[])) {
    const p = path.join(dir, n);
    if (/\.\d+\.\d+\.tmp$/.test(n)) {
      await fs.rm(p, { recursive: true, force: true });
      removed.push(n);
      continue;
    }
    const old = /^\.(.+)\.\d+\.\d+\.old$/.exec(n);
    if (!old) continue;
    if (
      await fs.stat(path.join(dir, old[1])).then(
        () => true,
        () => false,
      )
    ) {
      await fs.rm(p, { recursive: true, force: true });
      removed.push(n);
    } else await fs.rename(p, path.join(dir, old[1]));
  }
  return removed;
}

/** `dir/name` for a file name read from a file (a shard index): it must be a relative path that stays
 *  inside `dir`, so a crafted index cannot open /etc/passwd or another model's files. Only the name
 *  is checked, not symlinks inside `dir` (the Hugging Face cache links snapshots to its blobs). */
export function insideFolder(dir: string, name: unknown, where: string): string {
  if (typeof name !== "string" || name === "" || name.includes("\0"))
    throw new Error(`${where} is ${JSON.stringify(name)?.slice(0, 80)}; expected a file name inside ${dir}`);
  const full = path.resolve(dir, name);
  const rel = path.relative(path.resolve(dir), full);
  if (path.isAbsolute(name) || rel === "" || rel.startsWith("..") || path.isAbsolute(rel))
    throw new Error(
      `${where} is ${JSON.stringify(name).slice(0, 80)}, which is outside ${dir}; expected a file name inside the model folder`,
    );
  return full;
}

/** Whether something (a file or a folder) is at `p`. */
export async function exists(p: string): Promise<boolean> {
  return fs.stat(p).then(
    () => true,
    () => false,
  );
}

/** Whether a file (not a folder) is at `p`. */
export async function isFile(p: string): Promise<boolean> {
  return fs.stat(p).then(
    (s) => s.isFile(),
    () => false,
  );
}

/** Whether a folder is at `p`. */
export async function isDir(p: string): Promise<boolean> {
  return fs.stat(p).then(
    (s) => s.isDirectory(),
    () => false,
  );
}

/** A folder a script will write files into, checked before the work that comes first: it, or the
 *  nearest folder above it that exists, must take a new file. Checked by writing (and removing) an
 *  empty temp file there, since permission bits do not tell for root or a read-only mount. Nothing is
 *  created or left behind. */
export async function checkWritableFolder(dir: string, flag: string): Promise<void> {
  let at = path.resolve(dir);
  for (;;) {
    const stat = await fs.stat(at).catch(() => undefined);
    if (stat?.isDirectory()) break;
    if (stat && at === path.resolve(dir)) throw new UsageError(`${flag} ${dir} is a file: expected a folder path`);
    if (stat) throw new UsageError(`${flag} ${dir}: ${at} is a file, so no folder can be made in it; expected a folder path`);
    if (path.dirname(at) === at) break;
    at = path.dirname(at);
  }
  const probe = path.join(at, `.write-check.${process.pid}.${Date.now()}.tmp`);
  try {
    await fs.writeFile(probe, "");
  } catch (err) {
    throw folderWriteError(err, dir, flag);
  }
  await fs.rm(probe, { force: true });
}

/** A write into `dir` that the system refused (permissions, a read-only mount, a file where a folder
 *  must be) as a usage error naming the folder; any other error as it is. */
export function folderWriteError(err: unknown, dir: string, flag: string): unknown {
  const code = (err as NodeJS.ErrnoException)?.code;
  if (!code || !["EACCES", "EPERM", "EROFS", "ENOTDIR"].includes(code)) return err;
  return new UsageError(`${flag} ${dir}: cannot write in this folder (${code}); pick a writable folder path`);
}
