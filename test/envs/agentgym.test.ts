/** The AgentGym client against the shipped guess-the-number server over real HTTP on a loopback port,
 *  in both dialects; broken servers; rollouts, one GRPO step and evaluations against the environment.
 *  Over 400 lines: every case shares one started server and one tiny model, which a split would start twice. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs";
import { agentGymEnvironments } from "../../src/envs/agentgym.ts";
import { FAMILIES, genericAction } from "../../src/envs/families.ts";
import { openEnvironmentServer, openEpisodes, ENV_SYSTEM_PROMPT } from "../../src/envs/episodes.ts";
import { GUESS_MAX, secretFor, serveGuessNumber, type GuessServer } from "../../scripts/lib/guess-number.ts";
import { EnvError, type Environment } from "../../src/envs/types.ts";
import type { Tokenizer } from "../../src/model/types.ts";
import { rolloutGroups } from "../../src/rollout/rollout.ts";
import { scoreRollout } from "../../src/rollout/rewards.ts";
import { toPrompt } from "../../src/agents/prompts.ts";
import { Rng } from "../../src/util/rng.ts";
import { qwenTokenizer } from "../rollout/helpers/qwen-tokenizer.ts";
import { ScriptedModel } from "../rollout/helpers/scripted-model.ts";
import { guessEpisodes, tinyEnvRunConfig } from "./helpers/tiny-env-run.ts";

/** The optimal policy: binary search; the guesses it makes for a secret. */
function binarySearch(secret: number): number[] {
  const out: number[] = [];
  let lo = 1,
    hi = GUESS_MAX;
  for (;;) {
    const mid = Math.floor((lo + hi) / 2);
    out.push(mid);
    if (mid === secret) return out;
    if (mid < secret) lo = mid + 1;
    else hi = mid - 1;
  }
}

const servers: GuessServer[] = [];
const raw: http.Server[] = [];
afterAll(async () => {
  await Promise.all(servers.map((s) => s.close()));
  for (const s of raw) {
    s.closeAllConnections();
    s.close();
  }
});

describe.each(["id", "env_idx"] as const)("the shipped server, %s dialect", (dialect) => {
  let url: string;
  beforeAll(async () => {
    const s = await serveGuessNumber(0, dialect);
    servers.push(s);
    url = s.url;
  });

  it("a policy that reads the observations reaches the optimal reward in at most 7 steps", async () => {
    const factory = agentGymEnvironments(url, { family: FAMILIES[dialect], timeoutMs: 5_000 });
    for (const idx of [0, 1, 2, 3, 4]) {
      const env = await factory.create();
      expect(await env.reset(idx)).toMatch(/^Guess the secret whole number between 1 and 100/);
      let lo = 1,
        hi = GUESS_MAX,
        steps = 0,
        total = 0,
        done = false;
      while (!done) {
        const mid = Math.floor((lo + hi) / 2);
        const r = await env.step(`Thought: halve the range.\nAction: guess ${mid}`);
        steps++;
        total += r.reward;
        done = r.done;
        if (/higher/.test(r.observation)) lo = mid + 1;
        else if (/lower/.test(r.observation)) hi = mid - 1;
        else expect(r.observation).toBe(`Correct, the secret is ${mid}.`);
      }
      expect(total).toBe(1);
      expect(steps).toBeLessThanOrEqual(7);
      expect(steps).toBe(binarySearch(secretFor(idx)).length);
      await env.close();
    }
  });
  it("invalid actions and running out of guesses: no reward, the episode ends", async () => {
    const env = await agentGymEnvironments(url, { family: FAMILIES[dialect] }).create();
    await env.reset(9);
    expect((await env.step("look around")).observation).toMatch(/^Invalid action "look around"/);
    let last = { observation: "", reward: 0, done: false };
    for (let i = 0; i < 9 && !last.done; i++) last = await env.step(`guess ${secretFor(9) === 1 ? 2 : 1}`);
    expect(last).toMatchObject({ reward: 0, done: true });
    expect(last.observation).toMatch(/No guesses left; the secret was \d+\./);
  });
  it("bad requests get a JSON 4xx and the server keeps serving", async () => {
    const key = dialect === "id" ? "id" : "env_idx";
    const post = (route: string, body: string) =>
      fetch(url + route, { method: "POST", body, headers: { "content-type": "application/json" } });
    let r = await post("/step", "{not json");
    expect(r.status).toBe(400);
    expect(await r.json()).toMatchObject({ error: expect.stringMatching(/bad request/) });
    r = await post("/step", JSON.stringify({ [key]: 999, action: "guess 1" }));
    expect(r.status).toBe(404);
    expect((await fetch(url + "/")).status).toBe(200);
  });
});

