/** GRPO with --rollout_engine openai against this project's own OpenAI-compatible server (in this
 *  process, real HTTP on 127.0.0.1): rollouts come back as token ids with the engine's log-probs,
 *  which match the trainer's own; a run trains and logs the engine's metrics, synchronously and with
 *  --async_rollouts 1; the engine's failures (unreachable at start, gone mid-run, stalled, malformed)
 *  are one clear error, mid-run with a checkpoint to resume from. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs";
import { calculatorTool, shutdownCalculator } from "../../src/agents/calculator.ts";
import { toPrompt } from "../../src/agents/prompts.ts";
import { UsageError } from "../../src/util/errors.ts";
import { TINY_PROBLEMS } from "../../src/presets/tiny.ts";
import { EngineClient, parseCompletion } from "../../src/rollout/engines/openai-client.ts";
import { EngineError } from "../../src/rollout/engines/types.ts";
import { turnRollouts } from "../../src/rollout/turns.ts";
import { serverTurns } from "../../src/rollout/engines/openai.ts";
import { defaultsOf } from "../../src/run/flags.ts";
import { GRPO_FLAGS } from "../../src/run/grpo-flags.ts";
import { runGrpo, type GrpoRunConfig } from "../../src/run/grpo-run.ts";
import { prepareEngine } from "../../src/rollout/engines/index.ts";
import { openPolicy } from "../../src/run/policy.ts";
import { loadTokenizerFromDir } from "../../src/model/tokenizer.ts";
import { TINY_BASE_DIR } from "../../src/presets/tiny.ts";
import { readMetrics } from "../../src/trainer/metrics.ts";
import { SERVE_OPENAI_FLAGS, serveOpenAi, type ServingOpenAi } from "../../src/serve/openai/run.ts";
import { evenShare, registerReward } from "./helpers/reward.ts";
import { makeTinyModelDir } from "./helpers/tiny-fixture.ts";

let base: string;
let root: string;
let server: ServingOpenAi;
beforeAll(async () => {
  base = await makeTinyModelDir();
  root = await fs.mkdtemp(path.join(os.tmpdir(), "marl-remote-"));
  server = await serveOpenAi({
    ...defaultsOf(SERVE_OPENAI_FLAGS),
    model_path: base,
    served_model_name: "tiny",
    port: 0,
    backend: "wasm",
    tools_in_prompt: false,
  });
});
afterAll(async () => {
  await server?.close();
  await shutdownCalculator();
});

// Random weights never answer right: reward the share of even token ids, which varies between samples.
let onScore = () => {}; // called as each rollout is scored
const EVEN = registerReward("even", (t) => (onScore(), evenShare(t)));

const grpoCfg = (output_dir: string, url: string, over: Partial<GrpoRunConfig> = {}): GrpoRunConfig => ({
  ...defaultsOf(GRPO_FLAGS),
  model_path: base,
  dataset: "synthetic",
  synthetic: TINY_PROBLEMS,
  max_steps: 2,
  prompts_per_step: 2,
  samples_per_prompt: 3,
  max_new_tokens: 24,
  max_turns: 3,
  temperature: 1,
  beta: 0,
  reward_weights: EVEN,
  learning_rate: 1e-2,
  micro_batch_size: 8,
  lora_r: 4,
  lora_alpha: 8,
  quantize: "none",
  tools_in_prompt: false,
  save_steps: 1,
  seed: 3,
  output_dir,
  backend: "wasm",
  quiet: true,
  rollout_engine: "openai",
  rollout_url: `${url}/v1`,
  ...over,
});

describe("rollouts on an OpenAI-compatible engine", () => {
  it("returns the engine's token ids and log-probs, equal to what the trainer computes", async () => {
    const policy = await openPolicy({ modelPath: base, quantize: "none" });
    const client = new EngineClient({ url: server.url, timeoutMs: 60_000 }, policy.model.config.vocabSize);
    const prompts = [toPrompt("Tom has 12 apples and buys 30 more. How many apples?"), toPrompt("What is 7 times 8?")];
    const trajs = await turnRollouts(serverTurns(client, "tiny"), policy.tokenizer, prompts, {
      samplesPerPrompt: 2,
      maxNewTokens: 20,
      maxTurns: 3,
      temperature: 1,
      topP: 1,
      topK: 0,
      tools: [calculatorTool],
      toolsInPrompt: false,
      seed: 5,
      maxPositions: 1024,
    });
    expect(trajs.map((t) => [t.promptIndex, t.sampleIndex])).toEqual([
      [0, 0],
      [0, 1],
      [1, 0],
      [1, 1],
    ]);
    const local = policy.tokenizer.encode(policy.tokenizer.applyChatTemplate(prompts[0], { addGenerationPrompt: true }));
    expect(trajs[0].promptIds).toEqual(local); // the trainer's template, tokenized once
    for (const t of trajs) {
      expect(t.completionIds.length).toBeLessThanOrEqual(20);
      expect(t.lossMask).toHaveLength(t.completionIds.length);
      const ids = [...t.promptIds, ...t.completionIds];
      const lp = tf.tidy(() => policy.model.tokenLogprobs([ids], [ids.map(() => 1)]).logprobs.arraySync()[0]);
      t.lossMask.forEach((m, k) => {
        if (m === 1) expect(t.sampleLogprobs[k]).toBeCloseTo(lp[t.promptIds.length + k], 3);
      });
    }
    policy.model.dispose();
  });

  it("runs the turns' tool calls between requests and forces their rendered results with loss mask 0", async () => {
    const tok = await loadTokenizerFromDir(TINY_BASE_DIR);
    const im = tok.eosTokenId;
    const turns = [
      [...tok.encode('Sara has 15 * 6 =\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "15*6"}}\n</tool_call>'), im],
      [...tok.encode("90 marbles.\nThe answer is \\boxed{90}."), im],
    ];
    const prompts: number[][] = [];
    const engine = http.createServer((req, res) => {
      let body = "";
      req.on("data", (c) => (body += c));
      req.on("end", () => {
        const r = JSON.parse(body);
        prompts.push(r.prompt);
        const ids = turns[prompts.length - 1];
        res
          .writeHead(200, { "Content-Type": "application/json" })
          .end(
            JSON.stringify({ choices: [{ finish_reason: "stop", token_ids: ids, logprobs: { token_logprobs: ids.map(() => -0.25) } }] }),
          );
      });
    });
    await new Promise<void>((r) => engine.listen(0, "127.0.0.1", () => r()));
    const client = new EngineClient({ url: `http://127.0.0.1:${(engine.address() as AddressInfo).port}`, timeoutMs: 10_000 }, 512);
    const [t] = await turnRollouts(serverTurns(client, "m"), tok, [toPrompt("Each bag has 15 marbles. How many marbles are in 6 bags?")], {
      samplesPerPrompt: 1,
      maxNewTokens: 200,
      maxTurns: 3,
      temperature: 1,
      topP: 1,
      topK: 0,
      tools: [calculatorTool],
      toolsInPrompt: false,
      seed: 1,
      maxPositions: 1024,
    });
    engine.close();
    expect(t.finishReason).toBe("stop");
    expect(t.numToolCalls).toBe(1);
    expect(t.turns[0].toolCalls[0]).toMatchObject({ name: "calculator", result: "90", error: false });
    expect(t.finalText).toContain("\\boxed{90}");
    const forced = tok.encode("\n<|im_start|>user\n<tool_response>\n90\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    expect(t.completionIds).toEqual([...turns[0], ...forced, ...turns[1]]);
    expect(t.lossMask).toEqual([...turns[0].map(() => 1), ...forced.map(() => 0), ...turns[1].map(() => 1)]);
    expect(t.sampleLogprobs).toEqual([...turns[0].map(() => -0.25), ...forced.map(() => 0), ...turns[1].map(() => -0.25)]);
    // The second request's prompt is the first's plus everything since, token for token.
    expect(prompts[1]).toEqual([...prompts[0], ...turns[0], ...forced]);
  });

  it("trains with the engine, synchronously and one step ahead, logging version, staleness and waits", async () => {
    const sync = await runGrpo(grpoCfg(path.join(root, "sync"), server.url));
    expect(sync.steps).toBe(2);
    const m = await readMetrics(path.join(root, "sync", "metrics.jsonl"));
    expect(m.map((x) => [x.policy_version, x.staleness])).toEqual([
      [0, 0],
      [1, 0],
    ]);
    for (const x of m) {
      for (const k of ["trainer_wait", "engine_wait", "rollout_time"]) expect(x[k] as number, k).toBeGreaterThanOrEqual(0);
      expect(x.engine_logprob_gap as number).toBeLessThan(1e-3); // same model code on both sides
    }
    expect(m[1].kl).toBe(0); // β = 0

    const ahead = await runGrpo(grpoCfg(path.join(root, "async"), server.url, { max_steps: 3, async_rollouts: 1 }));
    expect(ahead.steps).toBe(3);
    const a = await readMetrics(path.join(root, "async", "metrics.jsonl"));
    // Steps 1 and 2 were requested at the start (version 0); step 3 once version 1 was published.
    expect(a.map((x) => [x.policy_version, x.staleness])).toEqual([
      [0, 0],
      [0, 1],
      [1, 1],
    ]);
    expect(a[1].engine_logprob_gap as number).toBeGreaterThan(0); // rollouts of older weights: the ratio is not 1
    const lines = (await fs.readFile(path.join(root, "async", "trajectories.jsonl"), "utf8"))
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(new Set(lines.map((l) => `${l.step}:${l.policyVersion}`))).toEqual(new Set(["1:0", "2:0", "3:1"]));
    // Every version loaded into the server was unloaded again, and its folder removed.
    expect(server.batcher.adapterNames()).toEqual([]);
    await expect(fs.stat(path.join(root, "async", "engine-adapters"))).rejects.toThrow();
  });

  it("refuses to start when the engine does not answer, in one line", async () => {
    const closed = http.createServer();
    await new Promise<void>((r) => closed.listen(0, "127.0.0.1", () => r()));
    const port = (closed.address() as AddressInfo).port;
    await new Promise<void>((r) => closed.close(() => r()));
    const f = { ...defaultsOf(GRPO_FLAGS), rollout_engine: "openai" as const, rollout_url: `http://127.0.0.1:${port}/v1` };
    const err = await prepareEngine(f, () => {}).catch((e: Error) => e);
    expect(err).toBeInstanceOf(UsageError);
    expect((err as Error).message).toMatch(/cannot be reached \(ECONNREFUSED\)/);
    expect((err as Error).message).not.toContain("\n");
    await expect(prepareEngine({ ...f, rollout_engine: "local", async_rollouts: 1, rollout_url: undefined }, () => {})).rejects.toThrow(
      /--async_rollouts 1 needs --rollout_engine openai/,
    );
  });

  it("stops a run whose engine goes away with a checkpoint, and the run resumes", async () => {
    const second = await serveOpenAi({
      ...defaultsOf(SERVE_OPENAI_FLAGS),
      model_path: base,
      served_model_name: "tiny",
      port: 0,
      backend: "wasm",
      tools_in_prompt: false,
    });
    const dir = path.join(root, "dies");
    let scored = 0;
    const cfg = grpoCfg(dir, second.url, { max_steps: 3 });
    // The engine dies while step 1 is scored: step 2's publish finds nobody.
    onScore = () => void (++scored === 6 && second.close());
    await expect(runGrpo(cfg)).rejects.toThrow(/cannot be reached.*stopped before step 2 and saved checkpoint-1 .*--resume/);
    onScore = () => {};
    expect(await fs.readFile(path.join(dir, "latest"), "utf8")).toContain("checkpoint-1");
    const resumed = await runGrpo({ ...grpoCfg(dir, server.url, { max_steps: 3 }), resume: true });
    expect(resumed.steps).toBe(3);
    expect((await readMetrics(path.join(dir, "metrics.jsonl"))).map((x) => x.step)).toEqual([1, 2, 3]);
  });

  it("bounds a stalled engine by the timeout and names the field of a malformed answer", async () => {
    const stalled = http.createServer(() => {}); // accepts, never answers
    await new Promise<void>((r) => stalled.listen(0, "127.0.0.1", () => r()));
    const url = `http://127.0.0.1:${(stalled.address() as AddressInfo).port}`;
    const client = new EngineClient({ url, timeoutMs: 300 }, 320);
    const params = { maxTokens: 4, temperature: 1, topP: 1, topK: 0, seed: 1, stopTokenIds: [] };
    await expect(client.complete("tiny", [1, 2], params)).rejects.toMatchObject({ kind: "timeout" });
    stalled.closeAllConnections();
    await new Promise<void>((r) => stalled.close(() => r()));

    // A pooled connection the engine closed is retried once on a fresh one; one closed every time is an error.
    let seen = 0;
    const flaky = http.createServer((req, res) => {
      if (++seen === 1 || req.url === "/v1/completions") return void req.socket.destroy();
      res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify({ data: [{ id: "m" }] }));
    });
    await new Promise<void>((r) => flaky.listen(0, "127.0.0.1", () => r()));
    const flakyClient = new EngineClient({ url: `http://127.0.0.1:${(flaky.address() as AddressInfo).port}/v1`, timeoutMs: 10_000 }, 320);
    expect(await flakyClient.models()).toEqual(["m"]);
    expect(seen).toBe(2);
    await expect(flakyClient.complete("m", [1], params)).rejects.toMatchObject({ kind: "unreachable" });
    flaky.closeAllConnections();
    await new Promise<void>((r) => flaky.close(() => r()));

    const choice = (c: Record<string, unknown>) => ({
      choices: [{ finish_reason: "stop", logprobs: { token_logprobs: [-0.5], tokens: ["token_id:7"] }, ...c }],
    });
    expect(parseCompletion(choice({}), 320)).toEqual({ ids: [7], logprobs: [-0.5], finishReason: "stop" });
    expect(() => parseCompletion(choice({ logprobs: { token_logprobs: [-0.5], tokens: ["hello"] } }), 320)).toThrow(
      /choices\[0\]\.logprobs\.tokens\[0\]/,
    );
    expect(() => parseCompletion(choice({ token_ids: [7, 999] }), 320)).toThrow(/choices\[0\]\.token_ids\[1\]/);
    expect(() => parseCompletion(choice({ finish_reason: "abort" }), 320)).toThrow(/choices\[0\]\.finish_reason/);
    expect(() => parseCompletion(choice({ logprobs: { token_logprobs: ["x"], tokens: ["token_id:7"] } }), 320)).toThrow(
      /token_logprobs\[0\]/,
    );
    expect(() => parseCompletion({ choices: [] }, 320)).toThrow(EngineError);
  });
});
