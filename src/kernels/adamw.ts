/** The optimizer step on the device: the global gradient norm with clip_grad_norm_'s coefficient,
 *  and AdamW's moments and weights, as a few dispatches per group of variables with nothing read back inside
 *  the step (webgpu; webgpu/adamw.ts holds the programs). Through tfjs ops the same step was ~17
 *  dispatches per variable and a read of the norm before the update. trainer/optimizer.ts takes this
 *  path where the backend has it and its op path elsewhere; both compute torch's AdamW in float32.
 *  A non-finite norm leaves the moments and weights as they were (the programs check it), so the
 *  caller can read the norm after the step and refuse it then. */
import * as tf from "@tensorflow/tfjs";
import type { Backend } from "./kernels.ts";

/** The step's numbers, as the op path computes them on the host. */
export interface AdamWConstants {
  beta1: number;
  beta2: number;
  eps: number;
  decay: number; // 1 − lr·weight decay
  stepSize: number; // lr / (1 − β1^t)
  bc2Sqrt: number; // √(1 − β2^t)
}

/** The programs, on tensors of the backend `b`. */
export interface AdamWDevice {
  /** Gradients per sumSquares dispatch, and variables per update dispatch (the device's storage
   *  bindings per shader stage bound both). */
  sumSquaresGroup: number;
  updateGroup: number;
  /** Σ g² of each of up to sumSquaresGroup gradients into acc[pos + i], in place: one dispatch. */
  sumSquares(b: Backend, grads: tf.TensorInfo[], acc: tf.TensorInfo, pos: number): void;
  /** [‖g‖, clip coefficient min(1, maxNorm / (‖g‖ + 1e-6))] from acc's squares; maxNorm ≤ 0: 1. */
  normCoef(b: Backend, acc: tf.TensorInfo, maxNorm: number): tf.TensorInfo;
  /** Up to updateGroup variables in one dispatch: each one's m and v, held as one tensor [2·n] (m,
   *  then v), updated in place from its gradient times the clip coefficient, and its new value
   *  returned (flat [n]). */
  update(
    b: Backend,
    thetas: tf.TensorInfo[],
    states: tf.TensorInfo[],
    grads: tf.TensorInfo[],
    normCoef: tf.TensorInfo,
    k: AdamWConstants,
  ): tf.TensorInfo[];
}

let device: AdamWDevice | null = null;

/** Called once the webgpu programs are registered. */
export function setWebgpuAdamW(d: AdamWDevice): void {
  device = d;
}

/** Gradients per norm dispatch and variables per update dispatch (null before webgpu starts). */
export function deviceAdamWGroups(): { sumSquares: number; update: number } | null {
  return device && { sumSquares: device.sumSquaresGroup, update: device.updateGroup };
}

/** Whether the current backend runs the optimizer step on the device. */
export function hasDeviceAdamW(): boolean {
  return device !== null && tf.getBackend() === "webgpu";
}

const backend = () => tf.backend() as Backend;
const wrap = <T extends tf.Tensor>(info: tf.TensorInfo) => tf.engine().makeTensorFromTensorInfo(info) as T;

/** [‖g‖, clip coefficient] of all `grads` (maxNorm ≤ 0 or ∞: coefficient 1): ⌈n / group⌉ + 1
 *  dispatches. */
export function deviceGradNorm(grads: tf.Tensor[], maxNorm: number): tf.Tensor1D {
  const d = device!;
  const acc = tf.tensor1d(new Float32Array(Math.max(1, grads.length))); // an upload, not a dispatch
  try {
    const G = d.sumSquaresGroup;
    for (let i = 0; i < grads.length; i += G) d.sumSquares(backend(), grads.slice(i, i + G), acc, i);
    return wrap<tf.Tensor1D>(d.normCoef(backend(), acc, Number.isFinite(maxNorm) && maxNorm > 0 ? maxNorm : 0));
  } finally {
    acc.dispose();
  }
}

/** The AdamW step of `thetas`: their moments `states` ([2·n] each) in place, and their new values
 *  returned, ⌈n / group⌉ dispatches. Nothing changes when the norm in normCoef is not finite. */
export function deviceAdamW(
  thetas: tf.Tensor[],
  states: tf.Tensor[],
  grads: tf.Tensor[],
  normCoef: tf.Tensor1D,
  k: AdamWConstants,
): tf.Tensor[] {
  const d = device!,
    G = d.updateGroup,
    out: tf.Tensor[] = [];
  for (let i = 0; i < thetas.length; i += G) {
    const next = d.update(backend(), thetas.slice(i, i + G), states.slice(i, i + G), grads.slice(i, i + G), normCoef, k);
    next.forEach((t, j) => out.push(wrap({ ...t, shape: thetas[i + j].shape })));
  }
  return out;
}
