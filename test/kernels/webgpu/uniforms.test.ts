/** Dispatch uniforms written as one arena per submit (webgpu/uniforms.ts): tfjs' struct layout, and
 *  results right across more dispatches than the arena holds between two submits (it submits when
 *  full) and across reads (which submit); a pipeline's bind group layout asked for once
 *  (webgpu/device.ts). */
import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../../src/kernels/backend.ts";
import { uniformLayout } from "../../../src/kernels/webgpu/uniforms.ts";
import { webgpuTraffic } from "../../../src/kernels/webgpu/device.ts";
import { webgpuForTests } from "./helpers/adapter.ts";

const gpu = await webgpuForTests();

describe("uniform layout (tfjs' makeUniforms)", () => {
  it("aligns scalars to 4, pairs to 8, 3 to 6 values to 16, and what follows 5 or 6 values to 16", () => {
    const u = (n: number) => ({ type: "int32", data: Array.from({ length: n }, () => 0) });
    // NAN, INFINITY (f32 each), a 4-D shape, its 3 strides, a 2-D shape, a 5-D shape, then a scalar
    expect(uniformLayout([u(1), u(1), u(4), u(3), u(2), u(5), u(1)])).toEqual({ offsets: [0, 4, 16, 32, 48, 64, 96], size: 112 });
    expect(uniformLayout([u(1), u(2)])).toEqual({ offsets: [0, 8], size: 16 });
    expect(() => uniformLayout([u(7)])).toThrow(/at most 6/);
  });
});

describe.skipIf(!gpu)("uniforms in one arena per submit (webgpu)", () => {
  it("gives every dispatch its own values across a full arena and across reads", async () => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    const before = tf.env().get("WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE");
    tf.env().set("WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE", 10_000); // no submit but the arena's own
    try {
      // 600 steps of 4 dispatches each, of shapes that change (each a different uniform struct): more
      // than the arena's 256 slots; tensors above tfjs' size for running small ops on the CPU
      const n = 1024;
      let x = tf.zeros([n]) as tf.Tensor;
      const t0 = webgpuTraffic().dispatches;
      const seen: number[][] = [];
      for (let i = 1; i <= 600; i++) {
        const y = tf.tidy(() => tf.slice(tf.concat([tf.add(x, i), tf.ones([(i % 7) * 300 + 200])]), [0], [n]));
        x.dispose();
        x = y;
        if (i === 300) seen.push(Array.from(await x.data())); // a read in the middle submits
      }
      expect(webgpuTraffic().dispatches - t0).toBeGreaterThan(1000);
      seen.push(Array.from(await x.data()));
      const t = (k: number) => (k * (k + 1)) / 2;
      expect(seen[0]).toEqual(Array.from({ length: n }, () => t(300)));
      expect(seen[1]).toEqual(Array.from({ length: n }, () => t(600)));
      x.dispose();
    } finally {
      tf.env().set("WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE", before);
    }
  });

  it("answers every dispatch's request for a pipeline's bind group layout with one layout", async () => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    tf.tidy(() => tf.add(tf.ones([4096]), 1)).dispose();
    const pipelines = Object.values((tf.backend() as unknown as { pipelineCache: Record<string, GPUComputePipeline> }).pipelineCache);
    expect(pipelines.length).toBeGreaterThan(0);
    for (const p of pipelines) expect(p.getBindGroupLayout(0)).toBe(p.getBindGroupLayout(0));
  });
});