/** A server that answers every request with `reply` (or never, when reply is null). */
async function brokenServer(reply: ((route: string) => [number, string]) | null): Promise<string> {
  const s = http.createServer((req, res) => {
    if (reply === null) return; // hangs
    req.resume();
    req.on("end", () => {
      const [status, body] = reply(req.url ?? "/");
      res.writeHead(status, { "content-type": "application/json" }).end(body);
    });
  });
  raw.push(s);
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", () => r()));
  return `http://127.0.0.1:${(s.address() as AddressInfo).port}`;
}

describe("broken servers give an EnvError, never a hang", () => {
  it("a hung server: a time-out", async () => {
    const url = await brokenServer(null);
    const t0 = Date.now();
    await expect(agentGymEnvironments(url, { family: FAMILIES.id, timeoutMs: 300 }).create()).rejects.toThrow(
      /\/create: no reply within 0\.3 s/,
    );
    expect(Date.now() - t0).toBeLessThan(5_000);
  });
  it("malformed replies: not JSON, missing fields, HTTP errors", async () => {
    const notJson = await brokenServer(() => [200, "<html>"]);
    await expect(agentGymEnvironments(notJson, { family: FAMILIES.id }).create()).rejects.toThrow(/\/create: reply is not JSON: "<html>"/);
    const noDone = await brokenServer((route) => [200, route === "/create" ? '{"id": 1}' : '{"observation": "x", "reward": 1}']);
    const env = await agentGymEnvironments(noDone, { family: FAMILIES.id }).create();
    await expect(env.step("guess 1")).rejects.toThrow(EnvError);
    await expect(env.step("guess 1")).rejects.toThrow(/\/step: "done" is undefined, expected true or false/);
    const fails = await brokenServer(() => [500, '{"detail": "boom"}']);
    await expect(agentGymEnvironments(fails, { family: FAMILIES.env_idx }).create()).rejects.toThrow(/\/create: HTTP 500/);
    await expect(openEnvironmentServer(fails, { dialect: "id", timeoutMs: 1000, maxChars: 100 })).rejects.toThrow(
      /--env http.*HTTP 500.*is --env_dialect id its family/,
    );
  });
});

