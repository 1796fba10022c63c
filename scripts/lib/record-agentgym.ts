/** Records exchanges with AgentGym's own servers into test/fixtures/agentgym/<family>.json, which
 *  test/envs/helpers/agentgym-replay.ts serves back in the tests (the project never runs Python). Dev-only.
 *  The servers are AgentGym's at commit 3ef9235 on Debian's python3-fastapi/python3-uvicorn/
 *  python3-numpy:
 *  - textcraft: agentenv-textcraft unchanged, `gymnasium` stubbed as a bare base class (TextCraftEnv
 *    only subclasses gym.Env and calls its reset and close):
 *      PYTHONPATH=STUB:agentenv-textcraft python3 -m uvicorn agentenv_textcraft:app --port 36101
 *      npx tsx scripts/lib/record-agentgym.ts textcraft http://127.0.0.1:36101
 *    The session: the banner, instances created, requests in other families' shapes (FastAPI's
 *    422s), a won episode (task 0), the trailing-period action TextCraft does not find, a lost one
 *    (task 3), task 547 (= 3: tasks wrap modulo 544), a step on an unknown id, and every close.
 *  - sqlgym: its HTTP layer (server.py, model.py, environment.py unchanged), the `sqlgym` package
 *    stubbed by a two-question SqlGymEnv instead of BIRD's databases (so the questions and results
 *    are made up; the request and reply shapes, the 422s, 404s and 500s are the server's):
 *      AGENTENV_SQLGYM_BIRD_PATH=x PYTHONPATH=STUB:agentenv-sqlgym python3 -m uvicorn agentenv_sqlgym:app --port 36102
 *      npx tsx scripts/lib/record-agentgym.ts sqlgym http://127.0.0.1:36102
 *    The session: the generic dialects' resets (422s), a won and a lost episode (a
 *    train and a dev item), an item past BIRD's range, /close (SQLGym has none), an unknown env_idx. */
import { promises as fs } from "node:fs";

const family = process.argv[2] ?? "textcraft";
const base = (process.argv[3] ?? "http://127.0.0.1:36101").replace(/\/+$/, "");
const out = `test/fixtures/agentgym/${family}.json`;

interface Exchange {
  method: string;
  path: string;
  body?: unknown;
  status: number;
  reply: unknown;
}
const log: Exchange[] = [];

async function call(method: "GET" | "POST", path: string, body?: unknown): Promise<unknown> {
  const res = await fetch(base + path, {
    method,
    ...(body === undefined ? {} : { body: JSON.stringify(body), headers: { "content-type": "application/json" } }),
  });
  const text = await res.text();
  let reply: unknown;
  try {
    reply = JSON.parse(text);
  } catch {
    reply = { text }; // FastAPI's plain "Internal Server Error"
  }
  log.push({ method, path, ...(body === undefined ? {} : { body }), status: res.status, reply });
  return reply;
}

async function textcraft() {
  await call("GET", "/");
  const ids: number[] = [];
  for (let i = 0; i < 4; i++) ids.push(((await call("POST", "/create", {})) as { id: number }).id);
  const [a, b, c, d] = ids;
  // Other families' request shapes: FastAPI refuses them with 422 naming the missing field.
  await call("POST", "/reset", { env_idx: a, data_idx: 0 });
  await call("POST", "/reset", { env_idx: a, item_id: 0 });
  await call("POST", "/step", { env_idx: a, action: "inventory" });
  // Task 0: light blue dye from a blue orchid; and "get 1 blue orchid." (with the period): not found.
  await call("POST", "/reset", { id: a, data_idx: 0 });
  for (const action of ["get 1 blue orchid", "craft 1 light blue dye using 1 blue orchid"]) await call("POST", "/step", { id: a, action });
  await call("POST", "/reset", { id: d, data_idx: 0 });
  await call("POST", "/step", { id: d, action: "get 1 blue orchid." });
  // Task 3 (green stained glass) played badly; task 547 is task 3 again.
  await call("POST", "/reset", { id: b, data_idx: 3 });
  for (const action of ["inventory", "get 8 glass", "craft 8 green stained glass using 8 glass, 1 green dye"])
    await call("POST", "/step", { id: b, action });
  await call("POST", "/reset", { id: c, data_idx: 547 });
  await call("GET", `/observation?id=${c}`);
  await call("POST", "/step", { id: 99, action: "inventory" });
  for (const id of ids) await call("POST", "/close", { id });
  await call("POST", "/close", { id: a }); // twice: the server answers false
}

async function sqlgym() {
  await call("GET", "/");
  const a = (await call("POST", "/create")) as number;
  const b = (await call("POST", "/create")) as number;
  await call("POST", "/reset", { env_idx: a, data_idx: 0 }); // the generic env_idx dialect: 422, item_id
  await call("POST", "/reset", { id: a, data_idx: 0 }); // the generic id dialect: 422, env_idx and item_id
  await call("POST", "/reset", { env_idx: a, item_id: 0 });
  await call("GET", `/observation?env_idx=${a}`);
  await call("POST", "/step", { env_idx: a, action: "SELECT COUNT(*) FROM singer" });
  await call("POST", "/reset", { env_idx: b, item_id: 9429 }); // a BIRD dev item
  await call("GET", `/observation?env_idx=${b}`);
  await call("POST", "/step", { env_idx: b, action: "SELECT MIN(age) FROM singer" });
  await call("POST", "/reset", { env_idx: b, item_id: 20000 }); // past BIRD's items: 500
  await call("POST", "/close", { env_idx: a }); // SQLGym has no /close: 404
  await call("POST", "/step", { env_idx: 99, action: "SELECT 'unknown env_idx'" }); // 500
}

if (family === "textcraft") await textcraft();
else if (family === "sqlgym") await sqlgym();
else throw new Error(`no recording session for ${family}; expected textcraft or sqlgym`);

await fs.writeFile(
  out,
  JSON.stringify(
    {
      server: `agentenv-${family} (WooooDyy/AgentGym 3ef9235)${family === "sqlgym" ? ", sqlgym stubbed" : ""}`,
      recorded: new Date().toISOString().slice(0, 10),
      exchanges: log,
    },
    null,
    1,
  ) + "\n",
);
process.stdout.write(`${log.length} exchanges with ${base} → ${out}\n`);
