/** Softmax over the last axis (attention's probabilities), one kernel each way on wasm where that
 *  axis is a multiple of 4: the heap module's softmaxRows and softmaxGrad (heap-code.ts), rows
 *  split over the helper threads. tfjs' Softmax runs on one thread, and its gradient is four more
 *  single-threaded kernels (Multiply, Sum, Sub, Multiply). Masked scores (−1e9) get exactly 0, as
 *  with tfjs; values agree with it to float32 rounding. On webgpu both are WGSL programs
 *  (webgpu/rows.ts, any width), one dispatch each; other backends keep tf.softmax. */
import * as tf from "@tensorflow/tfjs";
import { type CustomGradFn, heapOffset, once, registerKernel, type Backend } from "./kernels.ts";
import { heapSoftmaxGrad, heapSoftmaxRows } from "./wasm/heap-ops.ts";

export const SOFTMAX = "MarlSoftmax",
  SOFTMAX_GRAD = "MarlSoftmaxGrad";

const register = once(() => {
  registerKernel(
    SOFTMAX,
    () =>
      ({ inputs, backend }) => {
        const { x } = inputs as { x: tf.TensorInfo };
        const b = backend as Backend,
          out = b.makeOutput(x.shape, "float32") as tf.TensorInfo;
        const S = x.shape[x.shape.length - 1],
          rows = tf.util.sizeFromShape(x.shape) / S;
        if (rows > 0) heapSoftmaxRows(b, heapOffset(b, x), new Float32Array(rows).fill(1), heapOffset(b, out), rows, S);
        return out;
      },
    ["wasm"],
  );
  registerKernel(
    SOFTMAX_GRAD,
    () =>
      ({ inputs, backend }) => {
        const { y, dy } = inputs as { y: tf.TensorInfo; dy: tf.TensorInfo };
        const b = backend as Backend,
          out = b.makeOutput(y.shape, "float32") as tf.TensorInfo;
        const S = y.shape[y.shape.length - 1],
          rows = tf.util.sizeFromShape(y.shape) / S;
        if (rows > 0) heapSoftmaxGrad(b, heapOffset(b, y), heapOffset(b, dy), heapOffset(b, out), rows, S);
        return out;
      },
    ["wasm"],
  );
});

const kernelSoftmax = tf.customGrad(((x: tf.Tensor, save: tf.GradSaveFunc) => {
  const y = tf.engine().runKernel(SOFTMAX, { x }) as tf.Tensor;
  save([y]);
  return { value: y, gradFunc: (dy: tf.Tensor, [ys]: tf.Tensor[]) => tf.engine().runKernel(SOFTMAX_GRAD, { y: ys, dy }) as tf.Tensor };
}) as unknown as CustomGradFn) as unknown as <T extends tf.Tensor>(x: T) => T;

/** softmax(x + bias) for attention's scores x [B, H, T, S] and mask bias [B, 1, T, S], the bias
 *  added by the webgpu kernel as it reads x (one dispatch fewer); elsewhere softmax(x + bias), the
 *  add first, as before. The bias takes no gradient (a constant). */
export function softmaxBiased(x: tf.Tensor4D, bias: tf.Tensor4D): tf.Tensor4D {
  register();
  if (tf.getBackend() !== "webgpu" || tf.getKernel(SOFTMAX, "webgpu") === undefined || x.dtype !== "float32" || x.size === 0)
    return softmax(tf.add(x, bias));
  const f = tf.customGrad(((xx: tf.Tensor4D, save: tf.GradSaveFunc) => {
    const y = tf.engine().runKernel(SOFTMAX, { x: xx, bias }) as tf.Tensor4D;
    save([y]);
    return { value: y, gradFunc: (dy: tf.Tensor, [ys]: tf.Tensor[]) => tf.engine().runKernel(SOFTMAX_GRAD, { y: ys, dy }) as tf.Tensor };
  }) as unknown as CustomGradFn);
  return f(x) as tf.Tensor4D;
}

/** softmax over the last axis of x. */
export function softmax<T extends tf.Tensor>(x: T): T {
  register();
  const S = x.shape[x.shape.length - 1];
  const b = tf.getBackend();
  return ((b === "wasm" && S % 4 === 0) || (b === "webgpu" && tf.getKernel(SOFTMAX, b) !== undefined)) &&
    x.dtype === "float32" &&
    x.rank > 0 &&
    S > 0
    ? kernelSoftmax(x)
    : (tf.softmax(x) as T);
}
