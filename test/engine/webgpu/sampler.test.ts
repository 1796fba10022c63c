/** Sampling on webgpu: the default path there computes each row's candidates on the device and reads
 *  B·(2 + 2K) floats per step; its tokens for a seed are those of the host path's rank walk on wasm (not the wasm default's,
 *  which walks ids), for every option
 *  and kind of row, also at Qwen2.5's vocabulary (151,936 ids: tfjs-webgpu's top-k pads rows to 2^18). */
import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend, registerWasmExtras } from "../../../src/engine/backend.ts";
import { backendProfile } from "../../../src/engine/profile.ts";
import type { SampleResult, SamplingParams } from "../../../src/rollout/sampler.ts";
import {
  drawSteps,
  expectCandidateReads,
  expectSameDraws,
  PARAM_SETS,
  RANK_REFERENCE,
  structuredLogits,
} from "../../rollout/sampler-suite.ts";
import { webgpuForTests } from "./adapter.ts";

const gpu = await webgpuForTests();

/** The host path's rank-walk draws on wasm for the same logits and seed. */
async function onWasm(data: Float32Array, shape: [number, number], params: SamplingParams, steps: number): Promise<SampleResult[]> {
  await tf.setBackend("wasm");
  const logits = tf.tensor2d(data, shape);
  try {
    return await drawSteps(logits, params, RANK_REFERENCE, steps);
  } finally {
    logits.dispose();
    await tf.setBackend("webgpu");
  }
}

describe.skipIf(!gpu)("sampling on webgpu", () => {
  it("draws from device candidates by default, with the host rank walk's tokens on wasm", async () => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    registerWasmExtras();
    expect(backendProfile().deviceSampling).toBe(true);
    const B = 12,
      V = 3000;
    const data = structuredLogits(B, V);
    const logits = tf.tensor2d(data, [B, V]);
    const n0 = tf.memory().numTensors;
    for (const params of PARAM_SETS) {
      const device = await drawSteps(logits, params, { onDevice: true });
      expectSameDraws(device, await onWasm(data, [B, V], params, 3), `webgpu ${JSON.stringify(params)}`);
      expect(device[0].readFloats).toBeLessThan(B * V);
    }
    expect(tf.memory().numTensors).toBe(n0);
    logits.dispose();
  });

  it("at Qwen2.5's vocabulary too", async () => {
    const B = 6,
      V = 151936;
    const data = structuredLogits(B, V, 5);
    const logits = tf.tensor2d(data, [B, V]);
    for (const params of [{ temperature: 0 }, { temperature: 1 }, { temperature: 0.7, topK: 50, topP: 0.9 }]) {
      const device = await drawSteps(logits, params, { onDevice: true }, 2);
      expectSameDraws(device, await onWasm(data, [B, V], params, 2), `V ${V} ${JSON.stringify(params)}`);
    }
    logits.dispose();
  });

  it("reads B·(2 + 2K) floats per step, plus whole rows only where the candidates cannot decide", async () => {
    await expectCandidateReads(4, 5000);
  });
});
