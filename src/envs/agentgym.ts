/** A client for AgentGym's HTTP environment servers, speaking each family's own request shapes
 *  (families.ts): POST /create → an instance (`{id}` or a bare integer), POST /reset with the family's
 *  fields → the first observation (from the reply or GET /observation), POST /step {key, action} →
 *  {observation | state, reward, done, …}, POST /close {key}. The model's turn goes in whole; the
 *  family's parser takes the action out, as AgentGym's client does, and its rule scores the episode.
 *  Every request has a time limit and every reply is checked: an HTTP error, a time-out, a reply that
 *  is not the JSON the family promises, an `{"error": …}` reply (AgentGym's servers answer failures
 *  with HTTP 200 and an error field) or a reply past the size cap is an EnvError for that rollout,
 *  never a hang. A 422 names the fields FastAPI missed. Observations longer than maxChars are cut
 *  with a marker. Leaves out: the servers' extra endpoints (available actions, detail views). */
import * as http from "node:http";
import * as https from "node:https";
import { capText } from "../agents/toolset.ts";
import { type Family, type Reply } from "./families.ts";
import { EnvError, type Environment, type EnvironmentFactory, type StepResult } from "./types.ts";

export interface AgentGymOptions {
  family: Family;
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
  const fam = o.family;
  const key = fam.key;

  const request = async (method: "GET" | "POST", route: string, body?: unknown): Promise<unknown> => {
    const where = `environment ${base}${route.split("?")[0]}`;
    let reply: { status: number; text: string };
    try {
      reply = await httpRequest(new URL(base + route), method, body === undefined ? undefined : JSON.stringify(body), timeoutMs);
    } catch (err) {
      throw new EnvError(`${where}: ${(err as Error).message}`);
    }
    if (reply.status === 422)
      throw new EnvError(`${where}: HTTP 422, ${missingFields(reply.text)}; sent ${JSON.stringify(body).slice(0, 120)}`);
    if (reply.status < 200 || reply.status >= 300) throw new EnvError(`${where}: HTTP ${reply.status} ${reply.text.slice(0, 200)}`);
    let parsed: unknown;
    try {
      parsed = JSON.parse(reply.text);
    } catch {
      throw new EnvError(`${where}: reply is not JSON: ${JSON.stringify(reply.text.slice(0, 80))}`);
    }
    const error = (parsed as Reply | null)?.error;
    if (error !== undefined && error !== null)
      throw new EnvError(`${where}: the server answered error ${JSON.stringify(error).slice(0, 300)}`);
    return parsed;
  };

  const observationOf = (reply: unknown, route: string, field: string): string => {
    const value = typeof reply === "string" ? reply : (reply as Reply | null)?.[field];
    if (typeof value !== "string")
      throw new EnvError(`environment ${base}${route}: reply has no "${field}" text: ${JSON.stringify(reply).slice(0, 120)}`);
    return capText(value, maxChars);
  };

  return {
    label: base,
    family: fam,
    async create(): Promise<Environment> {
      const created = await request("POST", "/create", {});
      const id = typeof created === "number" ? created : (created as Reply | null)?.[key];
      if (typeof id !== "number" && typeof id !== "string")
        throw new EnvError(`environment ${base}/create: reply has no ${key}: ${JSON.stringify(created).slice(0, 120)}`);
      let closed = false;
      let summed = 0;
      let last = { score: 0, success: false };
      return {
        async reset(dataIdx) {
          summed = 0;
          last = { score: 0, success: false };
          const reply = await request("POST", "/reset", { [key]: id, ...fam.resetBody(dataIdx) });
          const first = fam.firstObservation(reply);
          if (first !== null) return capText(first, maxChars);
          return observationOf(
            await request("GET", `/observation?${key}=${encodeURIComponent(String(id))}`),
            "/observation",
            "observation",
          );
        },
        async step(turn): Promise<StepResult> {
          const parsed = fam.action(turn);
          // AgentGym's client answers a turn it cannot read itself, without stepping the server.
          if ("invalid" in parsed) return { action: "", observation: parsed.invalid, reward: 0, done: false, ...last };
          const reply = await request("POST", "/step", { [key]: id, action: parsed.action });
          if (reply === null || typeof reply !== "object" || Array.isArray(reply))
            throw new EnvError(`environment ${base}/step: reply is ${JSON.stringify(reply).slice(0, 80)}, expected an object`);
          const r = reply as Reply;
          const observation = observationOf(r, "/step", fam.stepField);
          const reward = Number(r.reward ?? 0);
          if (!Number.isFinite(reward)) throw new EnvError(`environment ${base}/step: reward ${JSON.stringify(r.reward)} is not a number`);
          if (typeof r.done !== "boolean")
            throw new EnvError(`environment ${base}/step: "done" is ${JSON.stringify(r.done)}, expected true or false`);
          summed += reward;
          last = fam.score(r, summed, r.done);
          return { action: parsed.action, observation, reward, done: r.done, ...last };
        },
        async close() {
          if (closed) return;
          closed = true;
          await request("POST", "/close", { [key]: id }).catch(() => {}); // ALFWorld, WebShop, SQLGym have no /close
        },
      };
    },
  };
}

/** FastAPI's 422 body → which fields it wanted: `{"detail": [{"loc": ["body", "item_id"], "msg":
 *  "field required"}]}` (pydantic 1 and 2 alike) → `the server requires "item_id" (field required)`. */
export function missingFields(body: string): string {
  try {
    const detail = (JSON.parse(body) as { detail?: { loc?: unknown[]; msg?: string }[] }).detail;
    if (Array.isArray(detail) && detail.length > 0)
      return detail
        .map(
          (d) =>
            `the server requires ${JSON.stringify(String((d.loc ?? []).filter((x) => x !== "body").join(".")))} (${d.msg ?? "invalid"})`,
        )
        .join("; ");
  } catch {
    // not FastAPI's shape: quote it
  }
  return `the server refused the request: ${body.slice(0, 200)}`;
}

/** GET / as text (AgentGym's servers answer their name: "This is environment TextCraft."). */
export async function serverBanner(url: string, timeoutMs: number): Promise<string> {
  const reply = await httpRequest(new URL(url.replace(/\/+$/, "") + "/"), "GET", undefined, timeoutMs);
  return reply.text.slice(0, 200);
}

/** One request on its own connection (no keep-alive: a server closing an idle pooled socket, as
 *  uvicorn does after 5 s, would otherwise race with the next step), the whole exchange within
 *  timeoutMs, the body at most MAX_REPLY_BYTES. */
function httpRequest(url: URL, method: string, body: string | undefined, timeoutMs: number): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const lib = url.protocol === "https:" ? https : http;
    const req = lib.request(
      url,
      {
        method,
        agent: false,
        headers: body === undefined ? {} : { "content-type": "application/json", "content-length": Buffer.byteLength(body) },
      },
      (res) => {
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
      },
    );
    const timer = setTimeout(() => req.destroy(new Error(`no reply within ${timeoutMs / 1000} s`)), timeoutMs);
    req.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    req.end(body);
  });
}
