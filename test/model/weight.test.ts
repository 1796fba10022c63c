/** Frozen base matrices under a gradient tape: an embedding lookup keeps no copy of the matrix on the
 *  tape, and the uncached product for large frozen weights equals tf.matMul without leaking tensors. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/backend.ts";
import { createModel } from "../../src/model/load.ts";
import { matMulUncached } from "../../src/model/matmul.ts";
import { BaseWeight } from "../../src/model/weight.ts";
import { Rng } from "../../src/util/rng.ts";

const randn = (n: number, seed: number) => { const r = new Rng(seed); return Float32Array.from({ length: n }, () => r.normal()); };

describe("frozen base weights (wasm)", () => {
  beforeAll(async () => {
    await initBackend("wasm");
  });

  it("an embedding lookup under a gradient tape holds the looked-up rows, not a copy of the matrix", async () => {
    const H = 32, V = 4096, matBytes = 4 * H * V;
    for (const w of [BaseWeight.fromFloat32(randn(H * V, 1), H, V, "none"), BaseWeight.frozenLeft(randn(H * V, 1), H, V)]) {
      const v = tf.variable(tf.ones([5, H]), true, `lookup-scale-${w.left ? "left" : "right"}`);
      const ids = tf.tensor1d([3, 4095, 0, 17, 3], "int32");
      const base = tf.memory().numBytes;
      let held = 0;
      const { value, grads } = tf.variableGrads(() => {
        const x = w.columns(ids); // [5, H]
        held = tf.memory().numBytes - base; // the tape's saved tensors are alive here
        return tf.sum(tf.mul(x, v)) as tf.Scalar;
      }, [v]);
      expect(held).toBeLessThan(matBytes / 4);
      // d/dv sum(x·v) = x: the looked-up columns
      const g = (await grads[v.name].array()) as number[][];
      const all = (await tf.tidy(() => w.value()).array()) as number[][]; // [H, V]
      [3, 4095, 0, 17, 3].forEach((id, r) => g[r].forEach((x, h) => expect(x).toBeCloseTo(all[h][id], 6)));
      tf.dispose([value, grads, v, ids]);
      w.dispose();
    }
  });

  it("random weights made in the left-operand layout give the same logits as the default layout", async () => {
    const cfg = {
      modelType: "qwen2" as const, vocabSize: 96, hiddenSize: 32, intermediateSize: 48, numHiddenLayers: 1, numAttentionHeads: 2,
      numKeyValueHeads: 1, headDim: 16, ropeTheta: 1e4, rmsNormEps: 1e-6, tieWordEmbeddings: true, maxPositionEmbeddings: 64,
    };
    const [a, b] = [await createModel(cfg, { seed: 4 }), await createModel(cfg, { seed: 4, frozenLeft: true })];
    expect(b.weights.layers[0].proj.gate_up_proj.left).not.toBeNull();
    const [la, lb] = [a.forward([[1, 5, 9, 2]]), b.forward([[1, 5, 9, 2]])];
    const d = await tf.tidy(() => tf.max(tf.abs(tf.sub(la, lb)))).data();
    expect(d[0]).toBeLessThan(1e-5);
    tf.dispose([la, lb]);
    a.dispose();
    b.dispose();
  });

  it("matMulUncached equals tf.matMul, frees its slices, and leaks nothing", async () => {
    const a = tf.tensor2d(randn(7 * 50, 2), [7, 50]), w = tf.tensor2d(randn(50 * 9, 3), [50, 9]);
    const want = tf.matMul(a, w);
    const before = tf.memory().numTensors;
    const got = matMulUncached(a, w, 9 * 8); // 8 rows of w per slice: 7 slices, the last one short
    expect(tf.memory().numTensors).toBe(before + 1);
    const d = await tf.tidy(() => tf.max(tf.abs(tf.sub(got, want)))).data();
    expect(d[0]).toBeLessThanOrEqual(1e-5);
    tf.dispose([a, w, want, got]);
  });
});
