/** Training and generation on webgpu equal wasm's: one SFT step (int8 base) and one GRPO step (NF4
 *  base) from the same fresh LoRA give the same losses and the same updated adapter; int8/NF4
 *  forwards give the same logits; a decode loop with sampling and a training step leave the tensor
 *  count where it was; the tiny preset's model answers the README's chat question (NF4, greedy, with
 *  the calculator) with wasm's very tokens. Tiny shapes: the software adapter is slow. */
import { afterAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend, registerWasmExtras } from "../../../src/kernels/backend.ts";
import { loadModel } from "../../../src/model/load.ts";
import type { Qwen2ForCausalLM } from "../../../src/model/qwen2.ts";
import { LORA_TARGETS, type LoraConfig, type Quantize } from "../../../src/model/types.ts";
import { calculatorTool, shutdownCalculator } from "../../../src/agents/calculator.ts";
import { toPrompt } from "../../../src/agents/prompts.ts";
import { loadTokenizerFromDir } from "../../../src/model/tokenizer.ts";
import { TINY_BASE_DIR } from "../../../src/presets/tiny.ts";
import { rolloutGroups } from "../../../src/rollout/rollout.ts";
import { sampleTokens } from "../../../src/rollout/sampler.ts";
import { groupAdvantages } from "../../../src/trainer/advantages.ts";
import { rightPad } from "../../../src/trainer/batch.ts";
import { grpoStep, type GrpoConfig, type GrpoRollout } from "../../../src/trainer/grpo.ts";
import { AdamW } from "../../../src/trainer/optimizer.ts";
import { sftStep } from "../../../src/trainer/sft.ts";
import { Rng } from "../../../src/util/rng.ts";
import { webgpuForTests } from "./helpers/adapter.ts";

const gpu = await webgpuForTests();
const FIX = "test/fixtures/qwen2-tiny";
const fresh: LoraConfig = { r: 4, alpha: 8, dropout: 0, targetModules: [...LORA_TARGETS] };

/** Run f with `backend` current (both registered in this process), then switch back to webgpu. */
async function on<T>(backend: "wasm" | "webgpu", f: () => Promise<T>): Promise<T> {
  await tf.setBackend(backend);
  try {
    return await f();
  } finally {
    await tf.setBackend("webgpu");
  }
}

async function adapterValues(m: Qwen2ForCausalLM): Promise<Float32Array[]> {
  const out: Float32Array[] = [];
  for (const v of m.trainableVariables()) out.push(Float32Array.from((await v.data()) as Float32Array));
  return out;
}

function maxDiff(a: Float32Array[], b: Float32Array[]): number {
  let m = 0;
  a.forEach((x, i) => x.forEach((v, j) => (m = Math.max(m, Math.abs(v - b[i][j])))));
  return m;
}

/** One SFT step then one GRPO step on a fresh LoRA: losses, stats and the adapter after each. */
async function trainSteps(quantize: Quantize) {
  const m = await loadModel(FIX, { lora: fresh, quantize, seed: 1 });
  // Adam's first steps move each weight by ≈ lr·g/(|g| + eps): with the default eps 1e-8 a gradient
  // of ~1e-8 (float noise between backends) moves it by a sizable part of lr either way. eps 1e-3
  // keeps the update a smooth function of the gradient, so equal gradients give equal adapters.
  const opt = new AdamW(m.trainableVariables(), { lr: 2e-2, weightDecay: 0, eps: 1e-3 });
  const n0 = tf.memory().numTensors;
  const batch = rightPad(
    [
      [10, 20, 30, 40, 50, 60, 70],
      [11, 21, 31, 41],
    ],
    [
      [0, 0, 1, 1, 1, 1, 1],
      [0, 1, 1, 1],
    ],
    0,
  );
  const sft = await sftStep(m, opt, [batch], { maxGradNorm: 1, lr: 2e-2 });
  const afterSft = await adapterValues(m);
  const adv = groupAdvantages([[1, 0, 0]], "group");
  // Fixed rollouts, not sampled: the backends' samplers walk different orders (webgpu ranks, wasm ids)
  // and would draw other tokens for a seed; this compares the update alone.
  const rollouts: GrpoRollout[] = [
    { ids: [5, 6, 7, 100, 101, 102], lossMask: [0, 0, 0, 1, 1, 1] },
    { ids: [5, 6, 7, 110, 111], lossMask: [0, 0, 0, 1, 1] },
    { ids: [5, 6, 7, 120, 9, 121], lossMask: [0, 0, 0, 1, 0, 1] },
  ].map((r, i) => ({ ...r, group: 0, advantage: adv[0][i] }));
  const cfg: GrpoConfig = {
    beta: 0.04,
    epsilon: 0.2,
    epsilonHigh: 0.28,
    lossType: "grpo",
    maxNewTokens: 6,
    numIterations: 1,
    maxGradNorm: 1,
    lr: 2e-2,
    microBatchSize: 3,
  };
  const grpo = await grpoStep(m, opt, rollouts, cfg);
  const afterGrpo = await adapterValues(m);
  const leaked = tf.memory().numTensors - n0;
  opt.dispose();
  m.dispose();
  return { sft, grpo, afterSft, afterGrpo, leaked };
}