describe("rollouts against the environment", () => {
  let tok: Tokenizer;
  let url: string;
  beforeAll(async () => {
    tok = await qwenTokenizer();
    const s = await serveGuessNumber(0, "id");
    servers.push(s);
    url = s.url;
  });

  it("turns are actions, observations come back with mask 0, the env reward is the component env", async () => {
    const factory = agentGymEnvironments(url, { family: FAMILIES.id });
    const tasks = [3, 5];
    const episodes = await openEpisodes(factory, tasks, 2);
    // Row 0 of each task plays binary search (scripted from the known secret); row 1 guesses 1 forever.
    const say = (n: number) => `Thought: halve it.\nAction: guess ${n}`;
    const scripts = tasks.flatMap((idx) => [
      binarySearch(secretFor(idx)).map(say),
      Array.from({ length: 3 }, () => say(secretFor(idx) === 1 ? 2 : 1)),
    ]);
    const model = new ScriptedModel({
      vocabSize: tok.vocabSize,
      eosTokenId: tok.eosTokenId,
      header: tok.encode("<|im_start|>assistant\n"),
      scripts: scripts.map((turns) => turns.map((t) => tok.encode(t))),
    });
    const before = tf.memory().numTensors;
    const out = await rolloutGroups(
      model,
      tok,
      episodes.observations.map((o) => toPrompt(o, ENV_SYSTEM_PROMPT)),
      {
        samplesPerPrompt: 2,
        maxNewTokens: 400,
        maxTurns: 3 + 7,
        temperature: 1,
        topP: 1,
        topK: 0,
        rng: new Rng(0),
        tools: [],
        envs: episodes.envs,
      },
    );
    await episodes.close();
    expect(tf.memory().numTensors).toBe(before);
    expect(out[0].envReward).toBe(1);
    expect(out[0].finishReason).toBe("stop");
    expect(out[0].turns.map((t) => t.action)).toEqual(binarySearch(secretFor(3)).map((n) => `guess ${n}`));
    expect(out[0].turns.at(-1)!.observation).toBe(`Correct, the secret is ${secretFor(3)}.`);
    expect(out[2].envReward).toBe(1);
    expect(out[1].envReward).toBe(0); // its script ends after 3 turns: it stops answering, the episode is not done
    // The observation is forced as a user message: mask 0 on exactly its tokens and the next header.
    const t = out[0];
    const firstObs = `\n<|im_start|>user\n${t.turns[0].observation}<|im_end|>\n<|im_start|>assistant\n`;
    const firstTurn = [...tok.encode(say(binarySearch(secretFor(3))[0])), tok.eosTokenId];
    expect(t.completionIds.slice(0, firstTurn.length + tok.encode(firstObs).length)).toEqual([...firstTurn, ...tok.encode(firstObs)]);
    expect(t.lossMask.slice(firstTurn.length, firstTurn.length + tok.encode(firstObs).length).every((m) => m === 0)).toBe(true);
    const s = scoreRollout(t, "", { correctness: 0, format: 0, tool_use: 0, env: 1 });
    expect(s).toMatchObject({ reward: 1, components: { env: 1 } });
    expect(scoreRollout({ ...t, envReward: undefined }, "").components).not.toHaveProperty("env");
  });

  it("an environment that fails mid-episode ends that rollout with env_error, the others go on", async () => {
    const ok = (await openEpisodes(agentGymEnvironments(url, { family: FAMILIES.id }), [3], 1)).envs[0];
    const failing: Environment = {
      reset: async () => "",
      step: async () => {
        throw new EnvError("environment x/step: no reply within 1 s");
      },
      close: async () => {},
    };
    const say = tok.encode("Action: guess 50");
    const model = new ScriptedModel({
      vocabSize: tok.vocabSize,
      eosTokenId: tok.eosTokenId,
      header: tok.encode("<|im_start|>assistant\n"),
      scripts: [
        [say, say],
        [say, say],
      ],
    });
    const out = await rolloutGroups(model, tok, [toPrompt("Guess.", ENV_SYSTEM_PROMPT)], {
      samplesPerPrompt: 2,
      maxNewTokens: 200,
      maxTurns: 2,
      temperature: 1,
      topP: 1,
      topK: 0,
      rng: new Rng(0),
      tools: [],
      envs: [ok, failing],
    });
    expect(out[1]).toMatchObject({ finishReason: "env_error", envError: "environment x/step: no reply within 1 s", envReward: 0 });
    expect(out[0].finishReason).not.toBe("env_error");
    expect(out[0].turns).toHaveLength(2);
    await ok.close();
  });
});

describe("rows on their own random streams", () => {
  it("an environment row's tokens do not depend on when the other rows' steps come back", async () => {
    const tok = await qwenTokenizer();
    // Every step the same distribution over a few tokens and the stop token; each row's environment
    // takes 0 or 40 ms per step, in the opposite order in the second run.
    const fixed = new Map([
      [tok.encode("a")[0], 0.3],
      [tok.encode("b")[0], 0.3],
      [tok.encode(" c")[0], 0.2],
      [tok.eosTokenId, 0.2],
    ]);
    const env = (ms: number): Environment => ({
      reset: async () => "",
      close: async () => {},
      step: async () => (
        await new Promise((r) => setTimeout(r, ms)),
        { action: "", observation: "ok", reward: 0, done: false, score: 0, success: false }
      ),
    });
    const run = async (delays: number[]) => {
      const model = new ScriptedModel({
        vocabSize: tok.vocabSize,
        eosTokenId: tok.eosTokenId,
        header: tok.encode("<|im_start|>assistant\n"),
        fixed,
      });
      const out = await rolloutGroups(model, tok, [toPrompt("Go.", ENV_SYSTEM_PROMPT)], {
        samplesPerPrompt: 4,
        maxNewTokens: 60,
        maxTurns: 3,
        temperature: 1,
        topP: 1,
        topK: 0,
        rng: new Rng(7),
        tools: [],
        envs: delays.map(env),
      });
      return out.map((t) => t.completionIds);
    };
    const first = await run([0, 40, 0, 40]);
    expect(await run([40, 0, 40, 0])).toEqual(first);
    expect(new Set(first.map((ids) => ids.join())).size).toBeGreaterThan(1); // the rows did draw differently
  });
});

