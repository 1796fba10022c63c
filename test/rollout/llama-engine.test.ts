/** --rollout_engine llama against the local engine on the tiny preset with a LoRA adapter: the same
 *  greedy multi-turn rollouts (tool calls, forced tool results read into the kept KV cache), sampled
 *  tokens whose engine log-probs are the trainer's (f32 weights), rows that wait for a KV slot, the
 *  adapter swapped after an update, and a GRPO run that logs the gap and the swap. Skips where
 *  node-llama-cpp's binaries cannot load, except under CI, where that fails. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs";
import { calculatorTool, shutdownCalculator } from "../../src/agents/calculator.ts";
import { toPrompt } from "../../src/agents/prompts.ts";
import { serveGuessNumber } from "../../scripts/lib/guess-number.ts";
import { generateSynthetic } from "../../src/datasets/synthetic.ts";
import { cachedModelGguf, writeLoraGguf } from "../../src/model/gguf.ts";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { TINY_BASE_DIR, TINY_PROBLEMS } from "../../src/presets/tiny.ts";
import { prepareEngine } from "../../src/rollout/engines/index.ts";
import { LlamaBatch } from "../../src/rollout/engines/llama-batch.ts";
import { importLlama } from "../../src/rollout/engines/llama-package.ts";
import { LlamaTurns } from "../../src/rollout/engines/llama.ts";
import type { EngineFlags, RolloutEngine } from "../../src/rollout/engines/types.ts";
import { rolloutGroups } from "../../src/rollout/rollout.ts";
import { turnRollouts } from "../../src/rollout/turns.ts";
import type { RolloutConfig, Trajectory } from "../../src/rollout/types.ts";
import { runGrpo } from "../../src/run/grpo-run.ts";
import { engineGrpoRun } from "./helpers/engine-grpo.ts";
import { openPolicy, type Policy } from "../../src/run/policy.ts";
import { UsageError } from "../../src/util/errors.ts";
import { Rng } from "../../src/util/rng.ts";
import { guessEpisodes, tinyEnvRunConfig } from "../envs/helpers/tiny-env-run.ts";

const loadError: unknown = await importLlama()
  .then(async ({ getLlama }) => (await getLlama({ gpu: false, build: "never" })).dispose())
  .then(() => null)
  .catch((e: unknown) => e ?? new Error("node-llama-cpp failed to load"));

const flags: EngineFlags = {
  rollout_engine: "llama",
  engine_weights: "f32",
  engine_gpu: "off",
  threads: 1,
  rollout_timeout: 60,
  async_rollouts: 0,
};
const prompts = [
  toPrompt("Tom has 12 apples and buys 30 more. How many apples does he have?"),
  toPrompt("Each bag has 15 marbles. How many marbles are in 6 bags?"),
];
const config = (temperature: number, seed: number): RolloutConfig => ({
  samplesPerPrompt: 2,
  maxNewTokens: 120,
  maxTurns: 4,
  temperature,
  topP: 1,
  topK: 0,
  rng: new Rng(seed),
  tools: [calculatorTool],
  toolsInPrompt: false,
});
const view = (ts: Trajectory[]) => ts.map((t) => ({ ids: t.completionIds, mask: t.lossMask, finish: t.finishReason }));

let dir: string, policy: Policy, engine: RolloutEngine;
const model = () => policy.model as Qwen2ForCausalLM;

/** Nudge every LoRA B away from zero (a fresh adapter is the base itself). */
function perturb(seed: number) {
  tf.tidy(() => {
    for (const v of model().trainableVariables())
      if (v.name.includes(".lora_B#")) v.assign(tf.randomNormal(v.shape, 0, 0.08, "float32", seed++));
  });
}

