/** node:fs for the page: an in-memory file store. The page puts the preset's base (fetched from its
 *  server) and any adapter folder the user picks into it, src/'s loaders read them by path as they
 *  read a disk, and what src/'s savers write (an SFT model, a PEFT adapter) stays here until the page
 *  offers it for download. Errors carry Node's codes (ENOENT, EEXIST, ...), which src/ tests for.
 *  Only the calls src/ makes on the page's paths; anything else is a one-line error. */
import * as path from "./path.ts";

const files = new Map<string, Uint8Array>();
const dirs = new Set<string>(["/"]);

function fsError(code: string, op: string, p: string): Error {
  return Object.assign(new Error(`${code}: ${op} '${p}'`), { code, path: p, syscall: op });
}
const key = (p: string | URL) => path.resolve(String(p));
function addParents(p: string): void {
  for (let d = path.dirname(p); !dirs.has(d); d = path.dirname(d)) dirs.add(d);
}
const bytesOf = (data: string | Uint8Array): Uint8Array =>
  typeof data === "string" ? new TextEncoder().encode(data) : new Uint8Array(data);
const decode = (b: Uint8Array, enc?: unknown) => (enc === undefined || enc === null ? b : new TextDecoder().decode(b));
const encodingOf = (o: unknown) => (typeof o === "string" ? o : (o as { encoding?: string } | undefined)?.encoding);

/** The page's own entry point: put a file into the store (its folders are made). */
export function putFile(p: string, data: Uint8Array | string): void {
  const k = key(p);
  addParents(k);
  files.set(k, bytesOf(data));
}
/** The files under a folder, relative names → bytes (for downloads). */
export function filesUnder(dir: string): Map<string, Uint8Array> {
  const d = key(dir) + "/";
  return new Map([...files].filter(([k]) => k.startsWith(d)).map(([k, v]) => [k.slice(d.length), v]));
}

class Stats {
  constructor(
    readonly size: number,
    private readonly dir: boolean,
  ) {}
  isFile = () => !this.dir;
  isDirectory = () => this.dir;
  mtimeMs = 0;
}

export function statSync(p: string): Stats {
  const k = key(p);
  if (files.has(k)) return new Stats(files.get(k)!.length, false);
  if (dirs.has(k)) return new Stats(0, true);
  throw fsError("ENOENT", "stat", String(p));
}
export const existsSync = (p: string): boolean => files.has(key(p)) || dirs.has(key(p));
export function readFileSync(p: string, o?: unknown): Uint8Array | string {
  const b = files.get(key(p));
  if (!b) throw fsError(dirs.has(key(p)) ? "EISDIR" : "ENOENT", "open", String(p));
  return decode(b, encodingOf(o));
}
export function writeFileSync(p: string, data: string | Uint8Array): void {
  const k = key(p);
  if (!dirs.has(path.dirname(k))) throw fsError("ENOENT", "open", String(p));
  files.set(k, bytesOf(data));
}
export function appendFileSync(p: string, data: string | Uint8Array): void {
  const k = key(p);
  const old = files.get(k) ?? new Uint8Array(0),
    add = bytesOf(data);
  const out = new Uint8Array(old.length + add.length);
  out.set(old);
  out.set(add, old.length);
  writeFileSync(k, out);
}
export function mkdirSync(p: string, o?: { recursive?: boolean }): void {
  const k = key(p);
  if (files.has(k)) throw fsError("EEXIST", "mkdir", String(p));
  if (dirs.has(k)) {
    if (o?.recursive) return;
    throw fsError("EEXIST", "mkdir", String(p));
  }
  if (!o?.recursive && !dirs.has(path.dirname(k))) throw fsError("ENOENT", "mkdir", String(p));
  addParents(k);
  dirs.add(k);
}
export function rmSync(p: string, o?: { recursive?: boolean; force?: boolean }): void {
  const k = key(p);
  if (files.delete(k)) return;
  if (!dirs.has(k)) {
    if (o?.force) return;
    throw fsError("ENOENT", "rm", String(p));
  }
  const inside = [...files.keys(), ...dirs].filter((f) => f.startsWith(k + "/"));
  if (inside.length > 0 && !o?.recursive) throw fsError("ENOTEMPTY", "rm", String(p));
  for (const f of inside) files.delete(f) || dirs.delete(f);
  dirs.delete(k);
}
export function renameSync(from: string, to: string): void {
  const a = key(from),
    b = key(to);
  if (files.has(a)) {
    addParents(b);
    files.set(b, files.get(a)!);
    files.delete(a);
    return;
  }
  if (!dirs.has(a)) throw fsError("ENOENT", "rename", String(from));
  if (existsSync(b)) rmSync(b, { recursive: true });
  addParents(b);
  for (const f of [...files.keys()].filter((f) => f.startsWith(a + "/"))) {
    files.set(b + f.slice(a.length), files.get(f)!);
    files.delete(f);
  }
  for (const d of [...dirs].filter((d) => d === a || d.startsWith(a + "/"))) {
    dirs.delete(d);
    dirs.add(b + d.slice(a.length));
  }
}
export function readdirSync(p: string): string[] {
  const k = key(p);
  if (!dirs.has(k)) throw fsError("ENOENT", "scandir", String(p));
  const names = new Set<string>();
  for (const f of [...files.keys(), ...dirs]) if (f !== k && path.dirname(f) === k) names.add(path.basename(f));
  return [...names].sort();
}
let tempCount = 0;
/** A fresh folder named `prefix` + a counter (the store is the page's alone: no race to lose). */
export function mkdtempSync(prefix: string): string {
  let dir: string;
  do dir = `${prefix}${(++tempCount).toString(36).padStart(6, "0")}`;
  while (existsSync(dir));
  mkdirSync(dir, { recursive: true });
  return key(dir);
}
export function copyFileSync(from: string, to: string): void {
  writeFileSync(to, readFileSync(from) as Uint8Array);
}

/** A read-only handle (safetensors reads tensors by offset). */
class FileHandle {
  constructor(private readonly bytes: Uint8Array) {}
  async read(buf: Uint8Array, offset: number, length: number, position: number) {
    const part = this.bytes.subarray(position, position + length);
    buf.set(part, offset);
    return { bytesRead: part.length, buffer: buf };
  }
  async stat() {
    return new Stats(this.bytes.length, false);
  }
  async close() {}
}

const later =
  <A extends unknown[], R>(f: (...a: A) => R) =>
  async (...a: A): Promise<R> =>
    f(...a);
export const promises = {
  readFile: later(readFileSync),
  writeFile: later(writeFileSync),
  appendFile: later(appendFileSync),
  mkdir: later(mkdirSync),
  mkdtemp: later(mkdtempSync),
  rm: later(rmSync),
  rename: later(renameSync),
  readdir: later(readdirSync),
  copyFile: later(copyFileSync),
  stat: later(statSync),
  lstat: later(statSync),
  access: later((p: string) => void statSync(p)),
  open: later((p: string, flags = "r") => {
    if (flags !== "r") throw new Error(`fs.open '${p}' with flags ${flags}: the page's file store opens files for reading only`);
    const b = files.get(key(p));
    if (!b) throw fsError("ENOENT", "open", String(p));
    return new FileHandle(b);
  }),
};
export const constants = { F_OK: 0, R_OK: 4, W_OK: 2, X_OK: 1 };
export type { FileHandle };
export default {
  promises,
  constants,
  statSync,
  existsSync,
  readFileSync,
  writeFileSync,
  appendFileSync,
  mkdirSync,
  mkdtempSync,
  rmSync,
  renameSync,
  readdirSync,
  copyFileSync,
};
