/** Activation checkpointing: gradients equal the recorded-whole ones (LoRA on f32 and nf4 bases, full
 *  training), the tape holds less, "auto" checkpoints only a large tape, dropout falls back to whole layers, no tensors leak, and the
 *  engine's tape survives a gradient computed inside a backward pass. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { checkpoint } from "../../src/kernels/checkpoint.ts";
import { createModel, type ModelOptions } from "../../src/model/load.ts";
import { type Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { layerTapeBytes } from "../../src/model/config.ts";
import { AUTO_CHECKPOINT_BYTES } from "../../src/kernels/profile.ts";
import { LORA_TARGETS, type Qwen2Config } from "../../src/model/types.ts";
import { Rng } from "../../src/util/rng.ts";

const cfg: Qwen2Config = {
  modelType: "qwen2",
  vocabSize: 97,
  hiddenSize: 64,
  intermediateSize: 144,
  numHiddenLayers: 3,
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  headDim: 16,
  ropeTheta: 1e4,
  rmsNormEps: 1e-6,
  tieWordEmbeddings: true,
  maxPositionEmbeddings: 512,
};
const ids = [
  [5, 17, 33, 2, 90, 41, 8, 63, 12, 70],
  [0, 0, 0, 44, 3, 19, 27, 81, 55, 6],
];
const mask = [
  [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
  [0, 0, 0, 1, 1, 1, 1, 1, 1, 1],
];

/** LoRA B starts at zero, which would make every A gradient zero: give both random values. */
function randomizeAdapter(m: Qwen2ForCausalLM, seed: number): void {
  const rng = new Rng(seed);
  for (const v of m.loraAdapter?.variables() ?? [])
    v.assign(
      tf.tidy(() =>
        tf.tensor(
          Float32Array.from({ length: v.size }, () => 0.1 * rng.normal()),
          v.shape,
        ),
      ),
    );
}

function loss(m: Qwen2ForCausalLM, training = false): tf.Scalar {
  const w = tf.tensor2d(mask.map((r) => r.map((x, t) => (t > 0 && x && r[t - 1] ? 1 : 0))));
  return tf.neg(tf.sum(tf.mul(m.tokenLogprobs(ids, mask, { training }).logprobs, w))) as tf.Scalar;
}

/** Gradients with and without checkpointing; worst |Δ| over max |g| per variable. */
async function compare(m: Qwen2ForCausalLM, training = false): Promise<{ worst: number; lossDiff: number; n: number }> {
  const run = async (on: boolean) => {
    m.activationCheckpointing = on;
    const { value, grads } = tf.variableGrads(() => loss(m, training), m.trainableVariables());
    const out = {
      value: (await value.data())[0],
      grads: Object.fromEntries(await Promise.all(Object.entries(grads).map(async ([k, g]) => [k, await g.data()] as const))),
    };
    tf.dispose([value, grads]);
    return out;
  };
  const a = await run(true),
    b = await run(false);
  m.activationCheckpointing = true;
  expect(Object.keys(a.grads).sort()).toEqual(Object.keys(b.grads).sort());
  let worst = 0;
  for (const k of Object.keys(b.grads)) {
    const ga = a.grads[k],
      gb = b.grads[k];
    let d = 0,
      s = 0;
    for (let i = 0; i < gb.length; i++) {
      d = Math.max(d, Math.abs(ga[i] - gb[i]));
      s = Math.max(s, Math.abs(gb[i]));
    }
    expect(s).toBeGreaterThan(0); // every variable gets a real gradient, so the comparison means something
    worst = Math.max(worst, d / s);
  }
  return { worst, lossDiff: Math.abs(a.value - b.value), n: Object.keys(b.grads).length };
}

async function model(opts: ModelOptions): Promise<Qwen2ForCausalLM> {
  const m = await createModel(cfg, { seed: 3, ...opts });
  randomizeAdapter(m, 4);
  return m;
}
const lora = { r: 4, alpha: 8, dropout: 0, targetModules: [...LORA_TARGETS] };

