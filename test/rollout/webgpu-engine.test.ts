/** The compiled decoder (src/kernels/webgpu/decode/) against tfjs' forward and the local engine:
 *  - a pass's logits are the model's forward's (f32, int8 and NF4 bases, with LoRA and without);
 *  - --rollout_engine webgpu rolls out what the local engine rolls out on the tiny preset (32 rows ×
 *    64 tokens, tool calls and results included): greedy, at temperature 1 from the same uniforms,
 *    and with top-k (the host's rank walk, as the local engine's candidates);
 *  - its sampled tokens' log-probs are the trainer's tokenLogprobs to 1e-4;
 *  - its structure: ≤ 10 dispatches a layer, one submit a pass, no buffer or bind group made after
 *    warm-up, 8 bytes read back a sampling row, no tfjs dispatch while it generates.
 *  Fails under CI=true without a WebGPU adapter (helpers/adapter.ts). */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { calculatorTool, shutdownCalculator } from "../../src/agents/calculator.ts";
import { toPrompt } from "../../src/agents/prompts.ts";
import { generateSynthetic } from "../../src/datasets/synthetic.ts";
import { initBackend } from "../../src/kernels/backend.ts";
import { Decoder } from "../../src/kernels/webgpu/decode/decoder.ts";
import { webgpuTraffic } from "../../src/kernels/webgpu/device.ts";
import { createModel, loadModel } from "../../src/model/load.ts";
import { CompiledBatch } from "../../src/kernels/webgpu/decode/batch.ts";
import { DecodeBatch, type DecodeRows } from "../../src/rollout/decode-batch.ts";
import { BENCH_CONFIGS, tokenBatch } from "../../scripts/lib/bench.ts";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import type { Quantize } from "../../src/model/types.ts";
import { TINY_BASE_DIR, TINY_PROBLEMS } from "../../src/presets/tiny.ts";
import { prepareEngine, type RolloutEngine } from "../../src/rollout/engines/index.ts";
import type { WebgpuEngine } from "../../src/rollout/engines/webgpu.ts";
import { encodePrompts, rolloutGroups, stopTokenIds } from "../../src/rollout/rollout.ts";
import { Batcher } from "../../src/serve/openai/batcher.ts";
import type { RolloutConfig, Trajectory } from "../../src/rollout/types.ts";
import { openPolicy, type Policy } from "../../src/run/policy.ts";
import { engineGrpoRun } from "./helpers/engine-grpo.ts";
import { Rng } from "../../src/util/rng.ts";
import { candidatesFor, drawCandidates } from "../../src/rollout/sampler.ts";
import { sampleRow } from "../../src/rollout/sample-row.ts";
import { CAND_K } from "../../src/kernels/webgpu/decode/layout.ts";
import { webgpuForTests } from "../kernels/webgpu/helpers/adapter.ts";

const gpu = await webgpuForTests();
const FIX = "test/fixtures/qwen2-tiny";

describe.skipIf(!gpu)("the compiled decoder's passes", () => {
  beforeAll(async () => {
    expect(await initBackend("webgpu")).toBe("webgpu");
  });

  for (const quantize of ["none", "int8", "nf4"] as Quantize[])
    it(`a pass's logits are the forward's (${quantize} base, adapter on and off)`, async () => {
      const model = await loadModel(FIX, { adapter: `${FIX}/lora`, quantize });
      const V = model.config.vocabSize;
      const prompts = [
        [3, 4, 5, 6, 7, 8, 9],
        [9, 10, 11],
      ];
      const dec = new Decoder(model);
      for (const adapters of [true, false]) {
        dec.prepare(2, 16, 16, adapters);
        // both prompts as rows of one pass (each row attends to its slot's positions up to its own)
        const rows = prompts.flatMap((p, slot) => p.map((token, pos) => ({ token, slot, pos })));
        const last = [prompts[0].length - 1, rows.length - 1];
        const { logits } = await dec.pass(rows, last, [], 0, true);
        for (let s = 0; s < 2; s++) {
          const ref = tf.tidy(() =>
            tf.slice(model.forward([prompts[s]], undefined, { adapters }), [0, prompts[s].length - 1, 0], [1, 1, V]),
          );
          const want = await ref.data();
          ref.dispose();
          let worst = 0;
          for (let j = 0; j < V; j++) worst = Math.max(worst, Math.abs(want[j] - logits![s * V + j]));
          expect(worst).toBeLessThan(1e-4);
        }
      }
      dec.dispose();
      model.dispose();
    });
});