describe.skipIf(loadError !== null && !process.env.CI)("the llama rollout engine on the tiny preset", () => {
  beforeAll(async () => {
    if (loadError) throw loadError; // only reached under CI (the suite is skipped otherwise)
    dir = await fs.mkdtemp(path.join(os.tmpdir(), "llama-engine-test-"));
    process.env.XDG_CACHE_HOME = path.join(dir, "cache"); // the GGUF cache of this test alone
    policy = await openPolicy({
      modelPath: TINY_BASE_DIR,
      quantize: "none",
      lora: { r: 4, alpha: 8, dropout: 0, targetModules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] },
      trainable: "lora",
      seed: 1,
      backend: "wasm",
      threads: 1,
    });
    perturb(11);
    const open = await prepareEngine(flags, () => {});
    const sampling = { samplesPerPrompt: 2, maxNewTokens: 120, maxTurns: 4, temperature: 1, topP: 1, topK: 0, toolsInPrompt: false };
    engine = await open({
      model: policy.model,
      tokenizer: policy.tokenizer,
      modelDir: policy.base,
      workDir: dir,
      tools: [calculatorTool],
      sampling,
      log: () => {},
    });
  });
  afterAll(async () => {
    await engine?.close();
    policy?.model.dispose();
    await shutdownCalculator();
    delete process.env.XDG_CACHE_HOME;
    if (dir) await fs.rm(dir, { recursive: true, force: true });
  });

  it("rolls out greedily what the local engine rolls out, tool calls and their results included", async () => {
    const local = await rolloutGroups(policy.model, policy.tokenizer, prompts, config(0, 1));
    const llama = await engine.generate(prompts, config(0, 1));
    expect(local.some((t) => t.numToolCalls > 0)).toBe(true); // a tool result was read into the kept KV
    expect(view(llama)).toEqual(view(local));
    expect(llama.map((t) => t.turns.map((x) => x.toolCalls.map((c) => c.result)))).toEqual(
      local.map((t) => t.turns.map((x) => x.toolCalls.map((c) => c.result))),
    );
  });

  it("keeps 64 rows apart while some read tool results and others draw (one batch)", async () => {
    // llama.cpp reorders a mixed batch's outputs lazily while node-llama-cpp's samplers read them in
    // parallel: rows then drew from one another's logits (llama-batch.ts evaluate()).
    const many = generateSynthetic({ ...TINY_PROBLEMS, n: 16, seed: 5 }).map((e) => toPrompt(e.question));
    const c = { ...config(0, 1), samplesPerPrompt: 4 };
    const local = await rolloutGroups(policy.model, policy.tokenizer, many, c);
    expect(local.filter((t) => t.numToolCalls > 0).length).toBeGreaterThan(16);
    expect(view(await engine.generate(many, c))).toEqual(view(local));
  });

  it("samples tokens whose log-probs are the trainer's (f32 weights, temperature 1)", async () => {
    const trajs = (await engine.rollouts({ step: 0, steps: 1, prompts: () => prompts, seedOf: () => 7 })).trajs;
    let gap = 0,
      n = 0;
    for (const t of trajs) {
      const ids = [...t.promptIds, ...t.completionIds];
      const lp = tf.tidy(() => policy.model.tokenLogprobs([ids], [ids.map(() => 1)]).logprobs.arraySync()[0]);
      t.lossMask.forEach((m, k) => {
        if (m !== 1) return;
        gap += Math.abs(t.sampleLogprobs[k] - lp[t.promptIds.length + k]);
        n++;
      });
    }
    expect(n).toBeGreaterThan(50);
    expect(gap / n).toBeLessThan(1e-3);
    // Seeded per row and turn: the same seed draws the same rollouts, another seed others.
    const again = (await engine.rollouts({ step: 0, steps: 1, prompts: () => prompts, seedOf: () => 7 })).trajs;
    expect(view(again)).toEqual(view(trajs));
    const other = (await engine.rollouts({ step: 0, steps: 1, prompts: () => prompts, seedOf: () => 8 })).trajs;
    expect(view(other)).not.toEqual(view(trajs));
  });

  it("runs more rows than KV slots, each row waiting for a free slot", async () => {
    const gguf = await cachedModelGguf(model(), policy.base, { type: "f32", cacheDir: path.join(dir, "cache", "mini-agentic-rl", "gguf") });
    const lora = path.join(dir, "slots-lora.gguf");
    await writeLoraGguf({ file: lora, tensors: await model().loraAdapter!.toPeft(), alpha: 8 });
    const batch = await LlamaBatch.open({ modelPath: gguf.file, loraPath: lora, sequences: 2, contextSize: 1024, threads: 1, kvF32: true });
    try {
      const c = config(0, 1);
      const turns = new LlamaTurns(batch);
      const twoSlots = await turnRollouts(turns, policy.tokenizer, prompts, { ...c, seed: 1, maxPositions: 1024 });
      await turns.dispose();
      expect(view(twoSlots)).toEqual(view(await engine.generate(prompts, c)));
    } finally {
      await batch.close();
    }
  });

  it("samples with the adapter as it is after an update (hot-swapped)", async () => {
    const before = await engine.generate(prompts, config(0, 1));
    perturb(101);
    const after = await engine.generate(prompts, config(0, 1));
    expect(view(after)).not.toEqual(view(before));
    expect(view(after)).toEqual(view(await rolloutGroups(policy.model, policy.tokenizer, prompts, config(0, 1))));
  });

  it("rolls out against an environment server (--env): each ended turn an action with its observation", async () => {
    const server = await serveGuessNumber(0, "env_idx");
    try {
      const cfg = await tinyEnvRunConfig(server.url, "env_idx", {
        ...flags,
        rollout_engine: "llama",
        reward_weights: "correctness=0,format=0,tool_use=0,env=1",
        env_tasks: "5,7",
        eval_samples: 0,
        max_new_tokens: 48,
      });
      await runGrpo(cfg);
      await guessEpisodes(cfg.output_dir, expect);
    } finally {
      await server.close();
    }
  });

  it("refuses flags it cannot honour, in one line", async () => {
    await expect(prepareEngine({ ...flags, async_rollouts: 1 }, () => {})).rejects.toThrow(UsageError);
    await expect(prepareEngine({ ...flags, rollout_url: "http://127.0.0.1:1/v1" }, () => {})).rejects.toThrow(
      /only used with --rollout_engine openai/,
    );
  });

  it("trains with GRPO, logging the engine's log-prob gap, the TIS cut and the adapter swap", async () => {
    const out = path.join(dir, "grpo");
    const { steps, metrics: m } = await engineGrpoRun(out, { ...flags, rollout_engine: "llama", backend: "wasm" });
    expect(steps).toBe(2);
    for (const x of m) {
      expect(x.adapter_swap_time).toBeGreaterThan(0);
      expect(x.engine_logprob_gap).toBeLessThan(1e-3); // the NF4 base dequantized, as the trainer holds it
      expect(x.tis_clipped_fraction).toBe(0);
    }
    expect(m[1].grad_norm).toBeGreaterThan(0);
    await expect(fs.stat(path.join(out, "final", "adapter_model.safetensors"))).resolves.toBeTruthy();
  });
});
