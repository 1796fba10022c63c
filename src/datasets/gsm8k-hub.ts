/** GSM8K's parquet file for a split, by dataset name: first in the local Hugging Face cache, in the
 *  layout `datasets` / `huggingface-cli download` leave there
 *  (`<cache>/datasets--openai--gsm8k/snapshots/<rev>/main/<split>-00000-of-00001.parquet`), then by
 *  downloading that one file from the hub into the same layout (util/hub.ts). Only the `main` config;
 *  no auth tokens (GSM8K is public). */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { cachedMain, hubCacheDirs, hubDownload, hubOffline, setCachedMain } from "../util/hub.ts";

const REPO = "openai/gsm8k";
const NAMES = new Set(["gsm8k", "openai/gsm8k"]);
// The dataset moved from "gsm8k" to "openai/gsm8k"; an older cache may hold either folder.
const CACHE_FOLDERS = ["datasets--openai--gsm8k", "datasets--gsm8k"];

/** Path of the cached (or freshly downloaded) parquet file of one split. */
export async function resolveGsm8kSplit(name: string, split: "train" | "test", env: NodeJS.ProcessEnv = process.env): Promise<string> {
  if (!NAMES.has(name))
    throw new Error(
      `gsm8k source "${name}" is neither a file nor a dataset name; pass a .jsonl or .parquet path, or "gsm8k" / "openai/gsm8k"`,
    );
  const dirs = hubCacheDirs(env);
  const looked: string[] = [];
  for (const dir of dirs) {
    for (const folder of CACHE_FOLDERS) {
      const found = await findInSnapshot(path.join(dir, folder), split);
      looked.push(path.join(dir, folder, "snapshots", "*", "main", `${split}-*.parquet`));
      if (found) return found;
    }
  }
  const offline = hubOffline(env, ["HF_DATASETS_OFFLINE"]);
  let why = "HF_HUB_OFFLINE is set, so no download was tried";
  if (!offline) {
    try {
      const repo = { type: "dataset" as const, name: REPO, revision: "main", env };
      const file = await hubDownload(repo, `main/${split}-00000-of-00001.parquet`);
      await setCachedMain(repo, path.basename(path.dirname(path.dirname(file)))); // the commit it came from
      return file;
    } catch (err) {
      why = `download failed: ${(err as Error).message}`;
    }
  }
  throw new Error(
    `GSM8K ${split} split not found. Looked in: ${looked.join(", ")}; ${why}. ` +
      `Get it with \`huggingface-cli download ${REPO} --repo-type dataset\`, or pass a JSONL path ` +
      `(lines of {"question", "answer"}) or a parquet file instead of the name.`,
  );
}

/** The split's parquet file in the snapshot refs/main points to, else in any snapshot (newest first). */
async function findInSnapshot(repoDir: string, split: string): Promise<string | null> {
  const snapshots = path.join(repoDir, "snapshots");
  const revs = await fs.readdir(snapshots).catch(() => [] as string[]);
  if (revs.length === 0) return null;
  const main = await cachedMain(repoDir);
  const withTime = await Promise.all(
    revs.map(async (r) => ({ r, t: (await fs.stat(path.join(snapshots, r)).catch(() => null))?.mtimeMs ?? 0 })),
  );
  const ordered = withTime.sort((a, b) => Number(b.r === main) - Number(a.r === main) || b.t - a.t).map((x) => x.r);
  for (const rev of ordered) {
    const files = await fs.readdir(path.join(snapshots, rev, "main")).catch(() => [] as string[]);
    const hit = files.filter((f) => f.startsWith(`${split}-`) && f.endsWith(".parquet")).sort()[0];
    if (hit) return path.join(snapshots, rev, "main", hit);
  }
  return null;
}
