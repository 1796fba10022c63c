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
import * as http from "node:http";
import * as https from "node:https";
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
    let reply: { status: number; text: string };
    try {
      reply = await httpRequest(new URL(base + route), method, body === undefined ? undefined : JSON.stringify(body), timeoutMs);
    } catch (err) {
      throw new EnvError(`environment ${base}${route}: ${(err as Error).message}`);
    }
    if (reply.status < 200 || reply.status >= 300) throw new EnvError(`environment ${base}${route}: HTTP ${reply.status} ${reply.text.slice(0, 200)}`);
    try {
      return JSON.parse(reply.text);
    } catch {
      throw new EnvError(`environment ${base}${route}: reply is not JSON: ${JSON.stringify(reply.text.slice(0, 80))}`);
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

/** One request on its own connection (no keep-alive: a server closing an idle pooled socket, as
 *  uvicorn does after 5 s, would otherwise race with the next step), the whole exchange within
 *  timeoutMs, the body at most MAX_REPLY_BYTES. */
function httpRequest(url: URL, method: string, body: string | undefined, timeoutMs: number): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const lib = url.protocol === "https:" ? https : http;
    const req = lib.request(url, {
      method, agent: false,
      headers: body === undefined ? {} : { "content-type": "application/json", "content-length": Buffer.byteLength(body) },
    }, (res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on("data", (c: Buffer) => {
        size += c.length;
        if (size > MAX_REPLY_BYTES) req.destroy(new Error(`reply larger than ${MAX_REPLY_BYTES} bytes`));
        else chunks.push(c);
      });
      res.on("end", () => {
        clearTimeout(timer);
        resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString("utf8") });
      });
      res.on("error", (e) => reject(e));
    });
    const timer = setTimeout(() => req.destroy(new Error(`no reply within ${timeoutMs / 1000} s`)), timeoutMs);
    req.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    req.end(body);
  });
}
