/** The Hugging Face hub and its local cache, through @huggingface/hub: where the cache is (read from the
 *  environment as huggingface_hub reads it: HF_HUB_CACHE, else HF_HOME/hub, else $XDG_CACHE_HOME or
 *  ~/.cache + huggingface/hub), the endpoint (HF_ENDPOINT) and offline mode (HF_HUB_OFFLINE, or
 *  HF_DATASETS_OFFLINE for datasets); a repository's snapshot in the cache (refs/main →
 *  snapshots/REV/); and downloads into that layout (blobs/ with snapshot links, as the hub's own
 *  clients write it) by the library's downloadFileToCacheDir, with a progress bar on stderr.
 *  Leaves out: revisions other than main, auth tokens. */
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { downloadFileToCacheDir, getRepoFolderName, HubApiError, type RepoType } from "@huggingface/hub";
import cliProgress from "cli-progress";
import { writeFileAtomic } from "./fs.ts";

/** A hub repository id, ORG/NAME (what is not a local path is looked up as one). */
export function isHubId(s: string): boolean {
  return /^[\w.-]+\/[\w.-]+$/.test(s) && !s.startsWith(".");
}

/** Cache roots, most specific first; downloads go to the first. */
export function hubCacheDirs(env: NodeJS.ProcessEnv = process.env): string[] {
  const dirs: string[] = [];
  if (env.HF_HUB_CACHE) dirs.push(env.HF_HUB_CACHE);
  if (env.HF_HOME) dirs.push(path.join(env.HF_HOME, "hub"));
  dirs.push(path.join(env.XDG_CACHE_HOME ?? path.join(os.homedir(), ".cache"), "huggingface", "hub"));
  return [...new Set(dirs)];
}

export function hubEndpoint(env: NodeJS.ProcessEnv = process.env): string {
  return (env.HF_ENDPOINT ?? "https://huggingface.co").replace(/\/+$/, "");
}

export function hubOffline(env: NodeJS.ProcessEnv = process.env, also: string[] = []): boolean {
  return ["HF_HUB_OFFLINE", ...also].some((k) => {
    const v = env[k];
    return v !== undefined && ["1", "true", "yes", "on"].includes(v.toLowerCase());
  });
}

/** A repository's folder in a cache root: models--ORG--NAME, datasets--ORG--NAME. */
export const repoCacheDir = (cache: string, type: RepoType, name: string) => path.join(cache, getRepoFolderName({ type, name }));

/** The revision refs/main names in a repository's cache folder ("" when none). */
export const cachedMain = async (repoDir: string) => (await fs.readFile(path.join(repoDir, "refs", "main"), "utf8").catch(() => "")).trim();

export interface HubFiles {
  type: RepoType;
  name: string;
  /** A commit hash, or "main". */
  revision: string;
  env?: NodeJS.ProcessEnv;
}

/** Download `file` of a repository into the first cache root (nothing is fetched when the snapshot
 *  already has it) and return its path in the snapshot. A failed request is an error naming the
 *  file's URL and the HTTP status. */
export async function hubDownload(repo: HubFiles, file: string): Promise<string> {
  const env = repo.env ?? process.env,
    hubUrl = hubEndpoint(env);
  const bar = new cliProgress.SingleBar(
    { format: `${repo.name} {file} [{bar}] {percentage}%`, stream: process.stderr },
    cliProgress.Presets.shades_classic,
  );
  // The body of the one request that carries the whole file moves the bar.
  const withProgress: typeof fetch = async (input, init) => {
    const res = await fetch(input, init);
    const range = new Headers(init?.headers).get("Range");
    const total = Number(res.headers.get("content-length") ?? 0);
    if (!res.ok || !res.body || range === "bytes=0-0" || (init?.method ?? "GET") !== "GET") return res;
    let got = 0;
    bar.start(total || 1, 0, { file });
    const counted = res.body.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, out) {
          got += chunk.length;
          bar.update(Math.min(got, total || 1));
          out.enqueue(chunk);
        },
        flush: () => bar.stop(),
      }),
    );
    return new Response(counted, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
  try {
    const repoType = repo.type;
    return await downloadFileToCacheDir({
      repo: { type: repoType, name: repo.name },
      path: file,
      revision: repo.revision,
      hubUrl,
      cacheDir: hubCacheDirs(env)[0],
      fetch: withProgress,
    });
  } catch (err) {
    const url = `${hubUrl}/${repo.type === "model" ? "" : `${repo.type}s/`}${repo.name}/resolve/${repo.revision}/${file}`;
    throw new Error(err instanceof HubApiError ? `GET ${url} -> HTTP ${err.statusCode}` : `GET ${url}: ${(err as Error).message}`);
  } finally {
    bar.stop();
  }
}

/** Point refs/main of a repository in the first cache root at `revision`. */
export async function setCachedMain(repo: HubFiles, revision: string): Promise<void> {
  await writeFileAtomic(path.join(repoCacheDir(hubCacheDirs(repo.env ?? process.env)[0], repo.type, repo.name), "refs", "main"), revision);
}
