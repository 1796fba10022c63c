/** Rows of a matrix picked by indices known on the host, differentiable, in one dispatch each way on
 *  webgpu: the forward reads row idx[i] (−1: a zero row); the gradient sums dy's rows back into the
 *  rows they came from through a map built on the host (each source row's list of destinations), so
 *  repeated indices need no atomics. tfjs' Gather takes one dispatch forward and six backward (its
 *  UnsortedSegmentSum and transposes), and a zero row costs a concat and its split. Kernels in
 *  webgpu/gather-rows.ts; other backends take tf.gather (and a concatenated zero row). */
import * as tf from "@tensorflow/tfjs";
import type { CustomGradFn } from "./kernels.ts";

export const GATHER_ROWS = "MarlGatherRows";
export const SCATTER_ROWS = "MarlScatterRows";

/** x [R, C] and idx (−1 or a row of x, each) → [idx.length, C]. */
export function gatherRows(x: tf.Tensor2D, idx: Int32Array): tf.Tensor2D {
  const [R, C] = x.shape;
  for (const i of idx) if (!(i >= -1 && i < R)) throw new Error(`gatherRows: index ${i} outside [-1, ${R})`);
  if (tf.getBackend() !== "webgpu" || tf.getKernel(GATHER_ROWS, "webgpu") === undefined || x.dtype !== "float32") {
    return tf.tidy(() => {
      const src = idx.some((i) => i < 0) ? tf.concat([x, tf.zeros([1, C])], 0) : x;
      return tf.gather(
        src,
        tf.tensor1d(
          Int32Array.from(idx, (i) => (i < 0 ? R : i)),
          "int32",
        ),
      ) as tf.Tensor2D;
    });
  }
  const f = tf.customGrad(((xx: tf.Tensor2D) => {
    const at = tf.tensor1d(idx, "int32");
    const value = tf.engine().runKernel(GATHER_ROWS, { x: xx, idx: at }) as tf.Tensor2D;
    at.dispose();
    return {
      value,
      gradFunc: (dy: tf.Tensor2D) => {
        const { start, list } = destinations(idx, R);
        return tf.tidy(
          () =>
            tf
              .engine()
              .runKernel(
                SCATTER_ROWS,
                { dy, start: tf.tensor1d(start, "int32"), list: tf.tensor1d(list, "int32") },
                { rows: R },
              ) as tf.Tensor2D,
        );
      },
    };
  }) as unknown as CustomGradFn);
  return f(x) as tf.Tensor2D;
}

/** The gradient's map of idx into R source rows: each row's destinations list[start[r]] …
 *  list[start[r + 1] − 1] (formed only when a gradient is asked for). */
function destinations(idx: Int32Array, R: number): { start: Int32Array; list: Int32Array } {
  const start = new Int32Array(R + 1);
  for (const i of idx) if (i >= 0) start[i + 1]++;
  for (let r = 0; r < R; r++) start[r + 1] += start[r];
  const list = new Int32Array(Math.max(1, start[R])),
    fill = start.slice(0, R);
  idx.forEach((i, d) => {
    if (i >= 0) list[fill[i]++] = d;
  });
  return { start, list };
}
