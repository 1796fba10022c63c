/** Records exchanges with AgentGym's own TextCraft server into test/fixtures/agentgym/textcraft.json,
 *  which test/envs/agentgym-replay.ts serves back in the tests (the project never runs Python).
 *  Dev-only. The server is agentenv-textcraft at commit 3ef9235, unchanged, on Debian's
 *  python3-fastapi/python3-uvicorn/python3-numpy, with `gymnasium` stubbed as a bare base class
 *  (TextCraftEnv only subclasses gym.Env and calls its reset and close):
 *    PYTHONPATH=STUB:agentenv-textcraft python3 -m uvicorn agentenv_textcraft:app --port 36101
 *    npx tsx scripts/lib/record-agentgym.ts http://127.0.0.1:36101
 *  The session: the banner, instances created, requests in other families' shapes (FastAPI's 422s),
 *  a won episode (task 0), the trailing-period action TextCraft does not find, a lost one
 *  (task 3), task 547 (= 3: tasks wrap modulo 544), a step on an unknown id, and every close. */
import { promises as fs } from "node:fs";

const base = (process.argv[2] ?? "http://127.0.0.1:36101").replace(/\/+$/, "");
const out = process.argv[3] ?? "test/fixtures/agentgym/textcraft.json";

interface Exchange { method: string; path: string; body?: unknown; status: number; reply: unknown }
const log: Exchange[] = [];

async function call(method: "GET" | "POST", path: string, body?: unknown): Promise<unknown> {
  const res = await fetch(base + path, { method, ...(body === undefined ? {} : { body: JSON.stringify(body), headers: { "content-type": "application/json" } }) });
  const text = await res.text();
  const reply = JSON.parse(text);
  log.push({ method, path, ...(body === undefined ? {} : { body }), status: res.status, reply });
  return reply;
}

await call("GET", "/");
const ids: number[] = [];
for (let i = 0; i < 4; i++) ids.push((await call("POST", "/create", {}) as { id: number }).id);
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
for (const action of ["inventory", "get 8 glass", "craft 8 green stained glass using 8 glass, 1 green dye"]) await call("POST", "/step", { id: b, action });
await call("POST", "/reset", { id: c, data_idx: 547 });
await call("GET", `/observation?id=${c}`);
await call("POST", "/step", { id: 99, action: "inventory" });
for (const id of ids) await call("POST", "/close", { id });
await call("POST", "/close", { id: a }); // twice: the server answers false

await fs.writeFile(out, JSON.stringify({ server: "agentenv-textcraft (WooooDyy/AgentGym 3ef9235)", recorded: new Date().toISOString().slice(0, 10), exchanges: log }, null, 1) + "\n");
process.stdout.write(`${log.length} exchanges with ${base} → ${out}\n`);
