/** A quantized base unpacked for generation (Qwen2ForCausalLM.unpackBase): the same logits, KV-cache
 *  decoding and LoRA gradients as dequantizing per product, in both layouts, and every tensor freed on
 *  release. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { FUSED_MODULES } from "../../src/model/types.ts";
import { DelegatingLM } from "../../scripts/lib/delegate.ts";
import { loadModel } from "../../src/model/load.ts";

const FIX = "test/fixtures/qwen2-tiny";
const LORA = {
  r: 4,
  alpha: 8,
  dropout: 0,
  targetModules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] as const,
};
// two rows, the first left-padded
const ids = [
  [0, 3, 1, 4, 1, 5],
  [2, 7, 1, 8, 2, 8],
];
const mask = [
  [0, 1, 1, 1, 1, 1],
  [1, 1, 1, 1, 1, 1],
];
beforeAll(() => initBackend("wasm"));

describe("unpackBase", () => {
  it.each([
    ["nf4", false],
    ["nf4", true],
    ["int8", false],
  ] as const)(
    "%s (left layout %s): identical outputs and gradients (left: up to rounding), no tensor left after release",
    async (quantize, left) => {
      const start = tf.memory().numTensors;
      const m = await loadModel(FIX, { quantize, lora: { ...LORA, targetModules: [...LORA.targetModules] }, seed: 1 });
      const run = async () => {
        const out = m.forward(ids, mask);
        const logits = Array.from(await out.data());
        out.dispose();
        const { logits: first, cache } = m.prefill(ids, mask);
        const step = m.decodeStep([9, 6], cache);
        const decoded = [...(await first.data()), ...(await step.data())];
        tf.dispose([first, step]);
        cache.dispose();
        const grads = tf.variableGrads(() => tf.sum(m.tokenLogprobs(ids, mask).logprobs) as tf.Scalar, m.trainableVariables());
        const g = await Promise.all(Object.values(grads.grads).map((t) => t.data()));
        tf.dispose([grads.value, ...Object.values(grads.grads)]);
        return { logits, decoded, grads: g.map((x) => Array.from(x)) };
      };
      const packed = await run();
      const before = tf.memory().numTensors;
      const release = m.unpackBase({ left });
      // per (fused) linear module: one f32 matrix, and the adapter's two held factors (lora.ts
      // holdFactors); and the adapter's scaling as one tensor
      const held = 3 * FUSED_MODULES.length * m.config.numHiddenLayers + 1;
      expect(tf.memory().numTensors).toBe(before + held);
      m.unpackBase(); // nested: a no-op
      expect(tf.memory().numTensors).toBe(before + held);
      const unpacked = await run();
      release();
      expect(tf.memory().numTensors).toBe(before);
      expect(unpacked.logits).toEqual(packed.logits);
      expect(unpacked.decoded).toEqual(packed.decoded);
      // The left layout multiplies in another order: its gradients are equal up to float32 rounding.
      if (left)
        unpacked.grads.forEach((g, i) => {
          const scale = Math.max(1e-30, ...packed.grads[i].map(Math.abs)); // A of a fresh adapter: all 0
          expect(Math.max(...g.map((v, j) => Math.abs(v - packed.grads[i][j]))) / scale).toBeLessThanOrEqual(1e-5);
        });
      else expect(unpacked.grads).toEqual(packed.grads);
      m.dispose();
      expect(tf.memory().numTensors).toBe(start);
    },
  );

  it.each([false, true])(
    "mergeAdapter (left layout %s): the adapter's terms go into the held base: decode logits within float32 rounding of the unmerged ones, no LoRA products in a decode step, the packed model's very outputs after release",
    async (left) => {
      const start = tf.memory().numTensors;
      const m = await loadModel(FIX, { quantize: "nf4", lora: { ...LORA, targetModules: [...LORA.targetModules] }, seed: 1 });
      // a trained adapter's B is not zero (PEFT's init is): give every factor values
      tf.tidy(() => m.trainableVariables().forEach((v) => v.assign(tf.mul(tf.randomNormal(v.shape, 0, 1, "float32", 3), 0.2))));
      const decode = async () => {
        const { logits: first, cache } = m.prefill(ids, mask);
        const step = m.decodeStep([9, 6], cache);
        const info = await tf.profile(() => m.decodeStep([4, 2], cache));
        (info.result as tf.Tensor).dispose();
        const products = info.kernels.filter((k) => /MatMul|XWT/.test(k.name)).length;
        const out = [...(await first.data()), ...(await step.data())];
        tf.dispose([first, step]);
        cache.dispose();
        return { out, products };
      };
      const logitsNow = async () => {
        const t = m.forward(ids, mask);
        const out = Array.from(await t.data());
        t.dispose();
        return out;
      };
      const packedOut = await logitsNow();
      let release = m.unpackBase({ left });
      const unmerged = await decode();
      release();
      const ad = m.swapAdapter(null);
      release = m.unpackBase({ left });
      const noAdapter = await decode();
      release();
      m.swapAdapter(ad);
      const before = tf.memory().numTensors;
      release = m.unpackBase({ left, mergeAdapter: true });
      // one f32 matrix per fused module, and no held LoRA factors: a merged step runs no LoRA product
      expect(tf.memory().numTensors).toBe(before + FUSED_MODULES.length * m.config.numHiddenLayers);
      const merged = await decode();
      const diff = Math.max(...merged.out.map((x, i) => Math.abs(x - unmerged.out[i])));
      expect(diff).toBeGreaterThan(0); // merged weights round differently: a real merge ran
      expect(diff).toBeLessThanOrEqual(1e-4 * Math.max(...unmerged.out.map(Math.abs)));
      expect(merged.products).toBe(noAdapter.products);
      expect(merged.products).toBeLessThan(unmerged.products);
      // the held weights carry this adapter: base-only, training forwards and adapter swaps are refused
      expect(() => m.forward(ids, mask, { adapters: false })).toThrow(/adapters off.*release/);
      expect(() => m.tokenLogprobs(ids, mask, { training: true })).toThrow(/trains.*release/);
      expect(() => tf.variableGrads(() => tf.sum(m.tokenLogprobs(ids, mask).logprobs) as tf.Scalar, m.trainableVariables())).toThrow(
        /trains.*release/,
      );
      expect(() => m.swapAdapter(null)).toThrow(/merged.*release/);
      release();
      expect(tf.memory().numTensors).toBe(before);
      expect(await logitsNow()).toEqual(packedOut);
      expect(() => m.forward(ids, mask, { adapters: false }).dispose()).not.toThrow();
      m.dispose();
      expect(tf.memory().numTensors).toBe(start);
    },
  );

  it("a model wrapper (DelegatingLM) unpacks and releases the model it wraps", async () => {
    const m = await loadModel(FIX, { quantize: "nf4" });
    const n = tf.memory().numTensors;
    const release = new DelegatingLM(m).unpackBase();
    expect(tf.memory().numTensors).toBe(n + FUSED_MODULES.length * m.config.numHiddenLayers);
    release();
    expect(tf.memory().numTensors).toBe(n);
    m.dispose();
  });

  it("a model wrapper passes on how the model shares prefixes and how many rows it trains at once", async () => {
    const m = await loadModel(FIX, { quantize: "nf4" });
    const d = new DelegatingLM(m);
    expect(d.sharePrefixes).toBe(true);
    m.sharePrefixes = false;
    expect(d.sharePrefixes).toBe(false);
    m.trainLayerBytes = 1e6;
    expect(d.trainRowsFor(100)).toBe(m.trainRowsFor(100));
    expect(d.trainRowsFor(100)).toBeLessThan(m.trainRowsFor(10));
    m.dispose();
  });

  it("does nothing for an f32 base or with unpackForGeneration off", async () => {
    const f32 = await loadModel(FIX);
    const n = tf.memory().numTensors;
    const releaseF32 = f32.unpackBase();
    expect(tf.memory().numTensors).toBe(n);
    releaseF32();
    f32.dispose();
    const q = await loadModel(FIX, { quantize: "nf4" });
    q.unpackForGeneration = false;
    const k = tf.memory().numTensors;
    const release = q.unpackBase();
    expect(tf.memory().numTensors).toBe(k);
    release();
    q.dispose();
  });
});
