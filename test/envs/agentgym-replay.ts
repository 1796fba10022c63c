/** Serves exchanges recorded from a real AgentGym server (test/fixtures/agentgym/*.json, made by
 *  scripts/lib/record-agentgym.ts) back over real HTTP on 127.0.0.1, so the client meets the real
 *  server's replies without Python. Loading walks the recording with each instance's state (its
 *  task and the actions so far), so a reply is found by what it depends on, not by instance id:
 *  /reset by data_idx, /step by (data_idx, actions so far), a refused request by its exact body.
 *  Anything not recorded is an HTTP 500 saying so (a test that strays fails loudly). It counts the
 *  instances created and closed, and can hold /step replies until `barrier` steps wait at once. */
import { promises as fs } from "node:fs";
import * as http from "node:http";
import type { AddressInfo } from "node:net";

interface Exchange { method: string; path: string; body?: Record<string, unknown>; status: number; reply: unknown }

export interface ReplayServer {
  url: string;
  /** Instances created and not closed. */
  open: Set<number>;
  created: number;
  /** The most /step requests that were waiting at one time. */
  maxConcurrentSteps: number;
  close(): Promise<void>;
}

export async function replayAgentGym(fixture: string, o: { barrier?: number; barrierTimeoutMs?: number; onStep?: (waiting: number) => void } = {}): Promise<ReplayServer> {
  const { exchanges } = JSON.parse(await fs.readFile(fixture, "utf8")) as { exchanges: Exchange[] };
  const exact = new Map<string, Exchange>(); // refusals, by method, path and body
  const resets = new Map<number, Exchange>(); // by data_idx
  const steps = new Map<string, Exchange>(); // by JSON [data_idx, ...actions]
  const recordedState = new Map<number, { task: number; actions: string[] }>();
  let banner: Exchange | undefined, create: Exchange | undefined, badId: Exchange | undefined;
  for (const e of exchanges) {
    const id = e.body?.id as number | undefined;
    if (e.path === "/") banner = e;
    else if (e.path === "/create") create ??= e;
    else if (e.status !== 200) exact.set(`${e.method} ${e.path} ${JSON.stringify(e.body)}`, e);
    else if (e.path === "/reset") {
      resets.set(e.body!.data_idx as number, e);
      recordedState.set(id!, { task: e.body!.data_idx as number, actions: [] });
    } else if (e.path === "/step") {
      const s = recordedState.get(id!);
      if (!s) badId = e; // a step on an id the server never made
      else {
        s.actions.push(e.body!.action as string);
        steps.set(JSON.stringify([s.task, ...s.actions]), e);
      }
    }
  }
  if (!banner || !create || !badId) throw new Error(`${fixture}: the recording needs the banner, a /create and a step on an unknown id`);

  const state = new Map<number, { task: number; actions: string[]; observation: string } | null>(); // null: created, not reset
  let waiting: (() => void)[] = [];
  const server: ReplayServer & { srv?: http.Server } = { url: "", open: new Set(), created: 0, maxConcurrentSteps: 0, close: async () => {} };
  const missing = (what: string): [number, unknown] => [500, { detail: `not recorded: ${what}` }];

  const handle = async (method: string, url: URL, body: Record<string, unknown>): Promise<[number, unknown]> => {
    const refused = exact.get(`${method} ${url.pathname} ${JSON.stringify(body)}`);
    if (refused) return [refused.status, refused.reply];
    const id = Number(body.id ?? url.searchParams.get("id"));
    const s = state.get(id);
    switch (`${method} ${url.pathname}`) {
      case "GET /": return [200, banner!.reply];
      case "POST /create": {
        const n = server.created++;
        state.set(n, null);
        server.open.add(n);
        return [200, { ...(create!.reply as object), id: n }];
      }
      case "POST /reset": {
        const r = resets.get(Number(body.data_idx ?? 0));
        if (!r) return missing(`reset to data_idx ${JSON.stringify(body.data_idx)}`);
        if (s === undefined) return [200, { error: `The id ${id} is not valid.` }];
        state.set(id, { task: r.body!.data_idx as number, actions: [], observation: (r.reply as { observation: string }).observation });
        return [200, { ...(r.reply as object), id }];
      }
      case "POST /step": {
        if (!s) return [200, badId!.reply];
        const key = JSON.stringify([s.task, ...s.actions, body.action]);
        const r = steps.get(key);
        if (!r) return missing(`step ${key}`);
        if (o.barrier) await barrier(o.barrier, o.barrierTimeoutMs ?? 10_000);
        s.actions.push(body.action as string);
        s.observation = (r.reply as { observation: string }).observation;
        return [200, r.reply];
      }
      case "GET /observation": return s ? [200, s.observation] : [200, { error: `The id ${id} is not valid.` }];
      case "POST /close": {
        const known = state.delete(id);
        server.open.delete(id);
        return [200, known];
      }
    }
    return [404, { detail: "Not Found" }];
  };
  // Replies wait until `n` steps wait together (or the time-out): the steps of one turn either overlap
  // or they do not.
  const barrier = (n: number, timeoutMs: number) => new Promise<void>((resolve) => {
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
      res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(out));
    });
  });
  await new Promise<void>((resolve) => srv.listen(0, "127.0.0.1", () => resolve()));
  server.url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
  server.close = () => new Promise<void>((resolve) => {
    srv.closeAllConnections();
    srv.close(() => resolve());
  });
  return server;
}
