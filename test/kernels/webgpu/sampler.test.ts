/** Sampling on webgpu: a draw over the whole vocabulary (the rollouts' default) and greedy run as one
 *  kernel and read B·2 floats per step, with the tokens of the host's id walk on wasm; the other draws
 *  compute each row's candidates on the device and read B·(2 + 2K) floats per step, with the tokens
 *  of the host path's rank walk on wasm, for every option and kind of row, also at Qwen2.5's
 *  vocabulary (151,936 ids: tfjs-webgpu's top-k pads rows to 2^18). */
import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend, registerWasmExtras } from "../../../src/kernels/backend.ts";
import { backendProfile } from "../../../src/kernels/profile.ts";
import { sampleTokens, type SampleOptions, type SampleResult, type SamplingParams } from "../../../src/rollout/sampler.ts";
import { Rng } from "../../../src/util/rng.ts";
import {
  countReads,
  drawSteps,
  expectCandidateReads,
  expectSameDraws,
  PARAM_SETS,
  RANK_REFERENCE,
  structuredLogits,
} from "../../rollout/helpers/sampler-suite.ts";
import { webgpuForTests } from "./helpers/adapter.ts";

const gpu = await webgpuForTests();

/** The host path's draws on wasm for the same logits and seed (rank walk unless told). */
async function onWasm(
  data: Float32Array,
  shape: [number, number],
  params: SamplingParams,
  steps: number,
  opts: SampleOptions = RANK_REFERENCE,
): Promise<SampleResult[]> {
  await tf.setBackend("wasm");
  const logits = tf.tensor2d(data, shape);
  try {
    return await drawSteps(logits, params, opts, steps);
  } finally {
    logits.dispose();
    await tf.setBackend("webgpu");
  }
}

/** Where token `tok` lies in a row's id-ordered cumulative mass of softmax(row / T), as a share of
 *  the whole [lo, hi), and its log-prob: float64, the host walk's weights. */
function idWalkWindow(row: Float32Array, T: number, tok: number): { lo: number; hi: number; logprob: number } {
  let max = -Infinity;
  for (const x of row) if (x > max) max = x;
  const e = Array.from(row, (x) => {
    const z = (x - max) / T;
    return z > -40 ? Math.exp(z) : 0;
  });
  const sum = e.reduce((a, x) => a + x, 0);
  let lo = 0;
  for (let j = 0; j < tok; j++) lo += e[j];
  return { lo: lo / sum, hi: (lo + e[tok]) / sum, logprob: (row[tok] - max) / T - Math.log(sum) };
}

describe.skipIf(!gpu)("sampling on webgpu", () => {
  it("draws from device candidates when asked (its default for top-k and top-p), with the host rank walk's tokens on wasm", async () => {
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

  it("draws over the whole vocabulary with one kernel by default: the id walk's draws, B·2 floats read", async () => {
    let same = 0,
      all = 0;
    for (const [B, V] of [
      [12, 3000],
      [12, 151936],
    ]) {
      const data = structuredLogits(B, V, 9);
      data[3 * V + 11] = NaN; // a NaN among finite logits is passed over, as the host walk does
      const logits = tf.tensor2d(data, [B, V]);
      const n0 = tf.memory().numTensors;
      for (const params of [{ temperature: 1 }, { temperature: 0.7 }, { temperature: 1.3 }]) {
        const { value: device, sizes } = await countReads(() => drawSteps(logits, params, {}, 3));
        expect(sizes, `V ${V}`).toEqual([2 * B, 2 * B, 2 * B]); // nothing but the kernel's output crosses
        expect(device[0].readFloats).toBe(2 * B);
        const host = await onWasm(data, [B, V], params, 3, { onDevice: false }); // the id walk in float64
        const rng = new Rng(17); // drawSteps' stream: B uniforms a step
        device.forEach((d, s) =>
          d.tokens.forEach((tok, b) => {
            const u = rng.next();
            const w = idWalkWindow(data.subarray(b * V, (b + 1) * V), params.temperature, tok);
            const at = `V ${V} T ${params.temperature} step ${s} row ${b}`;
            // an inverse-CDF draw: u within the token's share of the id-ordered cumulative mass, up to
            // float32 rounding of the sums (the host's own token when u is not at a boundary)
            expect(u, at).toBeGreaterThanOrEqual(w.lo - 1e-6);
            expect(u, at).toBeLessThan(w.hi + 1e-6);
            expect(Math.abs(d.logprobs[b] - w.logprob), at).toBeLessThan(1e-5);
            same += Number(tok === host[s].tokens[b]);
            all++;
          }),
        );
      }
      expect(tf.memory().numTensors).toBe(n0);
      logits.dispose();
    }
    expect(same / all).toBeGreaterThan(0.97); // the host's tokens, but for draws at a boundary
  });

  it("greedy is one kernel too: wasm's argmax (lowest id among equal largest logits), B·2 floats read", async () => {
    for (const [B, V] of [
      [12, 3000],
      [12, 151936],
    ]) {
      const data = structuredLogits(B, V, 4); // rows 3 and 9 hold two equal maxima
      data[5 * V + 2] = NaN; // passed over, as the host's argmax does
      const logits = tf.tensor2d(data, [B, V]);
      const { value: device, sizes } = await countReads(() => drawSteps(logits, { temperature: 0 }, {}, 1));
      expect(sizes, `V ${V}`).toEqual([2 * B]);
      expect(device[0].logprobs).toEqual(new Array(B).fill(0));
      const host = await onWasm(data, [B, V], { temperature: 0 }, 1, { onDevice: false });
      expect(device[0].tokens, `V ${V}`).toEqual(host[0].tokens);
      logits.dispose();
    }
    const ties = tf.tensor2d([1, 3, 3, 0, 5, 1, 1, 5, -2, -1, -3, -1.5], [3, 4]);
    expect((await sampleTokens(ties, { temperature: 0 }, new Rng(0))).tokens).toEqual([1, 0, 1]);
    ties.dispose();
  });

  it("a row without a finite largest logit is the host's one-line error on the kernel path too", async () => {
    const logits = tf.tensor2d([0, 1, 2, Infinity, NaN, NaN, NaN, NaN], [2, 4]);
    await expect(sampleTokens(logits, { temperature: 1 }, new Rng(0))).rejects.toThrow(/largest logit of a sampled row/);
    await expect(sampleTokens(logits, { temperature: 0 }, new Rng(0))).rejects.toThrow(/largest logit of a sampled row/);
    logits.dispose();
  });

  it("reads B·(2 + 2K) floats per step, plus whole rows only where the candidates cannot decide", async () => {
    await expectCandidateReads(4, 5000);
  });
});
