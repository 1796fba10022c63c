/** The AutoRL-Bench grading API on node:http, both dialects over one Grader:
 *    early:   GET /scenarios, GET /scenarios/{id}, POST /evaluate {scenario_id, model_path}, POST /interact
 *    current: POST /submit {model_path, scenario_id?}, POST /set_baseline {score, scenario_id?},
 *             GET /health, GET /time, GET /history, GET /best
 *  Every answer is JSON; every error is `{"error": "..."}` with a 4xx/5xx status, and the server keeps
 *  serving. Bodies are capped; unknown fields, wrong types and broken JSON are refused by name. A
 *  client that disconnects does not stop its evaluation (the result is cached for the retry). */
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { HttpError } from "./errors.ts";
import { bestOf, Grader, type GraderOptions } from "./grader.ts";
import { describeProtocol, localModelDir, type Scenario } from "./scenarios.ts";

export const MAX_BODY_BYTES = 64 * 1024;
const DRAIN_LIMIT = 64 * 1024 * 1024; // past this an oversized body is cut off instead of read to its end

export interface ServeOptions extends GraderOptions {
  host: string;
  port: number;
}

export interface RunningServer {
  url: string;
  grader: Grader;
  /** Stop accepting, abandon the running evaluation at its next batch, answer what waits with 503. */
  close(): Promise<void>;
}

type Body = Record<string, unknown>;
type Handler = (body: Body, req: http.IncomingMessage) => Promise<unknown>;

/** Field checks: name → expected type; unknown names are refused. */
function checkFields(body: Body, spec: Record<string, { type: "string" | "number"; required?: boolean }>): void {
  for (const k of Object.keys(body)) {
    if (!(k in spec)) throw new HttpError(400, `unknown field ${JSON.stringify(k)}; accepted: ${Object.keys(spec).join(", ")}`);
  }
  for (const [k, s] of Object.entries(spec)) {
    const v = body[k];
    if (v === undefined || v === null) {
      if (s.required) throw new HttpError(400, `missing field ${JSON.stringify(k)} (${s.type})`);
      delete body[k];
      continue;
    }
    if (typeof v !== s.type || (s.type === "number" && !Number.isFinite(v)))
      throw new HttpError(400, `field ${JSON.stringify(k)} must be a ${s.type}, got ${Array.isArray(v) ? "an array" : typeof v}`);
  }
}

function readBody(req: http.IncomingMessage): Promise<Body> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on("data", (c: Buffer) => {
      size += c.length;
      if (size <= MAX_BODY_BYTES) chunks.push(c);
      else if (size > DRAIN_LIMIT) req.destroy();
    });
    req.on("error", reject);
    req.on("end", () => {
      if (size > MAX_BODY_BYTES) return reject(new HttpError(413, `request body is ${size} bytes; the limit is ${MAX_BODY_BYTES}`));
      const text = Buffer.concat(chunks).toString("utf8");
      if (text.trim() === "") return resolve({});
      let v: unknown;
      try {
        v = JSON.parse(text);
      } catch (err) {
        return reject(new HttpError(400, `request body is not valid JSON (${(err as Error).message})`));
      }
      if (v === null || typeof v !== "object" || Array.isArray(v)) return reject(new HttpError(400, `request body must be a JSON object, got ${Array.isArray(v) ? "an array" : v === null ? "null" : typeof v}`));
      resolve(v as Body);
    });
  });
}

function send(res: http.ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  if (res.headersSent || res.destroyed) return;
  const text = JSON.stringify(body, null, 2) + "\n";
  res.writeHead(status, { "Content-Type": "application/json; charset=utf-8", "Content-Length": Buffer.byteLength(text), ...headers });
  res.end(text);
}

