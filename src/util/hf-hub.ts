/** Where the Hugging Face hub and its local cache are, read from the environment the way
 *  huggingface_hub reads it, so models and datasets resolve alike: the cache roots (HF_HUB_CACHE, else
 *  HF_HOME/hub, else $XDG_CACHE_HOME or ~/.cache + huggingface/hub), the endpoint (HF_ENDPOINT) and
 *  offline mode (HF_HUB_OFFLINE, or HF_DATASETS_OFFLINE for datasets). */
import * as os from "node:os";
import * as path from "node:path";

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
