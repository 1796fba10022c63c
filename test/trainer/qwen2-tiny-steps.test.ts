/** The SFT and GRPO steps on the real Qwen2 forward (test/fixtures/qwen2-tiny) with LoRA, on wasm:
 *  golden SFT loss and gradients, LoRA parameters move, the quantized/frozen base does not, no leaks. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { readFileSync } from "node:fs";
import { initBackend } from "../../src/kernels/backend.ts";
import { loadModel } from "../../src/model/load.ts";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { LORA_TARGETS, type LoraConfig } from "../../src/model/types.ts";
import { sftLoss, sftStep } from "../../src/trainer/sft.ts";
import { grpoStep, type GrpoConfig, type GrpoRollout } from "../../src/trainer/grpo.ts";
import { groupAdvantages } from "../../src/trainer/advantages.ts";
import { AdamW } from "../../src/trainer/optimizer.ts";
import { rightPad } from "../../src/trainer/batch.ts";

const FIX = "test/fixtures/qwen2-tiny";
const exp = JSON.parse(readFileSync(`${FIX}/expected.json`, "utf8"));
const fresh: LoraConfig = { r: 4, alpha: 8, dropout: 0, targetModules: [...LORA_TARGETS] };

async function snapshot(vars: tf.Variable[]): Promise<Map<string, Float32Array>> {
  const out = new Map<string, Float32Array>();
  for (const v of vars) out.set(v.name, Float32Array.from((await v.data()) as Float32Array));
  return out;
}
async function baseWeights(m: Qwen2ForCausalLM): Promise<Map<string, Float32Array>> {
  const sd = await m.stateDict();
  return new Map(Object.entries(sd).map(([k, t]) => [k, Float32Array.from(t.data)]));
}
/** The largest |difference| between a snapshot and the variables' values now. */
async function maxDiffFrom(snap: Map<string, Float32Array>, vars: tf.Variable[]): Promise<number> {
  let worst = 0;
  for (const v of vars) {
    const a = snap.get(v.name)!,
      b = (await v.data()) as Float32Array;
    a.forEach((x, i) => (worst = Math.max(worst, Math.abs(x - b[i]))));
  }
  return worst;
}
function sameMaps(a: Map<string, Float32Array>, b: Map<string, Float32Array>): boolean {
  if (a.size !== b.size) return false;
  for (const [k, x] of a) {
    const y = b.get(k);
    if (!y || y.length !== x.length || x.some((v, i) => v !== y[i])) return false;
  }
  return true;
}
function seqLogprob(m: Qwen2ForCausalLM, r: { ids: number[]; lossMask: number[] }): number {
  const lp = m.tokenLogprobs([r.ids], [r.ids.map(() => 1)]).logprobs;
  const v = lp.dataSync();
  lp.dispose();
  return r.lossMask.reduce((s, x, t) => s + (t > 0 && x ? v[t] : 0), 0);
}

beforeAll(async () => {
  await initBackend("wasm");
});

