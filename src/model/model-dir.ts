/** Model id or folder → a local folder with config.json and weights. Order: an existing local folder,
 *  then the Hugging Face cache (util/hub.ts: models--ORG--NAME/refs/main → snapshots/REV/), then,
 *  unless HF_HUB_OFFLINE is set, a download from the hub (HF_ENDPOINT) into the first cache root:
 *  config, tokenizer files and the weights (model.safetensors, or every shard its index names).
 *  Leaves out: revisions other than main, auth tokens. */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { modelInfo } from "@huggingface/hub";
import { cachedMain, hubCacheDirs, hubDownload, hubEndpoint, hubOffline, isHubId, repoCacheDir, setCachedMain } from "../util/hub.ts";
import { exists } from "../util/fs.ts";

/** The snapshot folder of `ORG/NAME` in a cache root, or null when it is not there (or incomplete). */
export async function cachedSnapshot(id: string, cache: string): Promise<string | null> {
  const repo = repoCacheDir(cache, "model", id),
    rev = await cachedMain(repo);
  if (!rev) return null;
  const snap = path.join(repo, "snapshots", rev);
  return (await exists(path.join(snap, "config.json"))) ? snap : null;
}

export async function resolveModelDir(pathOrId: string, env: NodeJS.ProcessEnv = process.env): Promise<string> {
  if (await exists(pathOrId)) {
    if (!(await fs.stat(pathOrId)).isDirectory()) throw new Error(`${pathOrId}: expected a model folder, found a file`);
    return path.resolve(pathOrId);
  }
  const isId = isHubId(pathOrId);
  const how =
    `download it with \`huggingface-cli download ${isId ? pathOrId : "ORG/NAME"}\`` +
    " or pass a local folder with config.json and model.safetensors";
  if (!isId) throw new Error(`model "${pathOrId}" not found: no such folder, and it is not a hub id (ORG/NAME); ${how}`);
  const caches = hubCacheDirs(env);
  for (const cache of caches) {
    const snap = await cachedSnapshot(pathOrId, cache);
    if (snap) return snap;
  }
  const where = `no local folder, not in the Hugging Face cache (${caches.join(", ")})`;
  if (hubOffline(env))
    throw new Error(`model "${pathOrId}" not found: ${where}, and HF_HUB_OFFLINE is set, so no download was tried; ${how}`);
  try {
    return await download(pathOrId, env);
  } catch (err) {
    throw new Error(`model "${pathOrId}" not found: ${where}, and the download failed (${(err as Error).message}); ${how}`);
  }
}

async function download(id: string, env: NodeJS.ProcessEnv): Promise<string> {
  const info = await modelInfo({ name: id, revision: "main", hubUrl: hubEndpoint(env), additionalFields: ["sha", "filePaths"] });
  const names = new Set(info.filePaths ?? []);
  const repo = { type: "model" as const, name: id, revision: info.sha, env };
  const files = ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"].filter((f) => names.has(f));
  if (names.has("model.safetensors")) files.push("model.safetensors");
  else if (names.has("model.safetensors.index.json")) {
    const index = JSON.parse(await fs.readFile(await hubDownload(repo, "model.safetensors.index.json"), "utf8")) as {
      weight_map: Record<string, string>;
    };
    files.push("model.safetensors.index.json", ...new Set(Object.values(index.weight_map)));
  } else throw new Error(`${id} has no model.safetensors or model.safetensors.index.json`);
  for (const f of files) await hubDownload(repo, f);
  await setCachedMain(repo, info.sha);
  return path.join(repoCacheDir(hubCacheDirs(env)[0], "model", id), "snapshots", info.sha);
}
