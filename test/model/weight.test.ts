/** Frozen base matrices under a gradient tape: an embedding lookup keeps no copy of the matrix on the
 *  tape, and the uncached product for large frozen weights equals tf.matMul without leaking tensors. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { createModel } from "../../src/model/load.ts";
import { mmFrozenLeft } from "../../src/kernels/matmul.ts";
import { BaseWeight } from "../../src/model/weight.ts";
import { Rng } from "../../src/util/rng.ts";

const randn = (n: number, seed: number) => {
  const r = new Rng(seed);
  return Float32Array.from({ length: n }, () => r.normal());
};

describe("frozen base weights (wasm)", () => {
  beforeAll(async () => {
    await initBackend("wasm");
  });

  it("an embedding lookup under a gradient tape holds the looked-up rows, not a copy of the matrix", async () => {
    const H = 32,
      V = 4096,
      matBytes = 4 * H * V;
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
      modelType: "qwen2" as const,
      vocabSize: 96,
      hiddenSize: 32,
      intermediateSize: 48,
      numHiddenLayers: 1,
      numAttentionHeads: 2,
      numKeyValueHeads: 1,
      headDim: 16,
      ropeTheta: 1e4,
      rmsNormEps: 1e-6,
      tieWordEmbeddings: true,
      maxPositionEmbeddings: 64,
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

  it("x · wᵀ for a weight held [out, in] (mmFrozenLeft) matches the plain product, value and input gradient, for few rows and many", async () => {
    for (const M of [5, 70]) {
      const x = tf.tensor2d(randn(M * 50, 2), [M, 50]),
        w = tf.tensor2d(randn(50 * 9, 3), [9, 50]),
        dy = tf.tensor2d(randn(M * 9, 4), [M, 9]);
      const before = tf.memory().numTensors;
      const { value, grads } = tf.tidy(() => {
        const g = tf.grads((xx: tf.Tensor) => tf.sum(tf.mul(mmFrozenLeft(xx as tf.Tensor2D, w), dy)));
        return { value: mmFrozenLeft(x, w), grads: g([x])[0] };
      });
      expect(tf.memory().numTensors).toBe(before + 2);
      const [v, g] = await Promise.all([
        tf.tidy(() => tf.max(tf.abs(tf.sub(value, tf.matMul(x, tf.transpose(w)))))).data(),
        tf.tidy(() => tf.max(tf.abs(tf.sub(grads, tf.matMul(dy, w))))).data(),
      ]);
      expect(v[0], `M ${M}`).toBeLessThanOrEqual(1e-5);
      expect(g[0], `M ${M}`).toBeLessThanOrEqual(1e-5);
      tf.dispose([x, w, dy, value, grads]);
    }
  });

  it("backward (dy · wᵀ) of a weight held [out, in], f32 or quantized and unpacked so, multiplies it as held: no transpose, the product's bits", async () => {
    const inDim = 40,
      outDim = 24,
      data = randn(inDim * outDim, 6); // [in, out]
    const outIn = new Float32Array(outDim * inDim);
    for (let i = 0; i < inDim; i++) for (let o = 0; o < outDim; o++) outIn[o * inDim + i] = data[i * outDim + o];
    const q = BaseWeight.fromFloat32(data, inDim, outDim, "int8");
    q.unpack(true);
    const dy = tf.tensor2d(randn(7 * outDim, 7), [7, outDim]);
    for (const [what, w] of [
      ["f32 [out, in]", BaseWeight.frozenLeft(outIn, inDim, outDim)],
      ["int8 unpacked [out, in]", q],
    ] as const) {
      const before = tf.memory().numTensors;
      let got: tf.Tensor2D | null = null;
      const info = await tf.profile(() => {
        got = tf.tidy(() => w.backward(dy));
      });
      expect(info.kernelNames, what).not.toContain("Transpose");
      const want = tf.tidy(() => tf.matMul(dy, tf.transpose(w.value()))); // [7, out] · [out, in]
      expect(got!.shape).toEqual([7, inDim]);
      expect(Array.from(got!.dataSync()), what).toEqual(Array.from(want.dataSync()));
      tf.dispose([got!, want]);
      expect(tf.memory().numTensors, what).toBe(before);
      w.dispose();
    }
    dy.dispose();
  });
});
