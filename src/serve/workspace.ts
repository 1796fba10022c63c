/** Model paths that arrive over HTTP, checked before anything is loaded: the path resolves (through
 *  every symlink) inside the workspace, is a Hugging Face model folder or a PEFT adapter folder, every
 *  file the loader reads there (shards named by an index too) is a regular file, its JSON files parse,
 *  an adapter's base is the scenario's base model or lies in the workspace, and the weights are not
 *  larger than the cap. Files in the folder may link outside the workspace: in AutoRL-Bench's layout
 *  `models/<base>` links to a shared folder, and a trained output often links its unchanged tokenizer
 *  and config files there. Such files are only read (never written), count toward the size cap, and
 *  an error about one names it but never quotes it, so a link to a secret file leaks nothing. The
 *  result carries a fingerprint (each file's size and modification time) that keys the evaluation
 *  cache. Leaves out: the meaning of what is inside the files (the loader checks that). */
import { createHash } from "node:crypto";
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { adapterBaseOf } from "../run/policy.ts";
import { HttpError } from "./errors.ts";

export interface ModelFolder {
  dir: string; // real path
  kind: "model" | "adapter";
  base: string | null; // an adapter's base as the loader will open it (real path, or the scenario's hub id)
  bytes: number; // weights and configs read by the loader
  fingerprint: string; // sha256 over file names, sizes and modification times (and the base's)
}

const MAX_PATH = 4096;

/** True when `p` is `root` or lies under it (both already absolute and normalised). */
export function isInside(root: string, p: string): boolean {
  const rel = path.relative(root, p);
  return rel === "" || (!rel.startsWith("..") && !path.isAbsolute(rel));
}

/** A request's model_path as a real folder inside `workspace` (itself a real path). Relative paths
 *  are relative to the workspace. Outside (by text, or once symlinks are followed): 403; missing: 404. */
export async function resolveInWorkspace(workspace: string, modelPath: string, field = "model_path"): Promise<string> {
  if (modelPath.length === 0 || modelPath.length > MAX_PATH || modelPath.includes("\0"))
    throw new HttpError(400, `${field} must be a non-empty path of at most ${MAX_PATH} characters without NUL bytes`);
  const lexical = path.resolve(workspace, modelPath);
  const outside = new HttpError(
    403,
    `${field} ${JSON.stringify(modelPath)} is outside the workspace ${workspace}; submit a folder inside it`,
  );
  const real = await fs.realpath(lexical).catch(() => null);
  // Text outside but real path inside: an absolute path through a symlinked prefix (/tmp → /private/tmp).
  // The same answer whether an outside path exists or not, so nothing is learned about the rest of the disk.
  if (!isInside(workspace, lexical) && (real === null || !isInside(workspace, real))) throw outside;
  if (real === null) throw new HttpError(404, `${field} ${JSON.stringify(modelPath)} does not exist in the workspace`);
  if (!isInside(workspace, real))
    throw new HttpError(
      403,
      `${field} ${JSON.stringify(modelPath)} resolves through a symlink to a path outside the workspace ${workspace}`,
    );
  return real;
}

/** A file the loader will read: followed through symlinks (anywhere), it must be a regular file. */
async function regularFile(file: string): Promise<{ size: number; mtimeMs: number }> {
  const st = await fs.stat(file).catch(() => null);
  if (st === null) throw new HttpError(400, `file ${file} cannot be read (a broken symlink?)`);
  if (!st.isFile()) throw new HttpError(400, `file ${file} is not a regular file`);
  return { size: st.size, mtimeMs: st.mtimeMs };
}

const MAX_JSON_BYTES = 64 * 2 ** 20; // config, tokenizer (Qwen2.5's tokenizer.json is 7 MB), index

/** Parse a JSON file of a submitted folder. A file that is not JSON is a model that does not load
 *  (422, as a broken weights file). The error names the file only: V8's message quotes the text it
 *  could not parse, and the file may be a link to something that must not be shown. */
async function parseJsonFile(file: string, size: number): Promise<unknown> {
  if (size > MAX_JSON_BYTES)
    throw new HttpError(413, `file ${file} is ${size} bytes; JSON files of a model folder may hold at most ${MAX_JSON_BYTES}`);
  try {
    return JSON.parse(await fs.readFile(file, "utf8"));
  } catch {
    throw new HttpError(422, `file ${file} is not valid JSON`);
  }
}

