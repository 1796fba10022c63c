/** SQLGym's HTTP layer (agentenv-sqlgym at commit 3ef9235: its server, request models and environment
 *  server unchanged, the `sqlgym` package stubbed by two made-up questions), as recorded in
 *  test/fixtures/agentgym/sqlgym.json and replayed over real HTTP: the generic env_idx dialect's
 *  reset refused with the field named, the sqlgym family's item_id reset and GET /observation, the
 *  ```sql action, no /close, BIRD's dev items as the held-out default. */
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { checkTaskRange, defaultTaskRanges, environmentTasks, openEnvironmentServer } from "../../src/envs/episodes.ts";
import { FAMILIES } from "../../src/envs/families.ts";
import type { Tokenizer } from "../../src/model/types.ts";
import { evaluate } from "../../src/run/evaluate.ts";
import { qwenTokenizer } from "../rollout/helpers/qwen-tokenizer.ts";
import { ScriptedModel } from "../rollout/helpers/scripted-model.ts";
import { replayAgentGym, type ReplayServer } from "./helpers/agentgym-replay.ts";

const FIXTURE = "test/fixtures/agentgym/sqlgym.json";
const open = { timeoutMs: 30_000, maxChars: 4_000 };
const servers: ReplayServer[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
});
async function replay() {
  const s = await replayAgentGym(FIXTURE);
  servers.push(s);
  return s;
}
let tok: Tokenizer;
beforeAll(async () => {
  tok = await qwenTokenizer();
});

describe("SQLGym", () => {
  it("the generic env_idx dialect fails at the probe, naming item_id (FastAPI's 422); auto does not guess it", async () => {
    const s = await replay();
    await expect(openEnvironmentServer(s.url, { dialect: "env_idx", ...open })).rejects.toThrow(
      /^--env http:\/\/127\.0\.0\.1:\d+: environment .*\/reset: HTTP 422, the server requires "item_id" \(field required\); sent \{"env_idx":0,"data_idx":0\} \(is the server running, and is --env_dialect env_idx its family\?\)$/,
    );
    // Its banner is "ok": auto falls back to the generic id dialect, refused just as clearly.
    await expect(openEnvironmentServer(s.url, { dialect: "auto", ...open })).rejects.toThrow(
      /\/reset: HTTP 422, the server requires "env_idx" \(field required\); the server requires "item_id" \(field required\); .*--env_dialect id, picked from its banner,/,
    );
  });

  it("episodes: item_id reset, the observation from GET /observation, the ```sql action, AgentGym's prompt; no /close is no error", async () => {
    const s = await replay();
    const factory = await openEnvironmentServer(s.url, { dialect: "sqlgym", ...open });
    const say = (sql: string) => `Thought: count them.\n\nAction: \`\`\`sql\n${sql}\n\`\`\``;
    // The prompt holds AgentGym's acknowledgement turn: the stand-in's scripts start after it.
    const model = new ScriptedModel({
      vocabSize: tok.vocabSize,
      eosTokenId: tok.eosTokenId,
      header: tok.encode("<|im_start|>assistant\n"),
      scripts: [
        ["", say("SELECT COUNT(*) FROM singer")],
        ["", say("SELECT MIN(age) FROM singer")],
      ].map((turns) => turns.map((t) => tok.encode(t))),
    });
    const r = await evaluate(model, tok, environmentTasks([0, 9429]), {
      samplesPerPrompt: 1,
      temperature: 0,
      batchSize: 2,
      maxNewTokens: 200,
      maxTurns: 2,
      toolsInPrompt: false,
      seed: 0,
      tools: [],
      envs: factory,
    });
    expect(r.questions.map((q) => q.question)).toEqual([
      "(train) The database has table singer(id, name, age). Question: how many singers are there?",
      "(dev) The database has table singer(id, name, age). Question: what is the age of the oldest singer?",
    ]);
    expect(r.questions.map((q) => q.samples[0]).map((x) => [x.strict, x.envReward, x.turns[0].action, x.turns[0].observation])).toEqual([
      [true, 1, "SELECT COUNT(*) FROM singer", "[(6,)]"],
      [false, 0, "SELECT MIN(age) FROM singer", "[]"],
    ]);
    expect(r.envErrorRate).toBe(0);
    expect(s.created).toBe(3); // the probe's and two rows'; SQLGym has no /close (404, ignored)
  });

  it("an item past BIRD's range: the server's 500 fails the probe; ranges past 10,961 are refused before", async () => {
    const s = await replay();
    await expect(openEnvironmentServer(s.url, { dialect: "sqlgym", ...open, probeIdx: 20000 })).rejects.toThrow(
      /\/reset: HTTP 500 Internal Server Error/,
    );
    expect(defaultTaskRanges(FAMILIES.sqlgym, 100)).toEqual({ train: "0-99", heldOut: "9428-10427", evaluate: "9428-9527" });
    expect(() => checkTaskRange(FAMILIES.sqlgym, "--env_tasks", "0-99,20000")).toThrow(
      "--env_tasks 0-99,20000: the sqlgym server has 10962 tasks (data_idx 0-10961); data_idx 20000 are past its last",
    );
  });
});