export async function startServer(o: ServeOptions): Promise<RunningServer> {
  const grader = await Grader.open(o);
  const describe = async (s: Scenario) => {
    const b = await grader.baselineInfo(s);
    const trainData = await s.trainData().then((p) => ({ path: p }), (err: Error) => ({ path: null, error: err.message.split("\n")[0] }));
    return {
      id: s.id,
      name: s.name,
      description: s.description,
      type: s.type,
      base_model: s.baseModel,
      base_model_path: await localModelDir(s.baseModel),
      train_data: trainData.path,
      train_data_path: trainData.path,
      ...(trainData.path === null ? { train_data_error: trainData.error } : {}),
      data_format: { type: "jsonl", fields: { question: "problem text", answer: "worked solution with <<expr=result>> calculator annotations, ending in '#### N'" } },
      baseline_score: b.score,
      baseline: { status: b.status, score: b.score, source: b.record?.set ? "set" : "computed", computed: b.record?.computed ?? null, set: b.record?.set ?? null, ...(b.error ? { error: b.error } : {}) },
      metric: "strict_accuracy",
      evaluation: describeProtocol(s, s.protocol.max_samples ?? null),
      time: { timeout_s: grader.runMeta.timeout_s, remaining: grader.remaining() },
    };
  };

  const routes: Record<string, Partial<Record<string, Handler>>> = {
    "/": {
      GET: async () => ({
        name: "mini-agentic-rl grading server (AutoRL-Bench API)",
        scenarios: grader.scenarios.map((s) => s.id),
        endpoints: ["GET /scenarios", "GET /scenarios/{id}", "POST /evaluate", "POST /interact", "POST /submit", "POST /set_baseline", "GET /health", "GET /time", "GET /history", "GET /best"],
      }),
    },
    "/scenarios": {
      GET: async () => ({
        scenarios: await Promise.all(grader.scenarios.map(async (s) => {
          const b = await grader.baselineInfo(s);
          return { id: s.id, name: s.name, type: s.type, base_model: s.baseModel, baseline_score: b.score, baseline_status: b.status, metric: "strict_accuracy" };
        })),
      }),
    },
    "/evaluate": {
      POST: async (body) => {
        checkFields(body, { scenario_id: { type: "string", required: true }, model_path: { type: "string", required: true } });
        const s = grader.scenario(body.scenario_id);
        return (await grader.grade(s, body.model_path as string)).fields;
      },
    },
    "/interact": {
      POST: async (body) => {
        checkFields(body, { scenario_id: { type: "string" }, session_id: { type: "string" }, action: { type: "string" } });
        const s = grader.scenario(body.scenario_id);
        throw new HttpError(400, `scenario ${s.id} is offline: /interact is not supported for offline scenarios; train on its train_data and POST /evaluate or /submit`);
      },
    },
    "/submit": {
      POST: async (body) => {
        // gpu: AutoRL-Bench's device choice; accepted for compatibility and ignored (the backend is set at start).
        checkFields(body, { model_path: { type: "string", required: true }, scenario_id: { type: "string" }, gpu: { type: "string" } });
        return grader.submit(grader.scenario(body.scenario_id), body.model_path as string);
      },
    },
    "/set_baseline": {
      POST: async (body) => {
        checkFields(body, { score: { type: "number", required: true }, scenario_id: { type: "string" } });
        const score = body.score as number;
        if (score < 0 || score > 1) throw new HttpError(400, `score ${score}: expected strict accuracy in [0, 1] (this server does not use percent)`);
        const s = grader.scenario(body.scenario_id);
        await grader.setBaseline(s, score);
        return { baseline_score: score, status: "set", scenario_id: s.id };
      },
    },
    "/health": {
      GET: async () => ({
        status: "ok",
        task: grader.scenarios[0].id,
        scenarios: grader.scenarios.map((s) => s.id),
        workspace: o.workspace,
        available_gpus: [],
        queue: grader.queueState(),
        ...grader.counters,
      }),
    },
    "/time": {
      GET: async () => ({ ...grader.runMeta, now: Math.floor(Date.now() / 1000), remaining: grader.remaining() }),
    },
    "/history": {
      GET: async (_b, req) => grader.store.readHistory(grader.scenario(scenarioParam(req)).id),
    },
    "/best": {
      GET: async (_b, req) => {
        const h = await grader.store.readHistory(grader.scenario(scenarioParam(req)).id);
        if (h.length === 0) throw new HttpError(404, "no submissions yet");
        return { best: bestOf(h), total_submissions: h.length };
      },
    },
  };

  const handle = async (req: http.IncomingMessage, res: http.ServerResponse): Promise<void> => {
    let url: URL;
    try {
      url = new URL(req.url ?? "/", "http://localhost");
    } catch {
      throw new HttpError(400, `cannot parse the request target ${JSON.stringify(req.url)}`);
    }
    const p = url.pathname.length > 1 ? url.pathname.replace(/\/+$/, "") : url.pathname;
    const method = req.method ?? "GET";
    let handler: Handler | undefined;
    let allowed: string[];
    const m = /^\/scenarios\/([^/]+)$/.exec(p);
    if (m) {
      allowed = ["GET"];
      let id: string;
      try {
        id = decodeURIComponent(m[1]);
      } catch {
        throw new HttpError(400, `bad scenario id in ${p}`);
      }
      if (method === "GET") handler = async () => describe(grader.scenario(id));
    } else {
      const r = routes[p];
      if (!r) {
        req.resume();
        throw new HttpError(404, `no such endpoint: ${method} ${p}`, { endpoints: Object.keys(routes).concat("/scenarios/{id}") });
      }
      allowed = Object.keys(r);
      handler = r[method];
    }
    if (!handler) {
      req.resume();
      throw new HttpError(405, `${method} ${p} is not supported; use ${allowed.join(" or ")}`, {}, { Allow: allowed.join(", ") });
    }
    const body = method === "POST" ? await readBody(req) : (req.resume(), {});
    send(res, 200, await handler(body, req));
  };

  let active = 0;
  let whenIdle: Array<() => void> = [];
  const server = http.createServer((req, res) => {
    active++;
    res.on("close", () => {
      if (--active === 0) for (const f of whenIdle.splice(0)) f();
    });
    res.on("error", () => undefined); // a client gone mid-answer is not the server's problem
    handle(req, res).catch((err: unknown) => {
      if (err instanceof HttpError) return send(res, err.status, { error: err.message, ...err.extra }, err.headers);
      o.log(`error: ${req.method} ${req.url}: ${(err as Error)?.stack ?? String(err)}`);
      send(res, 500, { error: `internal error: ${(err as Error)?.message ?? String(err)}` });
    });
  });
  server.requestTimeout = 60_000; // receiving a request; answers may take as long as an evaluation
  // Longer than clients keep idle connections (undici 4 s, browsers 60 s), so a client never reuses a
  // socket the server is closing at that moment (ECONNRESET), even when evaluation slows the loop.
  server.keepAliveTimeout = 75_000;
  server.headersTimeout = 30_000;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(o.port, o.host, () => resolve());
  });
  const addr = server.address() as AddressInfo;
  const host = addr.family === "IPv6" ? `[${addr.address}]` : addr.address;
  let closed: Promise<void> | undefined;
  return {
    url: `http://${host}:${addr.port}`,
    grader,
    close: () => (closed ??= (async () => {
      grader.close();
      const stopped = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeIdleConnections();
      // Requests waiting on evaluations are answered (503 once abandoned) before the sockets go.
      if (active > 0) await new Promise<void>((resolve) => whenIdle.push(resolve));
      server.closeAllConnections();
      await stopped;
    })()),
  };
}

function scenarioParam(req: http.IncomingMessage): string | undefined {
  return new URL(req.url ?? "/", "http://localhost").searchParams.get("scenario_id") ?? undefined;
}