/** Files of a folder the loader may read, with their stats: configs, weights, tokenizer, template. */
async function loaderFiles(dir: string): Promise<Array<{ name: string; size: number; mtimeMs: number }>> {
  const out: Array<{ name: string; size: number; mtimeMs: number }> = [];
  for (const name of (await fs.readdir(dir)).sort()) {
    if (!/\.(json|safetensors|jinja|bin|model|txt)$/.test(name)) continue;
    const file = path.join(dir, name);
    const lst = await fs.lstat(file);
    if (lst.isDirectory()) continue;
    const st = await regularFile(file);
    if (name.endsWith(".json")) await parseJsonFile(file, st.size);
    out.push({ name, ...st });
  }
  // A sharded checkpoint names its shards in the index: each must be a file of this folder.
  const index = out.find((f) => f.name === "model.safetensors.index.json");
  if (index) {
    const map = (((await parseJsonFile(path.join(dir, index.name), index.size)) ?? {}) as { weight_map?: unknown }).weight_map;
    for (const shard of new Set(Object.values((map ?? {}) as Record<string, unknown>))) {
      if (typeof shard !== "string" || shard !== path.basename(shard) || !out.some((f) => f.name === shard))
        throw new HttpError(
          400,
          `${path.join(dir, index.name)} names shard ${JSON.stringify(String(shard).slice(0, 100))}, which is not a file of that folder`,
        );
    }
  }
  return out;
}

export interface InspectOptions {
  workspace: string; // real path
  scenarioBase: string; // the scenario's base model as configured (hub id or folder)
  scenarioBaseDir: string | null; // its real folder, when on this machine
  maxBytes: number;
}

/** Check a submitted folder (already resolved inside the workspace) and fingerprint it. */
export async function inspectModelFolder(dir: string, o: InspectOptions): Promise<ModelFolder> {
  const st = await fs.stat(dir);
  if (!st.isDirectory())
    throw new HttpError(400, `model_path ${dir} is a file; expected a Hugging Face model folder or a PEFT adapter folder`);
  const files = await loaderFiles(dir);
  const has = (n: string) => files.some((f) => f.name === n);
  const kind = has("adapter_config.json") ? "adapter" : has("config.json") ? "model" : null;
  if (!kind)
    throw new HttpError(
      400,
      `model_path ${dir} holds no config.json or adapter_config.json; expected a Hugging Face model folder or a PEFT adapter folder`,
    );
  let bytes = files.reduce((a, f) => a + f.size, 0);
  let base: string | null = null;
  let baseFiles: unknown = null;
  if (kind === "adapter") {
    let named: string;
    try {
      named = await adapterBaseOf(dir);
    } catch (err) {
      throw new HttpError(400, (err as Error).message.split("\n")[0]);
    }
    base = await checkAdapterBase(named, dir, o);
    if (base !== o.scenarioBase) {
      const bf = await loaderFiles(base);
      bytes += bf.reduce((a, f) => a + f.size, 0);
      baseFiles = bf;
    } else if (o.scenarioBaseDir) baseFiles = await statFiles(o.scenarioBaseDir);
  }
  if (bytes > o.maxBytes)
    throw new HttpError(
      413,
      `model_path ${dir}: ${(bytes / 2 ** 30).toFixed(2)} GiB of weights and configs is more than this ` +
        `server's cap of ${(o.maxBytes / 2 ** 30).toFixed(2)} GiB`,
    );
  const fingerprint = createHash("sha256").update(JSON.stringify({ dir, files, base, baseFiles })).digest("hex");
  return { dir, kind, base, bytes, fingerprint };
}

/** An adapter's base: the scenario's base model, or a model folder inside the workspace (an SFT
 *  output the adapter was trained on). Anything else could make the server read models it should
 *  not, so it is refused. Returns the base as the loader will open it. */
async function checkAdapterBase(named: string, adapterDir: string, o: InspectOptions): Promise<string> {
  if (named === o.scenarioBase) return o.scenarioBase;
  // The loader opens a name that is a folder (relative to the working directory) as a folder.
  const real = await fs.realpath(named).catch(() => null);
  if (real !== null) {
    if (o.scenarioBaseDir !== null && real === o.scenarioBaseDir) return o.scenarioBase;
    if (isInside(o.workspace, real)) {
      if (
        !(await fs.stat(path.join(real, "config.json")).then(
          (s) => s.isFile(),
          () => false,
        ))
      )
        throw new HttpError(400, `adapter ${adapterDir}: its base ${named} holds no config.json`);
      return real;
    }
  }
  throw new HttpError(
    403,
    `adapter ${adapterDir} names base ${JSON.stringify(named)}, which is neither this scenario's base ` +
      `model (${o.scenarioBase}) nor a model folder inside the workspace`,
  );
}

async function statFiles(dir: string): Promise<Array<[string, number, number]>> {
  const out: Array<[string, number, number]> = [];
  for (const name of (await fs.readdir(dir)).sort()) {
    const st = await fs.stat(path.join(dir, name)).catch(() => null);
    if (st?.isFile()) out.push([name, st.size, st.mtimeMs]);
  }
  return out;
}

/** Fingerprint of a base model folder (for the baseline's cache key). */
export async function folderFingerprint(dir: string): Promise<string> {
  return createHash("sha256")
    .update(JSON.stringify({ dir, files: await statFiles(dir) }))
    .digest("hex");
}