describe("activation checkpointing (wasm)", () => {
  beforeAll(async () => {
    await initBackend("wasm");
  });

  it("checkpoint() gives the gradients of the plain function, for x and a variable, inside another gradient", async () => {
    const w = tf.variable(
      tf.tensor2d([
        [0.5, -1, 2],
        [1.5, 0.25, -0.75],
      ]),
      true,
      "ckpt-test-w",
    );
    const c = tf.tensor1d([0.1, -0.2, 0.3]);
    const f = (x: tf.Tensor2D, [cc]: tf.Tensor[]) => tf.tidy(() => tf.tanh(tf.add(tf.matMul(tf.sin(x), w), cc)) as tf.Tensor2D);
    const x = tf.tensor2d([
      [0.3, -0.7],
      [1.1, 0.2],
      [-0.4, 0.9],
    ]);
    const before = tf.memory().numTensors;
    const lossOf = (g: (x: tf.Tensor2D) => tf.Tensor2D) => (xx: tf.Tensor) => tf.sum(tf.square(g(xx as tf.Tensor2D)));
    const plain = tf.grads(lossOf((xx) => f(xx, [c])));
    const ck = tf.grads(lossOf((xx) => checkpoint(f, xx, [c], [w])));
    const [gx1] = plain([x]),
      [gx2] = ck([x]);
    expect(Array.from(await gx2.data())).toEqual(Array.from(await gx1.data()));
    const { value: v1, grads: gw1 } = tf.variableGrads(() => lossOf((xx) => f(xx, [c]))(x) as tf.Scalar, [w]);
    const { value: v2, grads: gw2 } = tf.variableGrads(() => lossOf((xx) => checkpoint(f, xx, [c], [w]))(x) as tf.Scalar, [w]);
    expect(Array.from(await gw2[w.name].data())).toEqual(Array.from(await gw1[w.name].data()));
    // the outer tape was restored after the inner gradient: one more gradient still works
    const [again] = ck([x]);
    expect(Array.from(await again.data())).toEqual(Array.from(await gx1.data()));
    tf.dispose([gx1, gx2, again, v1, v2, gw1, gw2]);
    expect(tf.memory().numTensors).toBe(before);
    tf.dispose([w, c, x]);
  });

  it("LoRA gradients on an f32 base equal the non-checkpointed ones (≤ 1e-5 relative), no tensor growth", async () => {
    const m = await model({ lora });
    await compare(m); // warm-up: kernels and caches allocate once
    const before = tf.memory().numTensors;
    const r = await compare(m);
    expect(tf.memory().numTensors).toBe(before);
    console.log(
      `f32 + LoRA: ${r.n} variables, worst relative gradient difference ${r.worst.toExponential(2)}, loss |Δ| ${r.lossDiff.toExponential(2)}`,
    );
    expect(r.n).toBe(2 * LORA_TARGETS.length * cfg.numHiddenLayers);
    expect(r.worst).toBeLessThanOrEqual(1e-5);
    expect(r.lossDiff).toBeLessThanOrEqual(1e-6);
    m.dispose();
  });

  it("LoRA gradients on an nf4 base, and full-model gradients, equal the non-checkpointed ones", async () => {
    const q = await model({ lora, quantize: "nf4" });
    const rq = await compare(q);
    console.log(`nf4 + LoRA: worst relative gradient difference ${rq.worst.toExponential(2)}`);
    expect(rq.worst).toBeLessThanOrEqual(1e-5);
    q.dispose();
    const full = await model({ trainable: "full" });
    const rf = await compare(full);
    console.log(`full: ${rf.n} variables, worst relative gradient difference ${rf.worst.toExponential(2)}`);
    // embeddings, final norm, and per layer 2 norms, the q/k/v bias, 4 (fused) matrices
    expect(rf.n).toBe(2 + cfg.numHiddenLayers * 7);
    expect(rf.worst).toBeLessThanOrEqual(1e-5);
    full.dispose();
  });

  it("with LoRA dropout while training, layers are recorded whole and gradients stay exact", async () => {
    // Two identical models (same seed, so the same dropout masks): one tries to checkpoint, one not.
    const a = await model({ lora: { ...lora, dropout: 0.2 } }),
      b = await model({ lora: { ...lora, dropout: 0.2 } });
    b.activationCheckpointing = false;
    const ga = tf.variableGrads(() => loss(a, true), a.trainableVariables());
    const gb = tf.variableGrads(() => loss(b, true), b.trainableVariables());
    const key = (k: string) => k.replace(/#\d+$/, "");
    const mb = new Map(Object.entries(gb.grads).map(([k, g]) => [key(k), g]));
    for (const [k, g] of Object.entries(ga.grads)) expect(Array.from(await g.data())).toEqual(Array.from(await mb.get(key(k))!.data()));
    tf.dispose([ga.value, ga.grads, gb.value, gb.grads]);
    a.dispose();
    b.dispose();
  });

  it("the tape holds less: peak bytes of a LoRA step are lower with checkpointing; auto records small steps whole", async () => {
    const m = await createModel({ ...cfg, numHiddenLayers: 6, intermediateSize: 512 }, { seed: 1, lora });
    const ids8 = Array.from({ length: 4 }, (_, b) => Array.from({ length: 64 }, (_, t) => (b * 31 + t * 7) % 97));
    const mask8 = ids8.map((r) => r.map(() => 1));
    const peak = async (on: boolean | "auto") => {
      m.activationCheckpointing = on;
      const info = await tf.profile(() => {
        const { value, grads } = tf.variableGrads(
          () => tf.neg(tf.mean(m.tokenLogprobs(ids8, mask8).logprobs)) as tf.Scalar,
          m.trainableVariables(),
        );
        tf.dispose([value, grads]);
      });
      return info.peakBytes;
    };
    const on = await peak(true),
      off = await peak(false);
    console.log(`peak bytes of a 6-layer 4×64 LoRA step: ${on} checkpointed vs ${off} recorded whole`);
    expect(on).toBeLessThan(0.6 * off);
    // "auto" records this small step whole, as off does, and checkpoints one whose estimated tape
    // passes a quarter of the wasm heap; the estimate is within a factor of two of the measured peak.
    const est = m.config.numHiddenLayers * layerTapeBytes(m.config, 4, 64);
    console.log(`estimated tape ${est} bytes`);
    expect(est).toBeGreaterThan(0.4 * off);
    expect(est).toBeLessThan(1.5 * off);
    expect(await peak("auto")).toBe(off);
    expect(m.checkpointsLayers(4, 64)).toBe(false);
    expect(m.checkpointsLayers(64, 2048)).toBe(true);
    expect(m.config.numHiddenLayers * layerTapeBytes(m.config, 64, 2048)).toBeGreaterThan(AUTO_CHECKPOINT_BYTES);
    m.dispose();
  });

  it("training rows per micro-batch: one layer's tape within the backend's budget (0.5B at 498 tokens: 4 rows)", async () => {
    const m = await createModel(cfg, { seed: 1, lora });
    const perRow = layerTapeBytes(m.config, 1, 300);
    expect(m.trainRowsFor(300)).toBe(Math.floor(2 ** 30 / perRow)); // wasm and cpu: 1 GiB
    m.trainLayerBytes = 3.5 * perRow;
    expect(m.trainRowsFor(300)).toBe(3);
    m.trainLayerBytes = perRow / 10;
    expect(m.trainRowsFor(300)).toBe(1); // always at least one row
    m.dispose();
    const q05 = {
      ...cfg,
      vocabSize: 151936,
      hiddenSize: 896,
      intermediateSize: 4864,
      numHiddenLayers: 24,
      numAttentionHeads: 14,
      numKeyValueHeads: 2,
      headDim: 64,
    };
    // 4 rollouts × 498 tokens trained inside the 4 GiB heap beside an NF4 base; 8 ran out of it
    expect([256, 498, 800].map((T) => Math.floor(2 ** 30 / layerTapeBytes(q05, 1, T)))).toEqual([8, 4, 2]);
  });
});
