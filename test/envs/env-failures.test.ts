/** Environment servers that fail at create or reset, over real HTTP: a proxy in front of the shipped
 *  guess-the-number server answers chosen requests with an HTTP error, a non-JSON reply or nothing.
 *  Each failure is that rollout's (env_error, reward 0, no update from it); a GRPO run goes on through
 *  partial failures and stops with one line, a checkpoint and a way to resume after
 *  --env_max_failed_steps steps in which every rollout failed. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs";
import { toPrompt } from "../../src/agents/prompts.ts";
import { agentGymEnvironments } from "../../src/envs/agentgym.ts";
import { FAMILIES } from "../../src/envs/families.ts";
import { ENV_SYSTEM_PROMPT, openEpisodes } from "../../src/envs/episodes.ts";
import { secretFor, serveGuessNumber, type GuessServer } from "../../scripts/lib/guess-number.ts";
import type { Tokenizer } from "../../src/model/types.ts";
import { rolloutGroups } from "../../src/rollout/rollout.ts";
import { countedGroupAdvantages, groupAdvantages } from "../../src/trainer/advantages.ts";
import { Rng } from "../../src/util/rng.ts";
import { qwenTokenizer } from "../rollout/helpers/qwen-tokenizer.ts";
import { ScriptedModel } from "../rollout/helpers/scripted-model.ts";
import { registerReward } from "../run/helpers/reward.ts";
import { tinyEnvRunConfig } from "./helpers/tiny-env-run.ts";

type Fault = "ok" | "http500" | "garbage" | "hang";

/** A real HTTP server in front of `target`: `fault(route, n)` (n: 1-based count of that route so far)
 *  says whether to pass the request on or fail it. */
async function faultyProxy(target: string, fault: (route: string, n: number) => Fault): Promise<{ url: string; close(): void }> {
  const counts = new Map<string, number>();
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", async () => {
      const route = new URL(req.url ?? "/", "http://x").pathname;
      const n = (counts.get(route) ?? 0) + 1;
      counts.set(route, n);
      const f = fault(route, n);
      if (f === "hang") return;
      if (f === "http500") return void res.writeHead(500, { "content-type": "application/json" }).end('{"detail": "internal error"}');
      if (f === "garbage") return void res.writeHead(200, { "content-type": "text/html" }).end("<html>bad gateway</html>");
      const body = Buffer.concat(chunks);
      const reply = await fetch(target + req.url, {
        method: req.method,
        body: req.method === "GET" ? undefined : body,
        headers: { "content-type": "application/json" },
      });
      res.writeHead(reply.status, { "content-type": "application/json" }).end(await reply.text());
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => {
      server.closeAllConnections();
      server.close();
    },
  };
}

let guess: GuessServer;
const proxies: { close(): void }[] = [];
beforeAll(async () => {
  guess = await serveGuessNumber(0, "id");
});
afterAll(async () => {
  for (const p of proxies) p.close();
  await guess.close();
});