describe.skipIf(!gpu)("the compiled decoder's top-k/top-p candidates", () => {
  it("are a row's 64 most likely tokens with the normaliser below them: the draws are the rank walk's over the whole row, 520 bytes read a row", async () => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    const model = await loadModel(FIX, { adapter: `${FIX}/lora`, quantize: "nf4" });
    const V = model.config.vocabSize;
    const dec = new Decoder(model);
    dec.prepare(3, 16, 16, true);
    const rows = [3, 9, 27].map((token, slot) => ({ token, slot, pos: 0 }));
    const k = [0, 1, 2];
    for (const params of [
      { temperature: 1, topK: 20 },
      { temperature: 0.02, topP: 0.9 }, // this fixture's rows are flat: a nucleus within 64 tokens needs a low temperature
      { temperature: 1.3, topK: 40, topP: 0.8 },
    ]) {
      const K = candidatesFor(params, V);
      const read0 = dec.stats.readbackBytes;
      const data = (await dec.submit(rows, k, [], params.temperature, false, undefined, undefined, K))!;
      expect(dec.stats.readbackBytes - read0).toBeLessThanOrEqual(1024 * rows.length);
      const W = 2 + 2 * CAND_K,
        packed = new Float32Array(3 * (2 + 2 * K));
      k.forEach((i) => packed.set(data.subarray(i * W, i * W + 2 + 2 * K), i * (2 + 2 * K)));
      const logits = await dec.readLogits(k);
      for (const u of [0.05, 0.5, 0.95]) {
        const got = drawCandidates(packed, K, V, params, [u, u, u]);
        k.forEach((i) => {
          const want = sampleRow(logits.subarray(i * V, (i + 1) * V), params, u, undefined, "rank");
          expect(got[i]).not.toBeNull(); // decided by the 64 candidates (a flatter row is read whole)
          expect(got[i]!.token).toBe(want.token);
          expect(Math.abs(got[i]!.logprob - want.logprob)).toBeLessThan(1e-5);
        });
      }
    }
    dec.dispose();
    model.dispose();
  });
});

const prompts = generateSynthetic({ ...TINY_PROBLEMS, n: 8, seed: 5 }).map((e) => toPrompt(e.question));
const config = (o: Partial<RolloutConfig>): RolloutConfig => ({
  samplesPerPrompt: 4,
  maxNewTokens: 64,
  maxTurns: 4,
  temperature: 0,
  topP: 1,
  topK: 0,
  rng: new Rng(3),
  tools: [calculatorTool],
  toolsInPrompt: false,
  ...o,
});
const view = (ts: Trajectory[]) => ts.map((t) => ({ ids: t.completionIds, mask: t.lossMask, finish: t.finishReason }));

