/** Model id or folder → a local folder with config.json and weights. Order: an existing local folder,
 *  then the Hugging Face cache (util/hf-hub.ts: HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub;
 *  layout models--ORG--NAME/refs/main → snapshots/REV/), then, unless HF_HUB_OFFLINE is set, a
 *  download from the hub (HF_ENDPOINT, default https://huggingface.co) into the first cache root's
 *  layout, each file streamed to a temp name and renamed into place.
 *  Leaves out: revisions other than main, auth tokens, resumable downloads. */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import cliProgress from "cli-progress";
import { writeFileAtomic } from "../util/fs.ts";
import { hubCacheDirs, hubEndpoint, hubOffline, isHubId } from "../util/hf-hub.ts";

const exists = (p: string) => fs.stat(p).then(() => true, () => false);
const repoFolder = (id: string) => `models--${id.replace("/", "--")}`;

/** The snapshot folder of `ORG/NAME` in a cache root, or null when it is not there (or incomplete). */
export async function cachedSnapshot(id: string, cache: string): Promise<string | null> {
  const repo = path.join(cache, repoFolder(id));
  let rev: string;
  try {
    rev = (await fs.readFile(path.join(repo, "refs", "main"), "utf8")).trim();
  } catch {
    return null;
  }
  const snap = path.join(repo, "snapshots", rev);
  return (await exists(path.join(snap, "config.json"))) ? snap : null;
}

export async function resolveModelDir(pathOrId: string, env: NodeJS.ProcessEnv = process.env): Promise<string> {
  if (await exists(pathOrId)) {
    if (!(await fs.stat(pathOrId)).isDirectory()) throw new Error(`${pathOrId}: expected a model folder, found a file`);
    return path.resolve(pathOrId);
  }
  const isId = isHubId(pathOrId);
  const how = `download it with \`huggingface-cli download ${isId ? pathOrId : "ORG/NAME"}\` or pass a local folder with config.json and model.safetensors`;
  if (!isId) throw new Error(`model "${pathOrId}" not found: no such folder, and it is not a hub id (ORG/NAME); ${how}`);
  const caches = hubCacheDirs(env);
  for (const cache of caches) {
    const snap = await cachedSnapshot(pathOrId, cache);
    if (snap) return snap;
  }
  const where = `no local folder, not in the Hugging Face cache (${caches.join(", ")})`;
  if (hubOffline(env)) throw new Error(`model "${pathOrId}" not found: ${where}, and HF_HUB_OFFLINE is set, so no download was tried; ${how}`);
  try {
    return await download(pathOrId, caches[0], hubEndpoint(env));
  } catch (err) {
    throw new Error(`model "${pathOrId}" not found: ${where}, and the download failed (${(err as Error).message}); ${how}`);
  }
}

async function fetchOk(url: string): Promise<Response> {
  const res = await fetch(url);
  if (!res.ok) throw new Error(`GET ${url}: HTTP ${res.status}`);
  return res;
}

async function download(id: string, cache: string, endpoint: string): Promise<string> {
  const info = (await (await fetchOk(`${endpoint}/api/models/${id}/revision/main`)).json()) as { sha: string; siblings?: { rfilename: string }[] };
  const names = new Set((info.siblings ?? []).map((s) => s.rfilename));
  const files = ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"].filter((f) => names.has(f));
  if (names.has("model.safetensors")) files.push("model.safetensors");
  else if (names.has("model.safetensors.index.json")) {
    const idx = (await (await fetchOk(`${endpoint}/${id}/resolve/${info.sha}/model.safetensors.index.json`)).json()) as { weight_map: Record<string, string> };
    files.push("model.safetensors.index.json", ...new Set(Object.values(idx.weight_map)));
  } else throw new Error(`${id} has no model.safetensors or model.safetensors.index.json`);
  const repo = path.join(cache, repoFolder(id));
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
