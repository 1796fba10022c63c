/** What the model code needs to know about the backend it runs on, in one place: memory and layout
 *  choices made for one backend's limits (the 4 GiB wasm heap, a GPU's largest storage binding) and
 *  kernels known to be slow or inexact there. Model code reads `backendProfile()`; nothing else in
 *  model/ or trainer/ asks which backend is current. A GPU's limits come from webgpu/families.ts, where
 *  webgpu/device.ts leaves them when the device starts. */
import * as tf from "@tensorflow/tfjs";
import { webgpuLimits } from "./webgpu/families.ts";

export interface BackendProfile {
  /** f32 bytes of frozen weights above which they are held [out, in] and multiplied as the left
   *  operand. wasm: XNNPACK caches a packed copy of every right-hand weight, which a 2 GB model cannot
   *  afford inside the 4 GiB heap (weight.ts). Other backends cache nothing: never. */
  leftLayoutBytes: number;
  /** Rows × vocab floats of logits materialised at once when computing token log-probs (a frozen
   *  head's chunk holds two such tensors, a trainable head's forward and backward ~7). */
  logitChunkFloats: number;
  /** Largest tensor, in floats, one kernel may read or write; bigger weights are split (0.5B's
   *  embedding is 544 MB; a software adapter binds 128 MiB). Infinity where there is no such limit. */
  maxBindingFloats: number;
  /** Storage buffers one kernel may bind (webgpu: the device's per shader stage, 8 to 16 or more);
   *  kernels that bind more fall back to ops. */
  storageBindings: number;
  /** Whether GatherV2 moves int32 values exactly (webgpu's moves them through f32 and rounds words of
   *  packed codes above 2^24), so packed columns can be gathered before unpacking. */
  exactIntGather: boolean;
  /** How matmul.ts forms products with a transposed operand (batched products are one kernel on
   *  both): "flags" (wasm, cpu, tensorflow): matMul's transposeA/B flags (gemm.ts reads a
   *  transposed A in place and packs a transposed B, at the plain product's speed);
   *  "batched" (webgpu): the flags, except that one-batch products over K ≥ 2000 materialise the
   *  transpose as its own kernel: tfjs-backend-webgpu 4.22's split-K program (one batch, K ≥ 2000,
   *  small output) gives wrong sums with a transposed operand (errors of 100s at K 2048). */
  matMulForm: "flags" | "batched";
  /** Where the rollout sampler works (rollout/sampler.ts): false = read the logits [B, V] and draw on
   *  the host (wasm, cpu: the read is a memory copy and a JS pass beats tfjs' reductions there);
   *  true = the device computes each row's normaliser and top candidates and the host reads those
   *  (a GPU: a read is a transfer and a sync, 19 MB of logits per step at B 32 × 152k). Same draws. */
  deviceSampling: boolean;
  /** Bytes of one decoder layer's gradient tape (qwen2.ts layerTapeBytes) a training micro-batch may
   *  hold; GRPO splits a micro-batch above it into smaller ones (same gradients). wasm and cpu:
   *  1 GiB, so a 0.5B micro-batch stays inside wasm's 4 GiB heap beside the base (4 rollouts × 498
   *  tokens, 0.98 GiB, trained; 8 ran out of heap). webgpu: no limit (the user's micro-batch). */
  trainLayerBytes: number;
  /** Gradient-tape bytes of a whole forward above which "auto" activation checkpointing recomputes
   *  layers: a quarter of wasm's 4 GiB heap, on every backend. Below it, recording layers whole saves
   *  a forward of compute per step (small config, 8 × 256 tokens: 1.2 s instead of 1.5 s per step);
   *  0.5B is above it from one 256-token row. */
  autoCheckpointBytes: number;
  /** One-layer activation bytes a prefill may hold at once (qwen2.ts runs rows in groups below it):
   *  32 rollouts of a 0.5B, ~300-token prompts, in one pass needed ~5 GB beside the unpacked 2 GB
   *  base and stalled the wasm heap's allocator at its 4 GiB limit for good. Every backend. */
  prefillBytes: number;
  /** Whether a product takes an addend as its epilogue (tfjs' fused matMul bias: the q/k/v bias, the
   *  residual, a LoRA term's base product) rather than an add after it: on webgpu one dispatch fewer
   *  each; elsewhere the add, in the order the model always summed (the same bits as before). */
  fusedAddend: boolean;
  /** Whether each kernel launch costs host time that dominates small kernels (a GPU: ~300 µs of
   *  encoding a dispatch), so model code takes a path of fewer kernels where the CPU backends keep
   *  one whose bits they have always given (tokenLogprobs' spans by gathers, not a slice and a pad
   *  per row: the gradients of a shared prefix's rows are summed in another order). */
  dispatchBound: boolean;
  /** Bytes of memory the device has, for `--micro_batch_size auto`: a GPU's as its system reports it
   *  (webgpu/device.ts: nvidia-smi; WebGPU itself does not tell), 8 GiB where unknown, the host's for a
   *  software adapter; wasm: its 4 GiB heap. */
  deviceMemoryBytes: number;
}

export const AUTO_CHECKPOINT_BYTES = 2 ** 30;
export const PREFILL_BYTES = 512 * 2 ** 20;

const CPU: BackendProfile = {
  leftLayoutBytes: 2 ** 30,
  logitChunkFloats: 20 * 1024 * 1024,
  maxBindingFloats: Infinity,
  storageBindings: Infinity,
  exactIntGather: true,
  matMulForm: "flags",
  deviceSampling: false,
  trainLayerBytes: 2 ** 30,
  autoCheckpointBytes: AUTO_CHECKPOINT_BYTES,
  prefillBytes: PREFILL_BYTES,
  fusedAddend: false,
  dispatchBound: false,
  deviceMemoryBytes: 4 * 2 ** 30,
};

/** The profile of the current tfjs backend. */
export function backendProfile(): BackendProfile {
  if (tf.getBackend() !== "webgpu") return CPU;
  const limits = webgpuLimits();
  const maxBindingFloats = limits ? Math.floor(limits.maxStorageBufferBindingSize / 4) : 32 * 1024 * 1024;
  return {
    leftLayoutBytes: Infinity,
    logitChunkFloats: Math.min(16 * 1024 * 1024, maxBindingFloats),
    maxBindingFloats,
    storageBindings: limits?.maxStorageBuffersPerShaderStage ?? 8,
    exactIntGather: false,
    matMulForm: "batched",
    deviceSampling: true,
    trainLayerBytes: Infinity,
    autoCheckpointBytes: AUTO_CHECKPOINT_BYTES,
    prefillBytes: PREFILL_BYTES,
    fusedAddend: true,
    dispatchBound: true,
    deviceMemoryBytes: limits?.memoryBytes ?? 8 * 2 ** 30,
  };
}
