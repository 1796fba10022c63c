/** Qwen2.5's vocabulary (151,936) on an adapter whose storage bindings are 128 MiB: an embedding of
 *  hidden 224 is 136 MB, so it is held in column blocks (weight.ts). Without the split the failure is
 *  silent (a Dawn validation error, stale data), so lookups and the head are checked against the host
 *  and wasm. */
import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend, registerWasmExtras } from "../../../src/kernels/backend.ts";
import { createModel } from "../../../src/model/load.ts";
import { backendProfile } from "../../../src/kernels/profile.ts";
import type { Qwen2Config } from "../../../src/model/types.ts";
import { BaseWeight } from "../../../src/model/weight.ts";
import { Rng } from "../../../src/util/rng.ts";
import { webgpuForTests } from "./helpers/adapter.ts";

const gpu = await webgpuForTests();
const V = 151936,
  H = 224;
const CONFIG: Qwen2Config = {
  modelType: "qwen2",
  vocabSize: V,
  hiddenSize: H,
  intermediateSize: 64,
  numHiddenLayers: 1,
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  headDim: 56,
  ropeTheta: 1e6,
  rmsNormEps: 1e-6,
  tieWordEmbeddings: true,
  maxPositionEmbeddings: 1024,
};

describe.skipIf(!gpu)("vocab 151,936 on webgpu", () => {
  // Minutes on a busy 2-core machine: 34 M weights made on the host, uploaded and multiplied in software.
  it("an embedding over the binding limit is split; lookups and head products equal the host's", { timeout: 600_000 }, async () => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    expect(H * V).toBeGreaterThan(backendProfile().maxBindingFloats); // the case this test is about
    const rng = new Rng(1);
    const data = new Float32Array(H * V); // [H, V] = embeddingᵀ; distinct cheap values (34 M of them)
    for (let i = 0; i < data.length; i++) data[i] = (Math.imul(i, 2654435761) >>> 16) / 65536 - 0.5;
    const w = BaseWeight.fromFloat32(data, H, V, "none");
    expect(w.parts!.length).toBeGreaterThanOrEqual(2);
    const per = w.parts![0].shape[1];
    const ids = [0, per - 1, per, V - 1, 7, per + 3];
    const rows = tf.tidy(() => w.columns(tf.tensor1d(ids, "int32"))); // [ids, H]
    const got = (await rows.data()) as Float32Array;
    ids.forEach((id, r) => {
      for (let i = 0; i < H; i++) expect(got[r * H + i]).toBe(data[i * V + id]);
    });
    const x = Float32Array.from({ length: 2 * H }, () => rng.normal() / 16);
    const logits = tf.tidy(() => w.matmul(tf.tensor2d(x, [2, H]))); // [2, V]
    const lg = (await logits.data()) as Float32Array;
    let worst = 0;
    for (let r = 0; r < 2; r++)
      for (let j = 0; j < V; j++) {
        let s = 0;
        for (let i = 0; i < H; i++) s += x[r * H + i] * data[i * V + j];
        worst = Math.max(worst, Math.abs(lg[r * V + j] - s));
      }
    expect(worst).toBeLessThanOrEqual(1e-4);
    tf.dispose([rows, logits]);
    w.dispose();
  });

  it("a tied-head model gives wasm's logits, token log-probs and LoRA gradient norm", { timeout: 600_000 }, async () => {
    registerWasmExtras();
    const ids = [
        [151935, 5, 77000, 151643],
        [0, 0, 90001, 12],
      ],
      mask = [
        [1, 1, 1, 1],
        [0, 0, 1, 1],
      ];
    const run = async () => {
      const m = await createModel(CONFIG, { seed: 4, lora: { r: 2, alpha: 4, dropout: 0, targetModules: ["q_proj", "v_proj"] } });
      // B at 0 would give the LoRA A no gradient: one step of noise makes every gradient non-zero
      for (const v of m.trainableVariables()) v.assign(tf.mul(tf.randomNormal(v.shape, 0, 1, "float32", 9), 0.02));
      const last = tf.tidy(() => tf.slice(m.forward(ids, mask), [0, 3, 0], [2, 1, V]));
      const logits = (await last.data()) as Float32Array;
      const { value, grads } = tf.variableGrads(
        () => tf.neg(tf.sum(m.tokenLogprobs(ids, mask, { training: true }).logprobs)) as tf.Scalar,
        m.trainableVariables(),
      );
      const loss = (await value.data())[0];
      const norm = Math.sqrt((await tf.tidy(() => tf.addN(Object.values(grads).map((g) => tf.sum(tf.square(g))))).data())[0]);
      tf.dispose([last, value, grads]);
      const split = m.weights.embedT.parts?.length ?? 1;
      m.dispose();
      return { logits, loss, norm, split };
    };
    await tf.setBackend("wasm");
    const want = await run();
    await tf.setBackend("webgpu");
    const got = await run();
    expect(want.split).toBe(1);
    expect(got.split).toBeGreaterThanOrEqual(2);
    let worst = 0;
    got.logits.forEach((v, i) => (worst = Math.max(worst, Math.abs(v - want.logits[i]))));
    expect(worst).toBeLessThanOrEqual(1e-4);
    expect(Math.abs(got.loss - want.loss) / Math.abs(want.loss)).toBeLessThanOrEqual(1e-5);
    expect(Math.abs(got.norm - want.norm) / want.norm).toBeLessThanOrEqual(1e-4);
  });
});
