/** The optimizer step on the device (kernels/adamw.ts) equals the tfjs-op step wasm runs, on a few
 *  steps with clipping and weight decay; a non-finite gradient changes nothing; the step is one
 *  dispatch per group of variables and per group of gradients (the norm's), reads back only the norm,
 *  and leaves the tensor count as it was. */
import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend, registerWasmExtras } from "../../../src/kernels/backend.ts";
import { deviceAdamWGroups, hasDeviceAdamW } from "../../../src/kernels/adamw.ts";
import { webgpuTraffic } from "../../../src/kernels/webgpu/device.ts";
import { AdamW } from "../../../src/trainer/optimizer.ts";
import { NonFiniteError } from "../../../src/util/errors.ts";
import { Rng } from "../../../src/util/rng.ts";
import { webgpuForTests } from "./helpers/adapter.ts";

const gpu = await webgpuForTests();

// sizes around the programs' workgroups (256) and groups of eight gradients: 11 variables
const SHAPES = [[3], [256], [257, 3], [16, 688], [1], [64, 16], [5, 7], [300], [2, 2, 2], [16, 128], [1000]];

let uid = 0;
function values(seed: number): Float32Array[] {
  const rng = new Rng(seed);
  return SHAPES.map((s) => Float32Array.from({ length: s.reduce((a, b) => a * b, 1) }, () => 2 * rng.next() - 1));
}

/** Three steps of AdamW on `backend` from the same weights and gradients: the weights after each. */
async function run(backend: "wasm" | "webgpu", maxGradNorm: number, nanAt = -1) {
  await tf.setBackend(backend);
  const vars = values(1).map((v, i) => tf.variable(tf.tensor(v, SHAPES[i]), true, `adam_dev_${backend}_${uid++}`));
  const opt = new AdamW(vars, { lr: 0.05, weightDecay: 0.01 });
  const after: Float32Array[][] = [];
  const norms: number[] = [];
  for (let step = 0; step < 3; step++) {
    const g = values(10 + step).map((v, i) =>
      tf.tensor(
        v.map((x) => x * (i + 1) * (step + 1)),
        SHAPES[i],
      ),
    );
    if (step === nanAt) g[4] = tf.tensor([NaN], [1]);
    const named = Object.fromEntries(vars.map((v, i) => [v.name, g[i]]));
    try {
      norms.push((await opt.applyGradients(named, { maxGradNorm })).gradNorm);
    } catch (err) {
      norms.push(err instanceof NonFiniteError ? NaN : Infinity);
    }
    tf.dispose(g);
    after.push(await Promise.all(vars.map(async (v) => Float32Array.from((await v.data()) as Float32Array))));
  }
  const steps = opt.step;
  opt.dispose();
  tf.dispose(vars);
  return { after, norms, steps };
}

function maxRel(a: Float32Array[], b: Float32Array[]): number {
  let m = 0;
  a.forEach((x, i) => x.forEach((v, j) => (m = Math.max(m, Math.abs(v - b[i][j]) / (1e-3 + Math.abs(b[i][j]))))));
  return m;
}

describe.skipIf(!gpu)("AdamW on the device (webgpu)", () => {
  it("takes the device path on webgpu and gives wasm's op-path update, clipped and not", async () => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    registerWasmExtras();
    expect(hasDeviceAdamW()).toBe(true);
    for (const clip of [0, 1.5]) {
      const ref = await run("wasm", clip);
      const dev = await run("webgpu", clip);
      dev.norms.forEach((n, i) => expect(Math.abs(n - ref.norms[i]) / ref.norms[i]).toBeLessThan(1e-5));
      for (let s = 0; s < 3; s++) expect(maxRel(dev.after[s], ref.after[s])).toBeLessThan(1e-4);
      expect(dev.steps).toBe(3);
    }
    // the clip is active: the gradient norms are far above 1.5
    expect((await run("webgpu", 0)).norms[0]).toBeGreaterThan(10);
  });

  it("a non-finite gradient norm throws and changes nothing (weights, moments, step count)", async () => {
    const ref = await run("wasm", 1, 1);
    const dev = await run("webgpu", 1, 1);
    expect(dev.norms[1]).toBeNaN();
    expect(dev.steps).toBe(2);
    expect(maxRel(dev.after[1], dev.after[0])).toBe(0);
    expect(maxRel(dev.after[2], ref.after[2])).toBeLessThan(1e-4); // the moments were kept too
  });

  it("is one dispatch per group of variables (and per group of gradients for the norm), reads back only [norm, coefficient], keeps the tensor count", async () => {
    await tf.setBackend("webgpu");
    const vars = values(2).map((v, i) => tf.variable(tf.tensor(v, SHAPES[i]), true, `adam_count_${uid++}`));
    const opt = new AdamW(vars, { lr: 0.01 });
    const grads = Object.fromEntries(vars.map((v, i) => [v.name, tf.tensor(values(3)[i], SHAPES[i])]));
    await opt.applyGradients(grads, { maxGradNorm: 1 }); // compiles the programs
    const n0 = tf.memory().numTensors;
    const t0 = webgpuTraffic();
    await opt.applyGradients(grads, { maxGradNorm: 1 });
    const t1 = webgpuTraffic();
    const dispatches = t1.dispatches - t0.dispatches;
    const g = deviceAdamWGroups()!;
    expect(g.update).toBeGreaterThanOrEqual(3); // the software adapter binds 16 storage buffers a stage
    expect(dispatches).toBe(Math.ceil(vars.length / g.sumSquares) + 1 + Math.ceil(vars.length / g.update));
    expect(dispatches).toBeLessThanOrEqual(10);
    expect(t1.readbackBytes - t0.readbackBytes).toBe(8);
    expect(tf.memory().numTensors).toBe(n0);
    opt.dispose();
    tf.dispose([...vars, ...Object.values(grads)]);
  });
});