describe("GRPO against the environment", () => {
  it("one step: prompts are first observations, turns are actions, reward_env is logged; held-out tasks are evaluated", async () => {
    const { runGrpo } = await import("../../src/run/grpo-run.ts");
    const { readMetrics } = await import("../../src/trainer/metrics.ts");
    const s = await serveGuessNumber(0, "env_idx");
    servers.push(s);
    // Training and held-out ranges that share a data_idx: a usage error before the run folder exists.
    const clash = await tinyEnvRunConfig(s.url, "env_idx", { env_tasks: "0-3", env_eval_tasks: "2-5", eval_samples: 1 });
    await expect(runGrpo(clash)).rejects.toThrow(
      /^--env_tasks 0-3 and --env_eval_tasks 2-5 share data_idx 2-3; held-out tasks must not be trained on$/,
    );
    expect(
      await fs.stat(clash.output_dir).then(
        () => true,
        () => false,
      ),
    ).toBe(false);
    const cfg = await tinyEnvRunConfig(s.url, "env_idx", {
      reward_weights: "correctness=0,format=0,tool_use=0,env=1",
      env_tasks: "5,7",
      eval_samples: 2,
      max_new_tokens: 48,
    });
    const out = cfg.output_dir;
    await runGrpo(cfg);
    const lines = await guessEpisodes(out, expect);
    for (const t of lines) {
      expect(t.rewardComponents).toHaveProperty("env");
      if (t.turns.some((x: { observation?: string }) => x.observation !== undefined)) expect(t.envSuccess).toBe(t.envReward >= 1); // generic rule
    }
    const [m] = await readMetrics(path.join(out, "metrics.jsonl"));
    expect(m).toHaveProperty("reward_env");
    // Trained on data_idx 5 and 7 (run.json); the held-out evaluation ran the first two of the default range.
    const runJson = JSON.parse(await fs.readFile(path.join(out, "run.json"), "utf8"));
    expect(JSON.stringify(runJson)).toContain('"env_tasks":"5,7"');
    expect(JSON.stringify(runJson)).toContain('"env_eval_tasks":"1000-1999"');
    const evalJson = JSON.parse(await fs.readFile(path.join(out, "eval.json"), "utf8"));
    expect(evalJson.samples.map((q: { id: string }) => q.id)).toEqual(["1000", "1001"]);
    await fs.rm(path.dirname(out), { recursive: true, force: true });
  });
});