describe.skipIf(!gpu)("--rollout_engine webgpu on the tiny preset (NF4 base, LoRA on every module)", () => {
  let policy: Policy, engine: RolloutEngine;
  beforeAll(async () => {
    policy = await openPolicy({
      modelPath: TINY_BASE_DIR,
      quantize: "nf4",
      lora: { r: 4, alpha: 8, dropout: 0, targetModules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] },
      trainable: "lora",
      seed: 1,
      backend: "webgpu",
    });
    // a fresh adapter is the base itself: move every B away from zero
    let seed = 11;
    tf.tidy(() => {
      for (const v of policy.model.trainableVariables())
        if (v.name.includes(".lora_B#")) v.assign(tf.randomNormal(v.shape, 0, 0.08, "float32", seed++));
    });
    const open = await prepareEngine(
      { rollout_engine: "webgpu", engine_weights: "f32", engine_gpu: "off", rollout_timeout: 60, async_rollouts: 0 },
      () => {},
    );
    const sampling = { samplesPerPrompt: 4, maxNewTokens: 64, maxTurns: 4, temperature: 1, topP: 1, topK: 0, toolsInPrompt: false };
    engine = await open({
      model: policy.model,
      tokenizer: policy.tokenizer,
      modelDir: policy.base,
      workDir: "/tmp",
      tools: [calculatorTool],
      sampling,
      log: () => {},
    });
    expect(engine.name).toBe("webgpu");
  });
  afterAll(async () => {
    await engine?.close();
    policy?.model.dispose();
    await shutdownCalculator();
  });

  it("rolls out greedily what the local engine rolls out, tool calls and results included (32 rows × 64 tokens)", async () => {
    const local = await rolloutGroups(policy.model, policy.tokenizer, prompts, config({}));
    const tfjs0 = webgpuTraffic().dispatches;
    const mine = await engine.generate(prompts, config({}));
    expect(webgpuTraffic().dispatches - tfjs0).toBe(0); // no tfjs op ran while it generated
    expect(local.filter((t) => t.numToolCalls > 0).length).toBeGreaterThan(8);
    expect(view(mine)).toEqual(view(local));
    expect(mine.map((t) => t.turns.map((x) => x.toolCalls.map((c) => c.result)))).toEqual(
      local.map((t) => t.turns.map((x) => x.toolCalls.map((c) => c.result))),
    );
    // warm now: a second generation makes nothing, and each pass is one submit
    const before = { ...(engine as WebgpuEngine).stats };
    await engine.generate(prompts, config({}));
    const after = (engine as WebgpuEngine).stats;
    expect(after.buffersCreated - before.buffersCreated).toBe(0);
    expect(after.bindGroupsCreated - before.bindGroupsCreated).toBe(0);
    expect(after.pipelinesCreated - before.pipelinesCreated).toBe(0);
    expect(after.submits - before.submits).toBe(after.passes - before.passes + 1); // + prepare's copy of the factors
    expect(after.passes - before.passes).toBeGreaterThan(32); // a tool result is read in one pass
  });

  it("samples at temperature 1 with the trainer's log-probs, each row's draws keyed on its row and position", async () => {
    const s0 = { ...(engine as WebgpuEngine).stats };
    const mine = (await engine.rollouts({ step: 0, steps: 1, prompts: () => prompts, seedOf: () => 3 })).trajs;
    const s1 = (engine as WebgpuEngine).stats;
    expect(mine.filter((t) => t.numToolCalls > 0).length).toBeGreaterThan(4);
    // a pass reads back 8 bytes a row of the batch (token and log-prob), nothing else
    expect(s1.readbackBytes - s0.readbackBytes).toBeLessThanOrEqual(8 * mine.length * (s1.passes - s0.passes));
    // the first prompt's rows alone draw what they drew beside the other 28 (tool turns included)
    const alone = (await engine.rollouts({ step: 0, steps: 1, prompts: () => prompts.slice(0, 1), seedOf: () => 3 })).trajs;
    expect(view(alone)).toEqual(view(mine.slice(0, 4)));
    let worst = 0;
    for (const t of mine) {
      const ids = [...t.promptIds, ...t.completionIds];
      const out = policy.model.tokenLogprobs([ids], [ids.map(() => 1)]).logprobs;
      const lp = ((await out.array()) as number[][])[0];
      out.dispose();
      t.lossMask.forEach((m, k) => {
        if (m === 1) worst = Math.max(worst, Math.abs(t.sampleLogprobs[k] - lp[t.promptIds.length + k]));
      });
    }
    expect(worst).toBeLessThan(1e-4);
  });

  it("draws top-k and top-p from the rows' logits (the host's rank walk): k 1 and a tiny nucleus are greedy", async () => {
    const greedy = view(await engine.generate(prompts.slice(0, 2), config({ samplesPerPrompt: 2 })));
    for (const c of [{ topK: 1 }, { topP: 1e-6 }]) {
      const mine = await engine.generate(prompts.slice(0, 2), config({ ...c, temperature: 0.8, samplesPerPrompt: 2 }));
      expect(view(mine)).toEqual(greedy);
    }
    const wide = await engine.generate(prompts.slice(0, 2), config({ topK: 20, topP: 0.9, temperature: 1.2, samplesPerPrompt: 2 }));
    for (const t of wide) for (const [k, m] of t.lossMask.entries()) if (m === 1) expect(t.sampleLogprobs[k]).toBeLessThanOrEqual(0);
  });

  it("serves the OpenAI server's batches: its greedy tokens are tfjs' forward's", async () => {
    const batcher = new Batcher(policy.model as Qwen2ForCausalLM, policy.tokenizer, { maxQueue: 4, maxBatchRows: 8, batchWaitMs: 0 });
    expect(batcher.decoder).not.toBeNull();
    const ids = encodePrompts(policy.tokenizer, prompts.slice(0, 3), { tools: [], toolsInPrompt: false });
    const params = { temperature: 0, topP: 1, topK: 0, maxTokens: 24, stop: [], stopTokenIds: [], topLogprobs: 0 };
    const got = await batcher.generate({ adapter: null, prompts: ids, n: 1, params });
    // tfjs' forward, greedy, each row until a stop token or 24 tokens
    const stops = stopTokenIds(policy.tokenizer);
    const want: number[][] = ids.map(() => []);
    const ref = new DecodeBatch(policy.model, ids, { pad: policy.tokenizer.padTokenId });
    const live = (r: number) => want[r].length < 24 && !stops.has(want[r][want[r].length - 1]);
    for (;;) {
      const samplers = ref.rows.filter(live);
      if (samplers.length === 0) break;
      const d = await ref.sample(
        ref.rows.flatMap((r, pos) => (live(r) ? [pos] : [])),
        { temperature: 0 },
        new Rng(0),
      );
      samplers.forEach((r, k) => want[r].push(d.tokens[k]));
      if (!ref.rows.some(live)) break;
      ref.step(
        ref.rows.map((r) => want[r][want[r].length - 1]),
        (r) => !live(r),
      );
    }
    ref.dispose();
    expect(got.map((c) => c.tokens.map((t) => t.id))).toEqual(want);
    batcher.decoder!.dispose();
  });

  it("runs at most 10 dispatches a layer, one pass a step, on the trainer's current adapter", async () => {
    const dec = new Decoder(policy.model as Qwen2ForCausalLM);
    dec.prepare(1, 8, 8, true);
    expect(dec.dispatchesPerLayer).toBe(9); // norm + LoRA A, q/k/v, attention, o's A, o, norm + A, gate/up, down's A, down
    dec.prepare(1, 8, 8, false);
    expect(dec.dispatchesPerLayer).toBe(7); // without the adapter: no LoRA A products of o and down (the norms stay)
    // an update to the adapter is what the next generation samples
    const before = await engine.generate(prompts.slice(0, 1), config({ samplesPerPrompt: 1 }));
    const vars = policy.model.trainableVariables().filter((v) => v.name.includes(".lora_B#"));
    const saved = vars.map((v) => tf.clone(v));
    tf.tidy(() => vars.forEach((v, i) => v.assign(tf.randomNormal(v.shape, 0, 0.3, "float32", 100 + i))));
    const local = await rolloutGroups(policy.model, policy.tokenizer, prompts.slice(0, 1), config({ samplesPerPrompt: 1 }));
    const after = await engine.generate(prompts.slice(0, 1), config({ samplesPerPrompt: 1 }));
    vars.forEach((v, i) => v.assign(saved[i]));
    tf.dispose(saved);
    expect(view(after)).toEqual(view(local));
    expect(view(after)).not.toEqual(view(before));
    dec.dispose();
  });
});