describe("create and reset failures are per rollout", () => {
  let tok: Tokenizer;
  beforeAll(async () => {
    tok = await qwenTokenizer();
  });

  it("a failed create, a failed reset and a hung reset fail their rows; the other rows play", async () => {
    // 2 tasks × 3 rows: create #2 gets HTTP 500, reset #1 a non-JSON reply, reset #3 no reply at all.
    const proxy = await faultyProxy(guess.url, (route, n) =>
      route === "/create" && n === 2
        ? "http500"
        : route === "/reset" && n === 1
          ? "garbage"
          : route === "/reset" && n === 3
            ? "hang"
            : "ok",
    );
    proxies.push(proxy);
    const t0 = Date.now();
    // A limit well above a loaded machine's loopback round trip, since the rows' steps share it.
    const episodes = await openEpisodes(agentGymEnvironments(proxy.url, { family: FAMILIES.id, timeoutMs: 3_000 }), [3, 5], 3);
    expect(Date.now() - t0).toBeLessThan(30_000); // the hung reset is cut at its time limit
    expect(episodes.failed).toBe(3);
    const failures = episodes.envs.map((e) => e.failure).filter((f) => f !== undefined);
    expect(failures.some((f) => /\/create: HTTP 500/.test(f!))).toBe(true);
    expect(failures.some((f) => /\/reset: reply is not JSON: "<html>bad gateway<\/html>"/.test(f!))).toBe(true);
    expect(failures.some((f) => /\/reset: no reply within 3 s/.test(f!))).toBe(true);
    // Each task still has a started row, so its first observation is known.
    for (const o of episodes.observations) expect(o).toMatch(/^Guess the secret whole number/);

    const say = (n: number) => tok.encode(`Action: guess ${n}`);
    const scripts = [3, 3, 3, 5, 5, 5].map((idx) => [say(secretFor(idx))]); // every row guesses right at once
    const model = new ScriptedModel({
      vocabSize: tok.vocabSize,
      eosTokenId: tok.eosTokenId,
      header: tok.encode("<|im_start|>assistant\n"),
      scripts,
    });
    const before = tf.memory().numTensors;
    const out = await rolloutGroups(
      model,
      tok,
      episodes.observations.map((o) => toPrompt(o, ENV_SYSTEM_PROMPT)),
      {
        samplesPerPrompt: 3,
        maxNewTokens: 100,
        maxTurns: 2,
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
    out.forEach((t, i) => {
      const failure = episodes.envs[i].failure;
      if (failure !== undefined) {
        // Ended before its first token: nothing sampled, nothing to train, the message kept.
        expect(t).toMatchObject({ finishReason: "env_error", envError: failure, envReward: 0, completionIds: [], turns: [] });
      } else {
        expect(t, t.envError).toMatchObject({ finishReason: "stop", envReward: 1 });
      }
    });
  });

  it("when no row of a task starts, its prompt is a placeholder and nothing is decoded", async () => {
    const proxy = await faultyProxy(guess.url, (route) => (route === "/create" ? "http500" : "ok"));
    proxies.push(proxy);
    const episodes = await openEpisodes(agentGymEnvironments(proxy.url, { family: FAMILIES.id }), [4], 2);
    expect(episodes.failed).toBe(2);
    expect(episodes.observations).toEqual(["(task 4: the environment did not start)"]);
    const model = new ScriptedModel({
      vocabSize: tok.vocabSize,
      eosTokenId: tok.eosTokenId,
      header: tok.encode("<|im_start|>assistant\n"),
      scripts: [[[1]], [[1]]],
    });
    const out = await rolloutGroups(
      model,
      tok,
      episodes.observations.map((o) => toPrompt(o, ENV_SYSTEM_PROMPT)),
      {
        samplesPerPrompt: 2,
        maxNewTokens: 50,
        maxTurns: 2,
        temperature: 1,
        topP: 1,
        topK: 0,
        rng: new Rng(0),
        tools: [],
        envs: episodes.envs,
      },
    );
    await episodes.close();
    expect(out.map((t) => t.finishReason)).toEqual(["env_error", "env_error"]);
    expect(model.lastCache).toBeNull(); // no prefill, no decode step
  });

  it("eval --env: a sample whose instance did not start is a failed sample with its error, the others are judged", async () => {
    const { evaluate } = await import("../../src/run/evaluate.ts");
    const { environmentTasks } = await import("../../src/envs/episodes.ts");
    const proxy = await faultyProxy(guess.url, (route, n) => (route === "/create" && n === 1 ? "http500" : "ok"));
    proxies.push(proxy);
    const say = tok.encode(`Action: guess ${secretFor(0)}`);
    const model = new ScriptedModel({
      vocabSize: tok.vocabSize,
      eosTokenId: tok.eosTokenId,
      header: tok.encode("<|im_start|>assistant\n"),
      scripts: [[say], [say]],
    });
    const r = await evaluate(model, tok, environmentTasks([0]), {
      samplesPerPrompt: 2,
      temperature: 1,
      batchSize: 1,
      maxNewTokens: 100,
      maxTurns: 2,
      toolsInPrompt: false,
      seed: 0,
      tools: [],
      envs: agentGymEnvironments(proxy.url, { family: FAMILIES.id }),
    });
    const samples = r.questions[0].samples;
    expect(samples.map((x) => x.strict).sort()).toEqual([false, true]);
    expect(samples.find((x) => !x.strict)).toMatchObject({ envReward: 0, envError: expect.stringMatching(/\/create: HTTP 500/) });
    expect(r.strict.value).toBe(0.5);
  });

  it("eval.ts --env: the error rate on screen and in eval.json; every episode failing is an error, nothing written", async () => {
    const { initBackend } = await import("../../src/kernels/backend.ts");
    const { parseEvalArgs, runEval } = await import("../../src/run/eval-run.ts");
    const { TINY_BASE_DIR } = await import("../../src/presets/tiny.ts");
    await initBackend("wasm");
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), "env-eval-fail-"));
    const args = (env: string, out: string) => [
      "node",
      "eval",
      "--model_path",
      TINY_BASE_DIR,
      "--env",
      env,
      "--env_dialect",
      "id",
      "--max_samples",
      "2",
      "--samples_per_prompt",
      "2",
      "--temperature",
      "1",
      "--max_new_tokens",
      "16",
      "--max_turns",
      "1",
      "--backend",
      "wasm",
      "--output_dir",
      out,
    ];
    // Create #1 and reset #1 are the start-up probe; then create #3 fails: 1 of 4 episodes.
    const some = await faultyProxy(guess.url, (route, n) => (route === "/create" && n === 3 ? "http500" : "ok"));
    // After the probe the server is down: every episode fails.
    const down = await faultyProxy(guess.url, (route, n) => (route === "/create" && n >= 2 ? "http500" : "ok"));
    proxies.push(some, down);
    const lines: string[] = [];
    await runEval(await parseEvalArgs(args(some.url, path.join(dir, "some"))), { out: (l) => lines.push(l), progress: false });
    expect(lines.some((l) => / \| env errors 0\.250 \| /.test(l))).toBe(true);
    const evalJson = JSON.parse(await fs.readFile(path.join(dir, "some", "eval.json"), "utf8"));
    expect(evalJson.models[0].envErrorRate).toBe(0.25);
    await expect(runEval(await parseEvalArgs(args(down.url, path.join(dir, "down"))), { out: () => {}, progress: false })).rejects.toThrow(
      /^environment http:\/\/127\.0\.0\.1:\d+: all 4 episodes failed on the environment, none was played \(first: environment .*\/create: HTTP 500/,
    );
    expect(
      await fs.stat(path.join(dir, "down")).then(
        () => true,
        () => false,
      ),
    ).toBe(false);
    await fs.rm(dir, { recursive: true, force: true });
  }, 120_000);

  it("advantages leave env-failed rollouts out of the group's mean and std", () => {
    const rewards = [[1, 0, 0, 0]];
    // Row 3 failed on the environment: the group is [1, 0, 0] as far as the policy is concerned.
    const a = countedGroupAdvantages(rewards, [[true, true, true, false]], "group");
    expect(a[0][3]).toBe(0);
    expect(a[0].slice(0, 3)).toEqual(groupAdvantages([[1, 0, 0]], "group")[0]);
    expect(a[0][0]).toBeCloseTo((1 - 1 / 3) / (Math.sqrt((4 / 9 + 1 / 9 + 1 / 9) / 2) + 1e-4), 10);
    expect(countedGroupAdvantages([[0.5, 0]], [[false, false]], "none")).toEqual([[0, 0]]);
    expect(countedGroupAdvantages([[2, 0, 1]], [[true, true, true]], "none")).toEqual(groupAdvantages([[2, 0, 1]], "none"));
  });
});

