/** Serves exchanges recorded from a real AgentGym server (test/fixtures/agentgym/*.json, made by
 *  scripts/lib/record-agentgym.ts) back over real HTTP on 127.0.0.1, so the client meets the real
 *  server's replies without Python. Loading walks the recording with each instance's state (its
 *  task and the actions so far), so a reply is found by what it depends on, not by instance id:
 *  /reset by its task field (data_idx, item_id), /step by (task, actions so far), a refused request
 *  (any status but 200) by its body with the instance id left out. Instance ids are the replay's own
 *  (0, 1, …), in the shape the server's /create answered (`{id}` or a bare integer). Anything not
 *  recorded is an HTTP 500 saying so (a test that strays fails loudly). It counts the instances
 *  created and closed, and can hold /step replies until `barrier` steps wait at once. */
import { promises as fs } from "node:fs";
import * as http from "node:http";
import type { AddressInfo } from "node:net";

type Body = Record<string, unknown>;
interface Exchange {
  method: string;
  path: string;
  body?: Body;
  status: number;
  reply: unknown;
}

export interface ReplayServer {
  url: string;
  /** Instances created and not closed. */
  open: Set<number>;
  created: number;
  /** The most /step requests that were waiting at one time. */
  maxConcurrentSteps: number;
  close(): Promise<void>;
}

const KEYS = ["id", "env_idx"];
/** A request as a refusal is looked up: the instance id (whatever it was) left out. */
const refusalKey = (method: string, path: string, body: Body | undefined) =>
  `${method} ${path} ${JSON.stringify(body && Object.fromEntries(Object.entries(body).map(([k, v]) => [k, KEYS.includes(k) ? "*" : v])))}`;
/** The observation text in a reset or step reply (TextCraft's object, SQLGym's [text, null]). */
const observationIn = (reply: unknown): string => {
  if (Array.isArray(reply)) return String(reply[0]);
  if (typeof reply === "string") return reply;
  const r = reply as Body;
  return String(r.observation ?? r.state);
};