describe("evaluation against the environment", () => {
  it("success is an episode reward of 1; a scripted binary search succeeds, a policy stuck on one guess does not", async () => {
    const { evaluate } = await import("../../src/run/evaluate.ts");
    const { environmentTasks } = await import("../../src/envs/episodes.ts");
    const tok = await qwenTokenizer();
    const s = await serveGuessNumber(0, "id");
    servers.push(s);
    const say = (n: number) => `Action: guess ${n}`;
    // Rows: task 0 × (binary search, always "guess 1"), task 1 × (binary search, always "guess 1").
    const scripts = [0, 1].flatMap((idx) => [
      binarySearch(secretFor(idx)).map(say),
      Array.from({ length: 10 }, () => say(secretFor(idx) === 1 ? 2 : 1)),
    ]);
    const model = new ScriptedModel({
      vocabSize: tok.vocabSize,
      eosTokenId: tok.eosTokenId,
      header: tok.encode("<|im_start|>assistant\n"),
      scripts: scripts.map((turns) => turns.map((t) => tok.encode(t))),
    });
    const r = await evaluate(model, tok, environmentTasks([0, 1]), {
      samplesPerPrompt: 2,
      temperature: 1,
      batchSize: 2,
      maxNewTokens: 400,
      maxTurns: 10,
      toolsInPrompt: false,
      seed: 0,
      tools: [],
      envs: agentGymEnvironments(s.url, { family: FAMILIES.id }),
    });
    expect(r.questions.map((q) => q.samples.map((x) => [x.strict, x.envReward, x.formatValid]))).toEqual([
      [
        [true, 1, true],
        [false, 0, true],
      ],
      [
        [true, 1, true],
        [false, 0, true],
      ],
    ]);
    expect(r.questions[0].question).toMatch(/^Guess the secret whole number/);
    expect(r.strict.value).toBe(0.5);
    expect(r.envReward).toBe(0.5);
    expect(r.passAtK).toBe(1);
    // The failing row used its 10 guesses: the environment ended the episode (No guesses left).
    expect(r.questions[0].samples[1].turns).toHaveLength(10);
  });

  it("eval --env: eval.json, samples and report from episodes on the tiny base; a server that does not answer writes nothing", async () => {
    const { initBackend } = await import("../../src/kernels/backend.ts");
    const { parseEvalArgs, runEval } = await import("../../src/run/eval-run.ts");
    const { TINY_BASE_DIR } = await import("../../src/presets/tiny.ts");
    await initBackend("wasm");
    const s = await serveGuessNumber(0, "env_idx");
    servers.push(s);
    const out = path.join(await fs.mkdtemp(path.join(os.tmpdir(), "env-eval-")), "eval");
    const args = (env: string) => [
      "node",
      "eval",
      "--model_path",
      TINY_BASE_DIR,
      "--env",
      env,
      "--env_dialect",
      "env_idx",
      "--max_samples",
      "2",
      "--samples_per_prompt",
      "2",
      "--temperature",
      "1",
      "--max_new_tokens",
      "48",
      "--max_turns",
      "2",
      "--backend",
      "wasm",
      "--output_dir",
      out,
    ];
    const hung = await brokenServer(null);
    await expect(
      runEval(await parseEvalArgs([...args(hung), "--tool_timeout", "0.3"]), { out: () => {}, progress: false }),
    ).rejects.toThrow(/^--env http.*no reply within 0\.3 s/);
    expect(
      await fs.stat(out).then(
        () => true,
        () => false,
      ),
    ).toBe(false);
    await expect(parseEvalArgs(args("localhost:1"))).rejects.toThrow(/^--env localhost:1: expected an http\(s\) URL/);

    const cfg = await parseEvalArgs(args(s.url));
    const lines: string[] = [];
    const res = await runEval(cfg, { out: (l) => lines.push(l), progress: false });
    const [m] = res.results;
    expect(m.result).toMatchObject({ n: 2, k: 2, toolCallsPerRollout: 0 });
    expect(m.result.envReward).toBeGreaterThanOrEqual(0);
    expect(lines[0]).toContain(`2 episodes of ${s.url} × 2`);
    expect(lines.some((l) => /env reward \d\.\d{3} \| env errors 0\.000/.test(l))).toBe(true);
    const evalJson = JSON.parse(await fs.readFile(path.join(out, "eval.json"), "utf8"));
    expect(evalJson.config).toMatchObject({ env: s.url, env_dialect: "env_idx", max_samples: 2, samples_per_prompt: 2, output_dir: out });
    expect(evalJson.models[0]).toHaveProperty("envReward");
    expect(evalJson.models[0].envErrorRate).toBe(0);
    const rows = (await fs.readFile(path.join(out, `samples-${evalJson.models[0].name}.jsonl`), "utf8"))
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(rows.map((r) => r.id)).toEqual(["1000", "1001"]); // held out from GRPO's default training tasks
    expect(evalJson.config).toMatchObject({ env_tasks: "1000-1001" });
    for (const r of rows) {
      expect(r.question).toMatch(/^Guess the secret whole number/);
      for (const x of r.samples) {
        expect(typeof x.envReward).toBe("number");
        expect(x.strict).toBe(x.envReward >= 1);
        for (const turn of x.turns) expect("observation" in turn).toBe(turn.ended); // an ended turn was an action
      }
    }
    expect(await fs.readFile(path.join(out, "report.html"), "utf8")).toContain(`Evaluation on the environment ${s.url}`);
    await fs.rm(path.dirname(out), { recursive: true, force: true });
  }, 120_000);
});

describe("the generic dialects' action", () => {
  it("the first non-empty line after the last Action:, else the whole turn; a trailing period dropped", () => {
    const act = (t: string) => (genericAction(t) as { action: string }).action;
    expect(act("Thought: x\nAction: guess 1\nmore\nAction:  guess 2 ")).toBe("guess 2");
    expect(act("Thought: x\n\nAction:\nguess 3.\n")).toBe("guess 3"); // AgentGym's layout: the action on the next line
    expect(act("  guess 7 \n")).toBe("guess 7");
  });
});
