/** The AutoRL-Bench grading API on node:http, both dialects over one Grader:
 *    early:   GET /scenarios, GET /scenarios/{id}, POST /evaluate {scenario_id, model_path}, POST /interact
 *    current: POST /submit {model_path, scenario_id?}, POST /set_baseline {score, scenario_id?},
 *             GET /health, GET /time, GET /history, GET /best
 *  Every answer is JSON; every error is `{"error": "..."}` with a 4xx/5xx status, and the server keeps
 *  serving. Bodies are capped (413 before a byte of an oversized body is read); wrong types and broken
 *  JSON are refused by name; unknown fields are logged and ignored, as AutoRL-Bench's server ignores
 *  them (LLM agents add some). A client that disconnects does not stop its evaluation (the result is
 *  cached for the retry). Where this server differs from AutoRL-Bench's, the README's table says why. */
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { z } from "zod";
import { HttpError } from "./errors.ts";
import { bestOf, Grader, type GraderOptions } from "./grader.ts";
import { describeProtocol, localModelDir, type Scenario } from "./scenarios.ts";

export const MAX_BODY_BYTES = 64 * 1024;
// After a 413 the rest of an oversized body is read and dropped for this long, so a client that sends
// its whole body before it reads (Python's requests, curl) gets the answer instead of a reset.
const DRAIN_MS = 10_000;

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

// The request bodies (zod). null counts as absent. What a field must be, for its error: a string
// unless listed.
const optional = <T extends z.ZodType>(t: T) => t.nullish().transform((v) => v ?? undefined);
const MUST: Record<string, string> = { gpu: "a string or an integer", score: "a number (or a numeric string)" };
const BODIES = {
  "/evaluate": z.object({ scenario_id: z.string(), model_path: z.string() }),
  "/interact": z.object({ scenario_id: optional(z.string()), session_id: optional(z.string()), action: optional(z.string()) }),
  // gpu: AutoRL-Bench's device choice ("0", "0,1" or 0), kept as its string (`str(gpu)`); accepted and
  // ignored (the backend is set at start).
  "/submit": z.object({
    model_path: z.string(),
    scenario_id: optional(z.string()),
    gpu: optional(z.union([z.string(), z.int()]).transform(String)),
  }),
  // score: a number or a numeric string, as AutoRL-Bench's `float(score)` reads it.
  "/set_baseline": z.object({
    score: z.union([z.number(), z.string().trim().min(1).pipe(z.coerce.number())]),
    scenario_id: optional(z.string()),
  }),
};

/** A route's body checked against its schema. Unknown fields are logged and dropped; the first wrong
 *  field is a 400 naming it, what it must be and what it got. */
function parseBody<R extends keyof typeof BODIES>(route: R, body: Body, log: (line: string) => void): z.output<(typeof BODIES)[R]> {
  const schema = BODIES[route];
  const unknown = Object.keys(body).filter((k) => !(k in schema.shape));
  if (unknown.length)
    log(`${route}: ignored unknown field${unknown.length > 1 ? "s" : ""} ${unknown.map((k) => JSON.stringify(k)).join(", ")}`);
  const r = schema.safeParse(body);
  if (r.success) return r.data as z.output<(typeof BODIES)[R]>;
  const key = String(r.error.issues[0].path[0]),
    v = body[key],
    must = MUST[key] ?? "a string";
  if (v === undefined || v === null) throw new HttpError(400, `missing field ${JSON.stringify(key)} (${must})`);
  const got = typeof v === "string" ? JSON.stringify(v.slice(0, 40)) : Array.isArray(v) ? "an array" : typeof v;
  throw new HttpError(400, `field ${JSON.stringify(key)} must be ${must}, got ${got}`);
}

const tooLarge = (size: number | string) => new HttpError(413, `request body is ${size} bytes; the limit is ${MAX_BODY_BYTES}`);

/** The JSON object a request carries. A declared length over the cap is refused before the body is
 *  read; a body without one is read up to the cap and no further. */
