/** The head's token log-probs (head-logprobs.ts) against the plain op form, value and input gradient,
 *  for each way a head is held on wasm: frozen [hidden, vocab] (f32 and NF4), frozen [vocab, hidden]
 *  (large f32 models) and trainable (full mode, whose weight gradient is checked too); one chunk and
 *  several. A frozen head on a tape forms its input gradient in the forward pass, so these also pin
 *  that the backward pass scales it by each row's dy. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { logpEntropyOps } from "../../src/kernels/logprob.ts";
import { headLogprobs } from "../../src/model/head-logprobs.ts";
import { BaseWeight } from "../../src/model/weight.ts";
import { stopGradient } from "../../src/trainer/grads.ts";
import { Rng } from "../../src/util/rng.ts";

const H = 24,
  V = 512,
  N = 11;
const rng = new Rng(5);
const randn = (n: number, scale: number) => Float32Array.from({ length: n }, () => scale * rng.normal());
const data = randn(H * V, 0.3); // [H, V]
const hData = randn(N * H, 1);
const targets = Array.from({ length: N }, (_, i) => (i * 97 + 5) % V);
const dyData = Float32Array.from({ length: N }, (_, i) => (i % 3) - 1.3 + 0.1 * i); // per-row weights of log p

/** Σ dy ⊙ log p + Σ entropy, and its gradients with respect to h (and w when trainable); entropy
 *  carries no gradient in the model's form, so the reference stops it. */
function lossOf(f: (h: tf.Tensor2D) => tf.Tensor2D, h: tf.Tensor2D, dy: tf.Tensor1D, stopEntropy: boolean): tf.Scalar {
  const both = f(h);
  const lp = tf.squeeze(tf.slice(both, [0, 0], [N, 1]), [1]);
  let ent = tf.squeeze(tf.slice(both, [0, 1], [N, 1]), [1]);
  if (stopEntropy) ent = stopGradient(ent) as tf.Tensor1D;
  return tf.add(tf.sum(tf.mul(lp, dy)), tf.sum(ent)) as tf.Scalar;
}

/** got within 2e-5 of want, relative to want's largest magnitude (which is not small). */
async function expectClose(got: tf.Tensor, want: tf.Tensor) {
  const a = (await got.data()) as Float32Array,
    b = (await want.data()) as Float32Array;
  let worst = 0,
    scale = 0;
  b.forEach((v, i) => {
    worst = Math.max(worst, Math.abs(a[i] - v));
    scale = Math.max(scale, Math.abs(v));
  });
  expect(scale).toBeGreaterThan(0.1);
  expect(worst / scale).toBeLessThanOrEqual(2e-5);
}

async function compare(head: BaseWeight, dense: Float32Array, chunkRows: number | undefined) {
  const h = tf.tensor2d(hData, [N, H]),
    dy = tf.tensor1d(dyData),
    w = tf.tensor2d(dense, [H, V]);
  const before = tf.memory().numTensors;
  const got = tf.tidy(() => {
    const g = tf.grad((x: tf.Tensor) => lossOf((hh) => headLogprobs(head, hh, targets, V, chunkRows), x as tf.Tensor2D, dy, false))(h);
    return [headLogprobs(head, h, targets, V, chunkRows), g];
  });
  expect(tf.memory().numTensors).toBe(before + 2); // nothing else survives
  const want = tf.tidy(() => {
    const ref = (hh: tf.Tensor2D) => logpEntropyOps(tf.matMul(hh, w), targets);
    return [ref(h), tf.grad((x: tf.Tensor) => lossOf(ref, x as tf.Tensor2D, dy, true))(h)];
  });
  for (let k = 0; k < 2; k++) await expectClose(got[k], want[k]);
  tf.dispose([...got, ...want, h, dy, w]);
}

describe("head log-probs (wasm)", () => {
  beforeAll(async () => {
    await initBackend("wasm");
  });

  for (const chunkRows of [undefined, 4]) {
    const label = chunkRows ? `chunks of ${chunkRows} rows` : "one chunk";
    it(`frozen f32 [hidden, vocab], ${label}: value and input gradient match the op form`, async () => {
      const head = BaseWeight.fromFloat32(data, H, V, "none");
      await compare(head, data, chunkRows);
      head.dispose();
    });

    it(`frozen NF4, ${label}: the same against its dequantized values`, async () => {
      const head = BaseWeight.fromFloat32(data, H, V, "nf4");
      const dq = tf.tidy(() => head.value());
      const dense = (await dq.data()) as Float32Array;
      dq.dispose();
      await compare(head, dense, chunkRows);
      head.dispose();
    });

    it(`frozen [vocab, hidden] (large models), ${label}`, async () => {
      const outIn = new Float32Array(H * V);
      for (let i = 0; i < H; i++) for (let j = 0; j < V; j++) outIn[j * H + i] = data[i * V + j];
      const head = BaseWeight.frozenLeft(outIn, H, V);
      await compare(head, data, chunkRows);
      head.dispose();
    });
  }

  it("a trainable head (full mode) gets its weight gradient, over several chunks", async () => {
    const head = BaseWeight.fromFloat32(data, H, V, "none", true, "head-logprobs-w");
    const h = tf.tensor2d(hData, [N, H]),
      dy = tf.tensor1d(dyData),
      w = tf.tensor2d(data, [H, V]);
    const got = tf.variableGrads(
      () => lossOf((hh) => headLogprobs(head, hh, targets, V, 4), h, dy, false),
      [head.f32 as unknown as tf.Variable],
    );
    const want = tf.grad((ww: tf.Tensor) => lossOf((hh) => logpEntropyOps(tf.matMul(hh, ww as tf.Tensor2D), targets), h, dy, true))(w);
    await expectClose(Object.values(got.grads)[0], want);
    tf.dispose([got.value, ...Object.values(got.grads), want, h, dy, w]);
    head.dispose();
  });
});
