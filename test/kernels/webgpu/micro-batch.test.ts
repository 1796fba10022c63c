/** `--micro_batch_size auto` on webgpu: the model sizes micro-batches from the device's memory (the
 *  software adapter's is the host's: the whole batch here), the update equals one rollout at a time,
 *  and an out-of-memory error in the step's first micro-step (a real one: a buffer the adapter cannot
 *  allocate) halves the micro-batch until it fits, with the same update and no tensor left behind. */
import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../../src/kernels/backend.ts";
import { deviceOutOfMemory } from "../../../src/kernels/webgpu/device.ts";
import { loadModel } from "../../../src/model/load.ts";
import type { Qwen2ForCausalLM } from "../../../src/model/qwen2.ts";
import { LORA_TARGETS, type LoraConfig } from "../../../src/model/types.ts";
import { grpoStep, type GrpoConfig, type GrpoRollout } from "../../../src/trainer/grpo.ts";
import { AdamW } from "../../../src/trainer/optimizer.ts";
import { webgpuForTests } from "./helpers/adapter.ts";

const gpu = await webgpuForTests();
const FIX = "test/fixtures/qwen2-tiny";
const lora: LoraConfig = { r: 4, alpha: 8, dropout: 0, targetModules: [...LORA_TARGETS] };

const rollouts: GrpoRollout[] = [
  { ids: [5, 6, 7, 100, 101, 102, 103], lossMask: [0, 0, 0, 1, 1, 1, 1], group: 0, advantage: 1 },
  { ids: [5, 6, 7, 110, 111], lossMask: [0, 0, 0, 1, 1], group: 0, advantage: -0.5 },
  { ids: [5, 6, 7, 120, 9, 121], lossMask: [0, 0, 0, 1, 0, 1], group: 0, advantage: 0.7 },
  { ids: [8, 9, 130, 131], lossMask: [0, 0, 1, 1], group: 1, advantage: -1.2 },
  { ids: [8, 9, 140], lossMask: [0, 0, 1], group: 1, advantage: 0.3 },
  { ids: [8, 9, 150, 151, 152], lossMask: [0, 0, 1, 1, 1], group: 1, advantage: -0.3 },
];
const cfg: GrpoConfig = {
  beta: 0.04,
  epsilon: 0.2,
  epsilonHigh: 0.28,
  lossType: "grpo",
  maxNewTokens: 6,
  numIterations: 1,
  maxGradNorm: 1,
  lr: 2e-2,
  microBatchSize: 1,
};

/** A buffer larger than the software adapter can allocate: Vulkan's out-of-device-memory. */
function allocateTooMuch(): void {
  const device = (tf.backend() as unknown as { device: GPUDevice }).device;
  device.createBuffer({ size: device.limits.maxBufferSize, usage: GPUBufferUsage.STORAGE }).destroy();
}

async function step(microBatchSize: GrpoConfig["microBatchSize"], failAbove = Infinity) {
  const m = (await loadModel(FIX, { lora, quantize: "nf4", seed: 3 })) as Qwen2ForCausalLM;
  const training: number[] = [];
  const own = m.tokenLogprobs.bind(m);
  m.tokenLogprobs = (ids, mask, opts) => {
    if (opts?.training) {
      training.push(ids.length);
      if (ids.length > failAbove) allocateTooMuch();
    }
    return own(ids, mask, opts);
  };
  const opt = new AdamW(m.trainableVariables(), { lr: 2e-2, weightDecay: 0, eps: 1e-3 });
  const n0 = tf.memory().numTensors;
  const stats = await grpoStep(m, opt, rollouts, { ...cfg, microBatchSize });
  const leaked = tf.memory().numTensors - n0;
  const after = await Promise.all(m.trainableVariables().map(async (v) => Float32Array.from((await v.data()) as Float32Array)));
  opt.dispose();
  m.dispose();
  return { stats, after, training, leaked };
}

const maxDiff = (a: Float32Array[], b: Float32Array[]) => Math.max(...a.map((x, i) => Math.max(...x.map((v, j) => Math.abs(v - b[i][j])))));

describe.skipIf(!gpu)("--micro_batch_size auto on webgpu", () => {
  it("deviceOutOfMemory tells a real out-of-memory error from none", async () => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    expect(await deviceOutOfMemory(async () => allocateTooMuch())).toBe(true);
    expect(await deviceOutOfMemory(async () => void tf.tidy(() => tf.add(tf.ones([4]), 1).dataSync()))).toBe(false);
    await expect(deviceOutOfMemory(async () => Promise.reject(new Error("not memory")))).rejects.toThrow("not memory");
  });

  it("takes the whole batch where it fits, with the update of one rollout at a time", async () => {
    const one = await step(1);
    const auto = await step("auto");
    expect(one.stats.microBatch).toEqual({ count: 6, rows: 1, outOfMemory: 0 });
    expect(auto.stats.microBatch).toEqual({ count: 1, rows: 6, outOfMemory: 0 });
    expect(auto.training).toEqual([6]);
    expect(Math.abs(auto.stats.loss - one.stats.loss)).toBeLessThan(1e-5);
    expect(Math.abs(auto.stats.gradNorm - one.stats.gradNorm) / one.stats.gradNorm).toBeLessThan(1e-4);
    expect(maxDiff(auto.after, one.after)).toBeLessThan(1e-5);
    expect(auto.leaked).toBe(0);
  });

  it("halves the micro-batch after an out-of-memory error in its first micro-step, with the same update", async () => {
    const one = await step(1);
    const auto = await step("auto", 2);
    // 6 rows failed, then 3, then 1 row at a time fit (a cap of ⌊rows/2⌋ × the longest row's tokens)
    expect(auto.training).toEqual([6, 3, 1, 1, 1, 1, 1, 1]);
    expect(auto.stats.microBatch).toEqual({ count: 6, rows: 1, outOfMemory: 2 }); // 6 rows ran out, then 3
    expect(maxDiff(auto.after, one.after)).toBeLessThan(1e-5);
    expect(auto.leaked).toBe(0);
  });
});