describe("GRPO against a failing environment server", () => {
  it("partial failures train on the rest; all-failed steps in a row stop the run with a checkpoint to resume", async () => {
    const { runGrpo } = await import("../../src/run/grpo-run.ts");
    const { readMetrics } = await import("../../src/trainer/metrics.ts");
    // /create #1 and /reset #1 are the start-up check. Step 1 creates #2–#5 and resets #2–#5: reset
    // #3 fails. Steps 2 and 3: every create fails (the server is down) until `healthy`.
    let healthy = false;
    const proxy = await faultyProxy(guess.url, (route, n) =>
      healthy ? "ok" : route === "/reset" && n === 3 ? "http500" : route === "/create" && n >= 6 ? "http500" : "ok",
    );
    proxies.push(proxy);
    const cfg = await tinyEnvRunConfig(proxy.url, "id", {
      max_steps: 4,
      max_new_tokens: 64,
      env_max_failed_steps: 2,
      // Sample 1 of a group beats sample 0, so every group of two good rollouts carries a signal.
      reward_weights: registerReward("sample", (t) => t.sampleIndex),
    });
    const out = cfg.output_dir;
    await expect(runGrpo(cfg)).rejects.toThrow(
      /^environment http:\/\/127\.0\.0\.1:\d+: every rollout failed in 2 steps in a row \(last: environment .*\/create: HTTP 500 .*\); stopped after step 3 and saved checkpoint-3 and report\.html in .*; continue with --resume once the server answers$/,
    );
    const metrics = await readMetrics(path.join(out, "metrics.jsonl"));
    expect(metrics.map((m) => m.env_error_rate)).toEqual([0.25, 1, 1]);
    // Step 1 trained on its good rollouts (the group with the failed one has one left: no signal).
    expect(metrics[0].train_tokens_per_s).toBeGreaterThan(0);
    expect(metrics[0].zero_signal_groups).toBe(0.5);
    expect(metrics.slice(1).map((m) => [m.reward, m.grad_norm])).toEqual([
      [0, 0],
      [0, 0],
    ]); // nothing to train on
    const lines = (await fs.readFile(path.join(out, "trajectories.jsonl"), "utf8"))
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(lines).toHaveLength(12);
    const failed = lines.filter((t) => t.finishReason === "env_error");
    expect(failed).toHaveLength(9);
    for (const t of failed) {
      expect(t.envError).toMatch(/^environment http:\/\/127\.0\.0\.1:\d+\/(reset|create): HTTP 500/);
      expect(t.reward).toBe(0);
      expect(t.turns).toEqual([]);
    }
    expect(await fs.readdir(out)).toContain("checkpoint-3");
    // The server is back: the run resumes after the failed steps and finishes.
    healthy = true;
    const done = await runGrpo({ ...cfg, resume: true });
    expect(done.steps).toBe(4);
    const after = await readMetrics(path.join(out, "metrics.jsonl"));
    expect(after.map((m) => m.step)).toEqual([1, 2, 3, 4]);
    expect(after[3].env_error_rate).toBe(0);
    await fs.rm(path.dirname(out), { recursive: true, force: true });
  });
});