describe("trainer steps on qwen2-tiny (wasm)", () => {
  it("sftLoss and its LoRA gradients match the PyTorch/PEFT golden values", async () => {
    const m = await loadModel(FIX, { adapter: `${FIX}/lora` });
    const { input_ids: ids, attention_mask: mask } = exp.batch as { input_ids: number[][]; attention_mask: number[][] };
    // HF labels with −100 on pads: a token counts when it and the token before it are real.
    const lossMask = mask.map((r) => r.map((x, t) => (t > 0 && x && r[t - 1] ? 1 : 0)));
    const batch = { ids, attentionMask: mask, lossMask };
    const n0 = tf.memory().numTensors;
    const { value, grads } = tf.variableGrads(() => sftLoss(m, batch), m.trainableVariables());
    expect(Math.abs(value.dataSync()[0] - exp.lora.loss) / exp.lora.loss).toBeLessThan(1e-5);
    let worst = 0;
    for (const [name, g] of Object.entries(grads)) {
      const want: number[][] = exp.lora.grads[`${name.replace(/#\d+$/, "")}.weight`]; // torch layout [out, in]; ours is [in, out]
      expect(want, name).toBeDefined();
      const gT = tf.transpose(g);
      const got = (await gT.array()) as number[][];
      gT.dispose();
      const maxAbs = Math.max(...want.flat().map(Math.abs));
      want.forEach((row, i) => row.forEach((w, j) => (worst = Math.max(worst, Math.abs(got[i][j] - w) / maxAbs))));
    }
    expect(Object.keys(grads).length).toBe(Object.keys(exp.lora.grads).length);
    expect(worst).toBeLessThan(1e-3);
    tf.dispose([value, ...Object.values(grads)]);
    expect(tf.memory().numTensors).toBe(n0);
    m.dispose();
  });

  it("SFT with a fresh int8 LoRA: loss falls, LoRA changes, the base does not, no tensor leak", async () => {
    const m = await loadModel(FIX, { lora: fresh, quantize: "int8", seed: 1 });
    const opt = new AdamW(m.trainableVariables(), { lr: 2e-2, weightDecay: 0 });
    const base0 = await baseWeights(m),
      lora0 = await snapshot(m.trainableVariables());
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
    const n0 = tf.memory().numTensors;
    const losses: number[] = [];
    for (let i = 0; i < 6; i++) losses.push((await sftStep(m, opt, [batch], { maxGradNorm: 1, lr: 2e-2 })).loss);
    expect(tf.memory().numTensors).toBe(n0);
    expect(losses[5]).toBeLessThan(losses[0] - 0.5);
    expect(sameMaps(base0, await baseWeights(m))).toBe(true);
    const lora1 = await snapshot(m.trainableVariables());
    expect([...lora1.keys()].every((k) => !sameMaps(new Map([[k, lora0.get(k)!]]), new Map([[k, lora1.get(k)!]])))).toBe(true);
    opt.dispose();
    m.dispose();
  });

  it("GRPO with a fresh nf4 LoRA: KL 0 then > 0, rewarded rollouts gain log-prob, micro-batching changes nothing", async () => {
    const m = await loadModel(FIX, { lora: fresh, quantize: "nf4", seed: 2 });
    const vars = m.trainableVariables();
    const base0 = await baseWeights(m),
      lora0 = await snapshot(vars);
    const adv = groupAdvantages(
      [
        [1, 0, 0],
        [0, 0, 1],
      ],
      "group",
    );
    const shapes = [
      { ids: [5, 6, 7, 100, 101, 102, 103], lossMask: [0, 0, 0, 1, 1, 1, 1] },
      { ids: [5, 6, 7, 110, 111], lossMask: [0, 0, 0, 1, 1] },
      { ids: [5, 6, 7, 120, 121, 9, 9, 122], lossMask: [0, 0, 0, 1, 1, 0, 0, 1] },
      { ids: [8, 9, 130, 131, 132], lossMask: [0, 0, 1, 1, 1] },
      { ids: [8, 9, 140], lossMask: [0, 0, 1] },
      { ids: [8, 9, 150, 151, 152, 153, 154, 155], lossMask: [0, 0, 1, 1, 1, 1, 1, 1] },
    ];
    const rollouts: GrpoRollout[] = shapes.map((s, i) => ({ ...s, group: Math.floor(i / 3), advantage: adv[Math.floor(i / 3)][i % 3] }));
    const cfg: GrpoConfig = {
      beta: 0.04,
      epsilon: 0.2,
      epsilonHigh: 0.28,
      lossType: "grpo",
      maxNewTokens: 8,
      numIterations: 1,
      maxGradNorm: 1,
      lr: 2e-2,
      microBatchSize: 6,
    };

    const before = rollouts.map((r) => seqLogprob(m, r));
    const opt = new AdamW(vars, { lr: 2e-2, weightDecay: 0 });
    const n0 = tf.memory().numTensors;
    const s1 = await grpoStep(m, opt, rollouts, cfg);
    expect(s1.kl).toBe(0); // lora_B starts at 0: policy = reference
    expect(s1.entropy).toBeGreaterThan(0);
    const after = rollouts.map((r) => seqLogprob(m, r));
    rollouts.forEach((r, i) => (r.advantage > 0 ? expect(after[i]).toBeGreaterThan(before[i]) : expect(after[i]).toBeLessThan(before[i])));
    expect(tf.memory().numTensors).toBe(n0);

    // Second step from a saved state, once whole and once in micro-batches of 1: same numbers.
    const lora1 = await snapshot(vars),
      optState = await opt.exportState();
    const s2 = await grpoStep(m, opt, rollouts, cfg);
    expect(s2.kl).toBeGreaterThan(0);
    const lora2 = await snapshot(vars);
    for (const v of vars) tf.tidy(() => v.assign(tf.tensor(lora1.get(v.name)!, v.shape)));
    opt.importState(optState);
    const s2mb = await grpoStep(m, opt, rollouts, { ...cfg, microBatchSize: 1 });
    for (const k of ["loss", "kl", "gradNorm", "entropy", "tokens"] as const)
      expect(Math.abs(s2mb[k] - s2[k])).toBeLessThan(1e-5 * Math.max(1, Math.abs(s2[k])));
    expect(await maxDiffFrom(lora2, vars)).toBeLessThan(1e-5);

    expect(sameMaps(base0, await baseWeights(m))).toBe(true);
    expect(sameMaps(lora0, lora2)).toBe(false);
    expect(tf.memory().numTensors).toBe(n0);
    opt.dispose();
    m.dispose();
  });

  it("log-probs restricted to a mask: the same values and gradients where it is 1, 0 elsewhere, no tensor leak", async () => {
    const m = await loadModel(FIX, { lora: fresh, quantize: "nf4", seed: 4 });
    const vars = m.trainableVariables();
    for (const v of vars) tf.tidy(() => v.assign(tf.randomNormal(v.shape, 0, 0.05, "float32", 7))); // lora_B ≠ 0: gradients reach A too
    const ids = [
        [5, 6, 7, 100, 101, 9, 102, 0],
        [8, 9, 130, 131, 132, 133, 134, 135],
        [5, 6, 7, 8, 9, 10, 11, 12],
      ],
      attention = [
        [1, 1, 1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 1, 1],
      ],
      need = [
        [0, 0, 0, 1, 1, 0, 1, 0], // a tool token (0) inside the span, padding after it
        [1, 0, 1, 1, 1, 1, 1, 1], // position 0 has no log-prob even when marked
        [0, 0, 0, 0, 0, 0, 0, 0], // nothing to score
      ];
    const weights = tf.tensor2d(
      need.map((r) => r.map((x, t) => x * (1 + ((t * 7) % 3)))),
      [3, 8],
    );
    const lossOf = (logprobMask?: number[][]) => () =>
      tf.sum(tf.mul(m.tokenLogprobs(ids, attention, { training: true, logprobMask }).logprobs, weights)) as tf.Scalar;
    const full = tf.variableGrads(lossOf(), vars);
    const n0 = tf.memory().numTensors;
    const part = tf.variableGrads(lossOf(need), vars);
    expect(Math.abs(part.value.dataSync()[0] - full.value.dataSync()[0])).toBeLessThan(1e-5 * Math.abs(full.value.dataSync()[0]));
    for (const v of vars) {
      const a = full.grads[v.name].dataSync(),
        b = part.grads[v.name].dataSync();
      const scale = Math.max(...Array.from(a, Math.abs));
      expect(scale, v.name).toBeGreaterThan(0);
      a.forEach((x, i) => expect(Math.abs(x - b[i]), v.name).toBeLessThan(1e-5 * scale));
    }
    tf.dispose([part.value, part.grads]);
    expect(tf.memory().numTensors).toBe(n0);
    // values: the full pass's where need is 1 (position 0 aside), exactly 0 elsewhere; entropy too
    const lpFull = m.tokenLogprobs(ids, attention, { withEntropy: true });
    const lpPart = m.tokenLogprobs(ids, attention, { withEntropy: true, logprobMask: need });
    const [fa, pa, fe, pe] = [lpFull.logprobs, lpPart.logprobs, lpFull.entropy!, lpPart.entropy!].map((t) => t.arraySync() as number[][]);
    need.forEach((r, b) =>
      r.forEach((x, t) => {
        const on = x === 1 && t > 0;
        expect(pa[b][t]).toBeCloseTo(on ? fa[b][t] : 0, 5);
        expect(pe[b][t]).toBeCloseTo(on ? fe[b][t] : 0, 5);
      }),
    );
    tf.dispose([full.value, full.grads, lpFull.logprobs, lpFull.entropy!, lpPart.logprobs, lpPart.entropy!, weights]);
    expect(() => m.tokenLogprobs(ids, attention, { logprobMask: need.slice(1) })).toThrow(/logprobMask is \[2\]\[8\]; expected \[3\]\[8\]/);
    m.dispose();
  });

  it("GRPO's reference and policy passes score only the loss mask: the same step as scoring every position", async () => {
    const m = await loadModel(FIX, { lora: fresh, quantize: "nf4", seed: 5 });
    const vars = m.trainableVariables();
    const rollouts: GrpoRollout[] = [
      { ids: [5, 6, 7, 100, 101, 102], lossMask: [0, 0, 0, 1, 1, 1], group: 0, advantage: 1 },
      { ids: [5, 6, 7, 120, 121, 9, 9, 122], lossMask: [0, 0, 0, 1, 1, 0, 0, 1], group: 0, advantage: -1 },
      { ids: [8, 9, 130, 131], lossMask: [0, 0, 1, 1], group: 1, advantage: 0.5 },
    ];
    const cfg: GrpoConfig = {
      beta: 0.04,
      epsilon: 0.2,
      epsilonHigh: 0.28,
      lossType: "grpo",
      maxNewTokens: 8,
      numIterations: 2, // the old-policy pass too
      maxGradNorm: 1,
      lr: 2e-2,
      microBatchSize: 2,
    };
    const opt = new AdamW(vars, { lr: 2e-2, weightDecay: 0 });
    await grpoStep(m, opt, rollouts, cfg); // LoRA away from 0: the reference differs from the policy
    const lora1 = await snapshot(vars),
      optState = await opt.exportState();
    const n0 = tf.memory().numTensors;
    const restricted = await grpoStep(m, opt, rollouts, cfg);
    expect(tf.memory().numTensors).toBe(n0);
    const lora2 = await snapshot(vars);
    for (const v of vars) tf.tidy(() => v.assign(tf.tensor(lora1.get(v.name)!, v.shape)));
    opt.importState(optState);
    const scoreAll = m.tokenLogprobs.bind(m);
    m.tokenLogprobs = (i, a, o) => scoreAll(i, a, { ...o, logprobMask: undefined });
    const everywhere = await grpoStep(m, opt, rollouts, cfg);
    expect(restricted.kl).toBeGreaterThan(0);
    for (const k of ["loss", "kl", "gradNorm", "entropy", "ratio", "tokens"] as const)
      expect(Math.abs(restricted[k] - everywhere[k]), k).toBeLessThan(1e-5 * Math.max(1, Math.abs(everywhere[k])));
    expect(await maxDiffFrom(lora2, vars)).toBeLessThan(1e-5);
    opt.dispose();
    m.dispose();
  });
});
