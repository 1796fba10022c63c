/** A small model shape for LoRA tests and seeded normal tensors (test/model/lora.test.ts,
 *  test/kernels/webgpu/lora.test.ts). */
import * as tf from "@tensorflow/tfjs";
import type { Qwen2Config } from "../../../src/model/types.ts";
import { Rng } from "../../../src/util/rng.ts";

export const cfg = {
  hiddenSize: 32,
  intermediateSize: 48,
  numAttentionHeads: 4,
  numKeyValueHeads: 2,
  headDim: 8,
  numHiddenLayers: 1,
} as Qwen2Config;

export const randn = (shape: number[], seed: number): tf.Tensor => {
  const r = new Rng(seed);
  return tf.tensor(
    Float32Array.from({ length: shape.reduce((a, b) => a * b) }, () => r.normal()),
    shape,
  );
};