describe.skipIf(!gpu)("the compiled decoder on a random 0.5B-shaped model (f32, 2 layers)", () => {
  it("its logits are tfjs' forward's at every step of a decode: groups sharing prompts, rows reading forced tokens, rows ending apart", async () => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    const model = await createModel({ ...BENCH_CONFIGS["0.5b"], numHiddenLayers: 2 }, { seed: 3, quantize: "none" });
    const V = model.config.vocabSize; // 151,936: the head in column blocks on a software adapter
    const prompts = tokenBatch(4, 12, V, 9).flatMap((p) => [p, p, p]); // 4 groups of 3
    const N = prompts.length,
      steps = 12;
    const local = new DecodeBatch(model, prompts, { pad: 0 });
    const dec = new Decoder(model);
    const mine = new CompiledBatch(dec, prompts, { maxNewTokens: steps + 1 });
    let ended = new Set<number>(); // rows 0..3 end at steps 4..7
    let worst = 0,
      compared = 0;
    // teacher-forced: both read tfjs' greedy token (or a forced one); their logits are compared each step
    for (let step = 0; step < steps; step++) {
      const [a, b] = [await local.read(), await mine.read()];
      const feed: number[] = [];
      for (let r = 0; r < N; r++) {
        if (ended.has(r)) {
          feed.push(0);
          continue;
        }
        const at = local.rows.indexOf(r) * V; // tfjs' batch drops finished rows from its cache
        let best = 0,
          mineBest = 0;
        for (let j = 0; j < V; j++) {
          worst = Math.max(worst, Math.abs(a[at + j] - b[r * V + j]));
          if (a[at + j] > a[at + best]) best = j;
          if (b[r * V + j] > b[r * V + mineBest]) mineBest = j;
        }
        // the greedy tokens agree unless two logits tie within float32 rounding
        if (mineBest !== best) expect(Math.abs(a[at + best] - a[at + mineBest])).toBeLessThan(1e-5);
        compared++;
        feed.push((step + r) % 5 === 0 ? (best * 7 + r) % V : best); // now and then a forced token
      }
      ended = new Set([...ended, ...[0, 1, 2, 3].filter((r) => step === 4 + r)]);
      local.step(
        local.rows.map((r) => feed[r]),
        (r) => ended.has(r),
      );
      mine.step(feed, (r) => ended.has(r));
    }
    expect(compared).toBeGreaterThan(100);
    expect(worst).toBeLessThan(1e-4);
    expect(dec.dispatchesPerLayer).toBe(7);
    local.dispose();
    mine.dispose();
    dec.dispose();
    model.dispose();
  }, 600_000); // minutes on a software adapter: 152k-column heads
});

describe.skipIf(!gpu)("GRPO on --backend webgpu (the compiled decoder by default)", () => {
  it("trains, its sampled log-probs within 1e-4 of the trainer's at every step (engine_logprob_gap)", async () => {
    const out = await fs.mkdtemp(path.join(os.tmpdir(), "webgpu-grpo-"));
    try {
      const { steps, metrics: m } = await engineGrpoRun(out, { backend: "webgpu", max_new_tokens: 48 });
      expect(steps).toBe(2);
      for (const x of m) {
        expect(x.engine_logprob_gap).toBeLessThan(1e-4); // logged only by an engine with its own log-probs: the decoder
        expect(x.tis_clipped_fraction).toBe(0);
      }
      expect(m[1].grad_norm).toBeGreaterThan(0);
    } finally {
      await fs.rm(out, { recursive: true, force: true });
    }
  });
});
