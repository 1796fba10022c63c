/** The bench's grpo_step workload (scripts/lib/grpo-shape.ts) on a 1-layer small model: it runs, names
 *  its config with the layer count, and reports rollouts and the update by part. Speed is never asserted. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { benchContext, WORKLOADS } from "../../scripts/lib/bench.ts";
import "../../scripts/lib/grpo-shape.ts";

beforeAll(async () => {
  await initBackend("wasm");
});

describe("bench workload grpo_step", () => {
  it("times one small GRPO step: rollouts with prefill, decode, draws and the step calls apart, the update by part", async () => {
    const ctx = benchContext("small", "nf4", 1, 0, { numHiddenLayers: 1 });
    const n0 = tf.memory().numTensors;
    const [rollouts, update] = await WORKLOADS.find((w) => w.name === "grpo_step")!.run(ctx);
    ctx.dispose();
    expect(tf.memory().numTensors).toBe(n0);
    expect(rollouts).toMatchObject({ workload: "grpo_rollouts", config: "small-1l", quantize: "nf4", batch: 4, tokens: 4 * 8 });
    expect(Object.keys(rollouts.parts!)).toEqual(["prefill", "decode", "sample", "stepCall"]);
    // The step calls and the decode steps' draws are disjoint parts of the decode (each rounded to 0.01 s).
    expect(rollouts.parts!.stepCall + rollouts.parts!.sample).toBeLessThanOrEqual(rollouts.parts!.decode + 0.01);
    expect(update).toMatchObject({ workload: "grpo_update", batch: 4, tokens: 4 * 8 });
    expect(Object.keys(update.parts!).sort()).toEqual(["backward", "forward", "old", "optimizer", "recompute", "reference"]);
    for (const m of [rollouts, update]) {
      expect(m.seconds).toBeGreaterThan(0);
      for (const s of Object.values(m.parts!)) expect(s).toBeGreaterThanOrEqual(0);
    }
  });
});
