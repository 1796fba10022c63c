/** A small AgentGym-style environment server: guess the secret number. Task `data_idx` seeds a secret
 *  in 1..100; each action is "guess N"; the observation says "higher", "lower" or "correct"; reward 1
 *  when found within 10 guesses, else 0. The optimal policy is binary search (at most 7 guesses).
 *  Speaks the `id` dialect (TextCraft's routes) or, with dialect "env_idx", WebShop's. Bad requests get
 *  a JSON 4xx and the server keeps serving. Served on a loopback address by scripts/guess-env-server.ts
 *  and by the tests. Leaves out: persistence, several secrets per episode. */
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { Rng } from "../../src/util/rng.ts";

export const GUESS_MAX = 100;
export const GUESS_TURNS = 10;

interface Episode {
  secret: number;
  guesses: number;
  done: boolean;
  observation: string;
}

export function secretFor(dataIdx: number): number {
  return 1 + Math.floor(new Rng(dataIdx * 7919 + 17).next() * GUESS_MAX);
}

const intro = `Guess the secret whole number between 1 and ${GUESS_MAX}. After each guess you are told whether the secret is higher or lower. Reply with one line "Action: guess N".`;

/** One guess → the next state. Pure, so the tests can drive it directly. */
export function guess(ep: Episode, action: string): { observation: string; reward: number; done: boolean } {
  if (ep.done) return { observation: "The episode is over.", reward: 0, done: true };
  const m = /^guess\s+(-?\d+)\s*\.?$/i.exec(action.trim());
  ep.guesses++;
  let observation: string,
    reward = 0;
  if (!m) observation = `Invalid action ${JSON.stringify(action.slice(0, 40))}; reply "Action: guess N".`;
  else {
    const n = Number(m[1]);
    if (n === ep.secret) {
      observation = `Correct, the secret is ${n}.`;
      reward = 1;
      ep.done = true;
    } else observation = `The secret is ${n < ep.secret ? "higher" : "lower"} than ${n}.`;
  }
  if (!ep.done && ep.guesses >= GUESS_TURNS) {
    ep.done = true;
    observation += ` No guesses left; the secret was ${ep.secret}.`;
  }
  ep.observation = observation;
  return { observation, reward, done: ep.done };
}

export interface GuessServer {
  url: string;
  close(): Promise<void>;
}

/** Serve on host:port (0: any free port). */
export async function serveGuessNumber(port: number, dialect: "id" | "env_idx" = "id", host = "127.0.0.1"): Promise<GuessServer> {
  const episodes = new Map<number, Episode>();
  let nextId = 0;
  const key = dialect === "id" ? "id" : "env_idx";

  const handle = (method: string, url: URL, body: Record<string, unknown>): [number, unknown] => {
    const episodeOf = (raw: unknown): Episode | string => {
      const id = Number(raw);
      const ep = Number.isInteger(id) ? episodes.get(id) : undefined;
      return ep ?? `unknown ${key} ${JSON.stringify(raw)}; create one with POST /create`;
    };
    const route = `${method} ${url.pathname}`;
    if (route === "GET /") return [200, "This is environment GuessNumber."];
    if (route === "POST /create") {
      const id = nextId++;
      episodes.set(id, { secret: secretFor(0), guesses: 0, done: false, observation: intro });
      return [200, dialect === "id" ? { id } : id];
    }
    if (route === "POST /reset") {
      const ep = episodeOf(body[key]);
      if (typeof ep === "string") return [404, { error: ep }];
      const idx = Number(body.data_idx ?? 0);
      if (!Number.isInteger(idx) || idx < 0)
        return [400, { error: `data_idx ${JSON.stringify(body.data_idx)} must be a whole number >= 0` }];
      Object.assign(ep, { secret: secretFor(idx), guesses: 0, done: false, observation: intro });
      return [200, dialect === "id" ? { id: body[key], observation: intro } : { state: intro }];
    }
    if (route === "POST /step") {
      const ep = episodeOf(body[key]);
      if (typeof ep === "string") return [404, { error: ep }];
      if (typeof body.action !== "string") return [400, { error: `"action" must be text` }];
      const r = guess(ep, body.action);
      return [200, dialect === "id" ? r : { state: r.observation, reward: r.reward, done: r.done, info: { guesses: ep.guesses } }];
    }
    if (route === "GET /observation") {
      const ep = episodeOf(url.searchParams.get(key));
      return typeof ep === "string" ? [404, { error: ep }] : [200, ep.observation];
    }
    if (route === "POST /close") {
      episodes.delete(Number(body[key]));
      return [200, { closed: true }];
    }
    return [404, { error: `no route ${route}; routes: POST /create, /reset, /step, /close, GET /observation` }];
  };

  const server = http.createServer((req, res) => {
    let raw = "";
    req.setEncoding("utf8");
    req.on("data", (d: string) => {
      raw += d;
      if (raw.length > 64 * 1024) req.destroy(); // no episode needs more
    });
    req.on("end", () => {
      let status: number, out: unknown;
      try {
        const body = raw.trim() ? JSON.parse(raw) : {};
        if (body === null || typeof body !== "object" || Array.isArray(body)) throw new Error("body must be a JSON object");
        [status, out] = handle(req.method ?? "GET", new URL(req.url ?? "/", "http://x"), body as Record<string, unknown>);
      } catch (err) {
        [status, out] = [400, { error: `bad request: ${(err as Error).message}` }];
      }
      res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(out));
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve());
  });
  return {
    url: `http://${host}:${(server.address() as AddressInfo).port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