function readBody(req: http.IncomingMessage): Promise<Body> {
  const declared = Number(req.headers["content-length"] ?? NaN);
  if (declared > MAX_BODY_BYTES) return Promise.reject(tooLarge(declared));
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (c: Buffer) => {
      size += c.length;
      if (size <= MAX_BODY_BYTES) return void chunks.push(c);
      req.off("data", onData);
      reject(tooLarge(`more than ${MAX_BODY_BYTES}`));
    };
    req.on("data", onData);
    req.on("error", reject);
    req.on("end", () => {
      if (size > MAX_BODY_BYTES) return;
      const text = Buffer.concat(chunks).toString("utf8");
      if (text.trim() === "") return resolve({});
      let v: unknown;
      try {
        v = JSON.parse(text);
      } catch (err) {
        return reject(new HttpError(400, `request body is not valid JSON (${(err as Error).message})`));
      }
      if (v === null || typeof v !== "object" || Array.isArray(v))
        return reject(
          new HttpError(400, `request body must be a JSON object, got ${Array.isArray(v) ? "an array" : v === null ? "null" : typeof v}`),
        );
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
  const ignore = (route: string, unknown: string[]) => {
    if (unknown.length)
      o.log(`${route}: ignored unknown field${unknown.length > 1 ? "s" : ""} ${unknown.map((k) => JSON.stringify(k)).join(", ")}`);
  };
  // Both dialects' fields: the early server's get_info (name, base_model_path, train_data_path,
  // test_data_path, baseline_score, metric, data_format, reward) and this server's own.
  const describe = async (s: Scenario) => {
    const b = await grader.baselineInfo(s);
    const trainData = await s.trainData().then(
      (p) => ({ path: p }),
      (err: Error) => ({ path: null, error: err.message.split("\n")[0] }),
    );
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
      // The held-out questions are the server's: agents train on train_data and are scored on these.
      test_data_path: null,
      test_data:
        `held out by the server (${s.protocol.max_samples ?? "the whole"} ` +
        `${s.id === "tiny" ? "synthetic problems" : "test split"}); not given to agents`,
      data_format: {
        type: "jsonl",
        fields: { question: "problem text", answer: "worked solution with <<expr=result>> calculator annotations, ending in '#### N'" },
      },
      reward: {
        type: "binary",
        description:
          "1 when the final \\boxed{} answer equals the gold answer, else 0; the score is the percent of held-out questions answered so",
      },
      baseline_score: b.score,
      baseline: {
        status: b.status,
        score: b.score,
        source: b.record?.set ? "set" : "computed",
        computed: b.record?.computed ?? null,
        set: b.record?.set ?? null,
        ...(b.error ? { error: b.error } : {}),
      },
      metric: "accuracy",
      score_unit: "percent",
      evaluation: describeProtocol(s, s.protocol.max_samples ?? null),
      time: await grader.time(),
    };
  };

  const routes: Record<string, Partial<Record<string, Handler>>> = {
    "/": {
      GET: async () => ({
        name: "mini-agentic-rl grading server (AutoRL-Bench API)",
        version: "0.1.0",
        scenarios: grader.scenarios.map((s) => s.id),
        endpoints: [
          "GET /scenarios",
          "GET /scenarios/{id}",
          "POST /evaluate",
          "POST /interact",
          "POST /submit",
          "POST /set_baseline",
          "GET /health",
          "GET /time",
          "GET /history",
          "GET /best",
        ],
      }),
    },
    "/scenarios": {
      GET: async () => ({
        scenarios: await Promise.all(
          grader.scenarios.map(async (s) => {
            const b = await grader.baselineInfo(s);
            return {
              id: s.id,
              name: s.name,
              type: s.type,
              base_model: s.baseModel,
              baseline: b.score,
              baseline_score: b.score,
              baseline_status: b.status,
              ...(b.error ? { baseline_error: b.error } : {}),
              metric: "accuracy",
              score_unit: "percent",
            };
          }),
        ),
      }),
    },
    "/evaluate": {
      POST: async (raw) => {
        const body = parseBody("/evaluate", raw, o.log);
        return (await grader.grade(grader.scenario(body.scenario_id), body.model_path)).fields;
      },
    },
    "/interact": {
      POST: async (raw) => {
        const s = grader.scenario(parseBody("/interact", raw, o.log).scenario_id);
        throw new HttpError(
          400,
          `scenario ${s.id} is offline: /interact is not supported for offline scenarios; train on its ` +
            `train_data and POST /evaluate or /submit`,
        );
      },
    },
    "/submit": {
      POST: async (raw) => {
        const body = parseBody("/submit", raw, o.log);
        return grader.submit(grader.scenario(body.scenario_id), body.model_path);
      },
    },
    "/set_baseline": {
      POST: async (raw) => {
        const body = parseBody("/set_baseline", raw, o.log);
        const score = body.score; // percent, as the scores this server gives
        if (!(score >= 0 && score <= 100)) throw new HttpError(400, `field "score" must be a percent between 0 and 100, got ${score}`);
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
      GET: async () => grader.time(),
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
      if (err instanceof HttpError && err.status === 413) {
        // Answered before the body is read. The rest is read and dropped for up to DRAIN_MS, then the
        // connection is cut, whatever the body's size: a client that writes its whole body before it
        // reads (Python's requests) sees the 413, not a broken pipe.
        send(res, 413, { error: err.message }, err.headers);
        const cut = setTimeout(() => req.destroy(), DRAIN_MS);
        req.on("close", () => clearTimeout(cut));
        req.resume();
        return;
      }
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
    close: () =>
      (closed ??= (async () => {
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
