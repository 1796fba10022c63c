/** LoRA's fused-module B as one block-diagonal kernel on webgpu (webgpu/heads.ts registers it). This
 *  file imports only tfjs, so model code can call it without loading the wasm heap module (whose
 *  import registers the wasm backend). */
import * as tf from "@tensorflow/tfjs";

export const BLOCK_DIAG = "MarlBlockDiag";

/** The block-diagonal of bs [r, out_i] (all of one r) on webgpu, differentiable (each gradient is a
 *  slice of the block's); null on other backends or before the webgpu kernels are registered. */
export function blockDiagonal(bs: tf.Tensor2D[]): tf.Tensor2D | null {
  if (tf.getBackend() !== "webgpu" || tf.getKernel(BLOCK_DIAG, "webgpu") === undefined) return null;
  const r = bs[0].shape[0];
  if (bs.length > 8 || bs.some((b) => b.shape[0] !== r || b.dtype !== "float32")) return null;
  const inputs = Object.fromEntries(bs.map((b, i) => [`b${i}`, b]));
  return tf.engine().runKernel(BLOCK_DIAG, inputs, { r, outs: bs.map((b) => b.shape[1]) }) as tf.Tensor2D;
}
