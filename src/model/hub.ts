/** Model id or folder → a local folder with config.json and weights. Order: an existing local folder,
 *  then the Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub; layout
 *  models--ORG--NAME/refs/main → snapshots/REV/), then a download from the hub (HF_ENDPOINT, default
 *  https://huggingface.co) into that same cache layout, each file written atomically.
 *  Leaves out: revisions other than main, auth tokens, resumable downloads. */
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import cliProgress from "cli-progress";
import { writeFileAtomic } from "../util/fs.ts";

const exists = (p: string) => fs.stat(p).then(() => true, () => false);

export function hubCacheDir(): string {
  if (process.env.HF_HUB_CACHE) return process.env.HF_HUB_CACHE;
  if (process.env.HF_HOME) return path.join(process.env.HF_HOME, "hub");
  return path.join(os.homedir(), ".cache", "huggingface", "hub");
}

/** The snapshot folder of `ORG/NAME` in the cache, or null when it is not there (or incomplete). */
export async function cachedSnapshot(id: string, cache = hubCacheDir()): Promise<string | null> {
  const repo = path.join(cache, `models--${id.replace("/", "--")}`);
  let rev: string;
  try {
    rev = (await fs.readFile(path.join(repo, "refs", "main"), "utf8")).trim();
  } catch {
    return null;
  }
  const snap = path.join(repo, "snapshots", rev);
  return (await exists(path.join(snap, "config.json"))) ? snap : null;
}

export async function resolveModelDir(pathOrId: string): Promise<string> {
  if (await exists(pathOrId)) {
    if (!(await fs.stat(pathOrId)).isDirectory()) throw new Error(`${pathOrId}: expected a model folder, found a file`);
    return path.resolve(pathOrId);
  }
  const isId = /^[\w.-]+\/[\w.-]+$/.test(pathOrId);
  const cache = hubCacheDir();
  const how = `download it with \`huggingface-cli download ${isId ? pathOrId : "ORG/NAME"}\` or pass a local folder with config.json and model.safetensors`;
  if (!isId) throw new Error(`model "${pathOrId}" not found: no such folder, and it is not a hub id (ORG/NAME); ${how}`);
  const snap = await cachedSnapshot(pathOrId, cache);
  if (snap) return snap;
  try {
    return await download(pathOrId, cache);
  } catch (err) {
    throw new Error(`model "${pathOrId}" not found: no local folder, not in the Hugging Face cache ${cache}, and the download failed (${(err as Error).message}); ${how}`);
  }
}

async function fetchOk(url: string): Promise<Response> {
  const res = await fetch(url);
  if (!res.ok) throw new Error(`GET ${url}: HTTP ${res.status}`);
  return res;
}

async function download(id: string, cache: string): Promise<string> {
  const endpoint = (process.env.HF_ENDPOINT ?? "https://huggingface.co").replace(/\/$/, "");
  const info = (await (await fetchOk(`${endpoint}/api/models/${id}/revision/main`)).json()) as { sha: string; siblings?: { rfilename: string }[] };
  const names = new Set((info.siblings ?? []).map((s) => s.rfilename));
  const files = ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"].filter((f) => names.has(f));
  if (names.has("model.safetensors")) files.push("model.safetensors");
  else if (names.has("model.safetensors.index.json")) {
    const idx = (await (await fetchOk(`${endpoint}/${id}/resolve/${info.sha}/model.safetensors.index.json`)).json()) as { weight_map: Record<string, string> };
    files.push("model.safetensors.index.json", ...new Set(Object.values(idx.weight_map)));
  } else throw new Error(`${id} has no model.safetensors or model.safetensors.index.json`);
  const repo = path.join(cache, `models--${id.replace("/", "--")}`);
  const snap = path.join(repo, "snapshots", info.sha);
  const bar = new cliProgress.SingleBar({ format: `${id} {file} [{bar}] {percentage}%`, stream: process.stderr }, cliProgress.Presets.shades_classic);
  for (const f of files) {
    if (await exists(path.join(snap, f))) continue;
    const res = await fetchOk(`${endpoint}/${id}/resolve/${info.sha}/${f}`);
    const total = Number(res.headers.get("content-length") ?? 0);
    // Streamed to a temp name beside the target, renamed when complete: a 1 GB shard never sits in memory.
    const dest = path.join(snap, f), part = `${dest}.${process.pid}.part`;
    await fs.mkdir(path.dirname(dest), { recursive: true });
    const out = await fs.open(part, "w");
    bar.start(total || 1, 0, { file: f });
    let got = 0;
    try {
      for await (const c of res.body as unknown as AsyncIterable<Uint8Array>) {
        await out.write(c);
        got += c.length;
        bar.update(Math.min(got, total || 1));
      }
    } catch (err) {
      await out.close();
      await fs.rm(part, { force: true });
      throw err;
    } finally {
      bar.stop();
    }
    await out.close();
    await fs.rename(part, dest);
  }
  await writeFileAtomic(path.join(repo, "refs", "main"), info.sha);
  return snap;
}
