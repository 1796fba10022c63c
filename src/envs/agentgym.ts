/** A client for AgentGym's HTTP environment servers, in the two dialects they speak:
 *  - `id` (TextCraft, BabyAI, ALFWorld, SciWorld): POST /create → {id} (or a bare id),
 *    POST /reset {id, data_idx} → the observation (text or {observation}), POST /step {id, action} →
 *    {observation, reward, done}, GET /observation?id= → text, POST /close {id}.
 *  - `env_idx` (WebShop, SQLGym): POST /create → an integer, POST /reset {env_idx, data_idx},
 *    POST /step {env_idx, action} → {state, reward, done, info}, GET /observation?env_idx=.
 *  Every request has a time limit and every reply is checked; an HTTP error, a time-out, a reply that
 *  is not the JSON the dialect promises, or an observation past the size cap is an EnvError for that
 *  rollout, never a hang. Observations longer than maxChars are cut with a marker.
 *  Leaves out: the servers' extra endpoints (available actions, detail views). */
import { capText } from "../agents/toolset.ts";
import { EnvError, type Environment, type EnvironmentFactory, type StepResult } from "./types.ts";

export type Dialect = "id" | "env_idx";
export const DIALECTS: readonly Dialect[] = ["id", "env_idx"];

export interface AgentGymOptions {
  dialect: Dialect;
  /** Per request, ms (default 30 s). */
  timeoutMs?: number;
  /** Longest observation the model reads (default 4,000 characters). */
  maxChars?: number;
}

const MAX_REPLY_BYTES = 4 * 1024 * 1024; // a reply larger than this is a broken server, not an observation

export function agentGymEnvironments(url: string, o: AgentGymOptions): EnvironmentFactory {
  const base = url.replace(/\/+$/, "");
  const timeoutMs = o.timeoutMs ?? 30_000;
  const maxChars = o.maxChars ?? 4_000;
  const key = o.dialect === "id" ? "id" : "env_idx";

  const request = async (method: "GET" | "POST", route: string, body?: unknown): Promise<unknown> => {
    let res: Response;
    try {
      res = await fetch(base + route, {
        method,
        headers: body === undefined ? undefined : { "content-type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
      });
    } catch (err) {
      const e = err as Error;
      const why = e.name === "TimeoutError" ? `no reply within ${timeoutMs / 1000} s` : String((e.cause as Error)?.message ?? e.message);
      throw new EnvError(`environment ${base}${route}: ${why}`);
    }
    let text: string;
    try {
      text = await readCapped(res, timeoutMs);
    } catch (err) {
      throw new EnvError(`environment ${base}${route}: ${(err as Error).message}`);
    }
    if (!res.ok) throw new EnvError(`environment ${base}${route}: HTTP ${res.status} ${text.slice(0, 200)}`);
    try {
      return JSON.parse(text);
    } catch {
      throw new EnvError(`environment ${base}${route}: reply is not JSON: ${JSON.stringify(text.slice(0, 80))}`);
    }
  };

  const observationOf = (reply: unknown, route: string, field: string): string => {
    const value = typeof reply === "string" ? reply : (reply as Record<string, unknown> | null)?.[field];
    if (typeof value !== "string") throw new EnvError(`environment ${base}${route}: reply has no "${field}" text: ${JSON.stringify(reply).slice(0, 120)}`);
    return capText(value, maxChars);
  };

  return {
    label: base,
    async create(): Promise<Environment> {
      const created = await request("POST", "/create", {});
      const id = typeof created === "number" ? created : (created as Record<string, unknown> | null)?.[key];
      if (typeof id !== "number" && typeof id !== "string") throw new EnvError(`environment ${base}/create: reply has no ${key}: ${JSON.stringify(created).slice(0, 120)}`);
      let closed = false;
      return {
        async reset(dataIdx) {
          const reply = await request("POST", "/reset", { [key]: id, data_idx: dataIdx });
          const obs = typeof reply === "string" ? reply : (reply as Record<string, unknown> | null)?.observation ?? (reply as Record<string, unknown> | null)?.state;
          if (typeof obs === "string") return capText(obs, maxChars);
          return observationOf(await request("GET", `/observation?${key}=${encodeURIComponent(String(id))}`), "/observation", "observation");
        },
        async step(action): Promise<StepResult> {
          const reply = await request("POST", "/step", { [key]: id, action });
          if (reply === null || typeof reply !== "object") throw new EnvError(`environment ${base}/step: reply is ${JSON.stringify(reply).slice(0, 80)}, expected an object`);
          const r = reply as Record<string, unknown>;
          const observation = observationOf(r, "/step", o.dialect === "id" ? "observation" : "state");
          const reward = Number(r.reward ?? 0);
          if (!Number.isFinite(reward)) throw new EnvError(`environment ${base}/step: reward ${JSON.stringify(r.reward)} is not a number`);
          if (typeof r.done !== "boolean") throw new EnvError(`environment ${base}/step: "done" is ${JSON.stringify(r.done)}, expected true or false`);
          return { observation, reward, done: r.done };
        },
        async close() {
          if (closed) return;
          closed = true;
          await request("POST", "/close", { [key]: id }).catch(() => {}); // not every server has /close
        },
      };
    },
  };
}

/** The body as text, at most MAX_REPLY_BYTES, within the time limit. */
async function readCapped(res: Response, timeoutMs: number): Promise<string> {
  const reader = res.body?.getReader();
  if (!reader) return "";
  const chunks: Uint8Array[] = [];
  let size = 0;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const left = deadline - Date.now();
    let timer: NodeJS.Timeout | undefined;
    const next = await Promise.race([
      reader.read(),
      new Promise<null>((resolve) => (timer = setTimeout(() => resolve(null), Math.max(0, left)))),
    ]);
    clearTimeout(timer);
    if (next === null) {
      void reader.cancel().catch(() => {});
      throw new Error(`reply not finished within ${timeoutMs / 1000} s`);
    }
    if (next.done) break;
    size += next.value.byteLength;
    if (size > MAX_REPLY_BYTES) {
      void reader.cancel().catch(() => {});
      throw new Error(`reply larger than ${MAX_REPLY_BYTES} bytes`);
    }
    chunks.push(next.value);
  }
  return Buffer.concat(chunks).toString("utf8");
}