export async function replayAgentGym(
  fixture: string,
  o: { barrier?: number; barrierTimeoutMs?: number; onStep?: (waiting: number) => void } = {},
): Promise<ReplayServer> {
  const { exchanges } = JSON.parse(await fs.readFile(fixture, "utf8")) as { exchanges: Exchange[] };
  const firstReset = exchanges.find((e) => e.path === "/reset" && e.status === 200)!;
  const key = KEYS.find((k) => k in firstReset.body!)!; // the instance field
  const taskField = Object.keys(firstReset.body!).find((k) => k !== key)!; // data_idx, item_id, …
  const refused = new Map<string, Exchange>();
  const resets = new Map<number, Exchange>(); // by task
  const steps = new Map<string, Exchange>(); // by JSON [task, ...actions]
  const recorded = new Map<unknown, { task: number; actions: string[] }>();
  let banner: Exchange | undefined,
    create: Exchange | undefined,
    badId: Exchange | undefined,
    closes = false;
  for (const e of exchanges) {
    const id = e.body?.[key];
    if (e.path === "/") banner = e;
    else if (e.path === "/create") create ??= e;
    else if (e.status !== 200) refused.set(refusalKey(e.method, e.path, e.body), e);
    else if (e.path === "/reset") {
      resets.set(e.body![taskField] as number, e);
      recorded.set(id, { task: e.body![taskField] as number, actions: [] });
    } else if (e.path === "/step") {
      const s = recorded.get(id);
      if (!s)
        badId = e; // a step on an id the server never made, answered with HTTP 200
      else {
        s.actions.push(e.body!.action as string);
        steps.set(JSON.stringify([s.task, ...s.actions]), e);
      }
    } else if (e.path === "/close") closes = true;
  }
  if (!banner || !create) throw new Error(`${fixture}: the recording needs the banner and a /create`);

  const state = new Map<number, { task: number; actions: string[]; observation: string } | null>(); // null: created, not reset
  let waiting: (() => void)[] = [];
  const server: ReplayServer = { url: "", open: new Set(), created: 0, maxConcurrentSteps: 0, close: async () => {} };
  const missing = (what: string): [number, unknown] => [500, { detail: `not recorded: ${what}` }];
  const notValid = (id: number): [number, unknown] => (badId ? [200, { error: `The id ${id} is not valid.` }] : missing(`instance ${id}`));

  const handle = async (method: string, url: URL, body: Body): Promise<[number, unknown]> => {
    const r = refused.get(refusalKey(method, url.pathname, method === "GET" ? undefined : body));
    if (r) return [r.status, r.reply];
    const id = Number(body[key] ?? url.searchParams.get(key));
    const s = state.get(id);
    switch (`${method} ${url.pathname}`) {
      case "GET /":
        return [200, banner!.reply];
      case "POST /create": {
        const n = server.created++;
        state.set(n, null);
        server.open.add(n);
        return [200, typeof create!.reply === "number" ? n : { ...(create!.reply as Body), [key]: n }];
      }
      case "POST /reset": {
        const e = resets.get(Number(body[taskField]));
        if (!e) return missing(`reset ${JSON.stringify(body)}`);
        if (s === undefined) return notValid(id);
        state.set(id, { task: e.body![taskField] as number, actions: [], observation: observationIn(e.reply) });
        return [200, Array.isArray(e.reply) ? e.reply : { ...(e.reply as Body), [key]: id }];
      }
      case "POST /step": {
        if (!s) return badId ? [200, badId.reply] : missing(`step on instance ${id}`);
        const stepKey = JSON.stringify([s.task, ...s.actions, body.action]);
        const e = steps.get(stepKey);
        if (!e) return missing(`step ${stepKey}`);
        if (o.barrier) await barrier(o.barrier, o.barrierTimeoutMs ?? 10_000);
        s.actions.push(body.action as string);
        s.observation = observationIn(e.reply);
        return [200, e.reply];
      }
      case "GET /observation":
        return s ? [200, s.observation] : notValid(id);
      case "POST /close": {
        if (!closes) break;
        const known = state.delete(id);
        server.open.delete(id);
        return [200, known];
      }
    }
    return [404, { detail: "Not Found" }];
  };
  // Replies wait until `n` steps wait together (or their time-out): the steps of one turn either
  // overlap or they do not.
  const barrier = (n: number, timeoutMs: number) =>
    new Promise<void>((resolve) => {
      waiting.push(resolve);
      server.maxConcurrentSteps = Math.max(server.maxConcurrentSteps, waiting.length);
      o.onStep?.(waiting.length);
      if (waiting.length >= n) {
        for (const w of waiting) w();
        waiting = [];
      } else
        setTimeout(() => {
          waiting = waiting.filter((w) => w !== resolve); // no longer waiting
          resolve();
        }, timeoutMs);
    });

  const srv = http.createServer((req, res) => {
    let raw = "";
    req.setEncoding("utf8");
    req.on("data", (d: string) => (raw += d));
    req.on("end", async () => {
      let status: number, out: unknown;
      try {
        [status, out] = await handle(req.method ?? "GET", new URL(req.url ?? "/", "http://x"), raw.trim() ? JSON.parse(raw) : {});
      } catch (err) {
        [status, out] = [400, { detail: `bad request: ${(err as Error).message}` }];
      }
      // A reply recorded as plain text (FastAPI's "Internal Server Error") goes back as text.
      const text =
        out !== null && typeof out === "object" && Object.keys(out).length === 1 && "text" in out ? String((out as Body).text) : null;
      res.writeHead(status, { "content-type": text === null ? "application/json" : "text/plain" }).end(text ?? JSON.stringify(out));
    });
  });
  await new Promise<void>((resolve) => srv.listen(0, "127.0.0.1", () => resolve()));
  server.url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
  server.close = () =>
    new Promise<void>((resolve) => {
      srv.closeAllConnections();
      srv.close(() => resolve());
    });
  return server;
}