describe.skipIf(!gpu)("webgpu equals wasm (qwen2-tiny)", () => {
  it("int8 and NF4 forwards give wasm's logits", async () => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    registerWasmExtras();
    const ids = [
        [3, 17, 42, 99, 7],
        [0, 0, 5, 6, 8],
      ],
      mask = [
        [1, 1, 1, 1, 1],
        [0, 0, 1, 1, 1],
      ];
    for (const quantize of ["int8", "nf4"] as const) {
      const logits = async () => {
        const m = await loadModel(FIX, { quantize });
        const l = m.forward(ids, mask);
        const v = (await l.data()) as Float32Array;
        tf.dispose(l);
        m.dispose();
        return v;
      };
      const want = await on("wasm", logits),
        got = await logits();
      expect(maxDiff([got], [want]), quantize).toBeLessThanOrEqual(1e-4);
    }
  });

  it("one SFT step then one GRPO step (int8 and NF4 bases, fresh LoRA) match wasm: losses, stats, adapter", async () => {
    for (const quantize of ["int8", "nf4"] as const) {
      const want = await on("wasm", () => trainSteps(quantize));
      const got = await trainSteps(quantize);
      expect(got.leaked, "tensors left over on webgpu").toBe(0);
      expect(Math.abs(got.sft.loss - want.sft.loss)).toBeLessThanOrEqual(1e-5 * Math.max(1, Math.abs(want.sft.loss)));
      expect(Math.abs(got.sft.gradNorm - want.sft.gradNorm)).toBeLessThanOrEqual(1e-4 * Math.max(1, want.sft.gradNorm));
      expect(maxDiff(got.afterSft, want.afterSft), `${quantize} adapter after SFT`).toBeLessThanOrEqual(1e-5);
      for (const k of ["loss", "kl", "gradNorm", "entropy", "tokens"] as const)
        expect(Math.abs(got.grpo[k] - want.grpo[k]), `${quantize} GRPO ${k}`).toBeLessThanOrEqual(
          1e-4 * Math.max(1, Math.abs(want.grpo[k])),
        );
      expect(maxDiff(got.afterGrpo, want.afterGrpo), `${quantize} adapter after GRPO`).toBeLessThanOrEqual(1e-5);
    }
  });

  it("a sampled decode loop (NF4 base unpacked, candidates sampled on the device) leaves no tensors behind", async () => {
    const m = await loadModel(FIX, { quantize: "nf4", lora: fresh, seed: 3 });
    const release = m.unpackBase();
    const n0 = tf.memory().numTensors;
    const rng = new Rng(7);
    const prompt = [
      [1, 2, 3, 4],
      [0, 5, 6, 7],
    ];
    const { logits, cache } = m.prefill(prompt, [
      [1, 1, 1, 1],
      [0, 1, 1, 1],
    ]);
    let lg = logits;
    for (let s = 0; s < 6; s++) {
      const { tokens } = await sampleTokens(lg, { temperature: 1, topP: 0.9 }, rng);
      lg.dispose();
      lg = m.decodeStep(tokens, cache);
    }
    lg.dispose();
    cache.dispose();
    expect(tf.memory().numTensors).toBe(n0);
    release();
    m.dispose();
  });

  it(
    "the tiny preset's model answers the README question as on wasm (NF4 unpacked, greedy, calculator)",
    { timeout: 600_000 },
    async () => {
      const question = "Ava has 123 pencils and buys 456 more. How many pencils does Ava have now?";
      const tokenizer = await loadTokenizerFromDir(TINY_BASE_DIR);
      const answer = async () => {
        const m = await loadModel(TINY_BASE_DIR, { quantize: "nf4" });
        const release = m.unpackBase();
        const [t] = await rolloutGroups(m, tokenizer, [toPrompt(question)], {
          samplesPerPrompt: 1,
          maxNewTokens: 40,
          maxTurns: 3,
          temperature: 0,
          topP: 1,
          topK: 0,
          rng: new Rng(0),
          tools: [calculatorTool],
          toolsInPrompt: false,
        });
        release();
        m.dispose();
        return t;
      };
      const want = await on("wasm", answer);
      const got = await answer();
      expect(got.completionIds).toEqual(want.completionIds);
      expect(got.finalText).toBe(want.finalText);
      console.log(`tiny base on webgpu: ${JSON.stringify(tokenizer.decode(got.completionIds).slice(0, 160))}`);
    },
  );
});

afterAll(() => shutdownCalculator());
