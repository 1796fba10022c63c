/** gatherRows (src/kernels/gather-rows.ts) off webgpu: tf.gather with a zero row for −1, its gradient
 *  summing repeated rows, and a one-line error for an index outside the rows. The webgpu kernels are
 *  tested in test/kernels/webgpu/row-kernels.test.ts. */
import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { gatherRows } from "../../src/kernels/gather-rows.ts";

describe("gatherRows on cpu", () => {
  it("picks rows, zeros for −1, and sums a repeated row's gradient", async () => {
    await initBackend("cpu");
    const x = tf.tensor2d([1, 2, 3, 4, 5, 6], [3, 2]);
    const idx = Int32Array.from([2, -1, 0, 2]);
    const n0 = tf.memory().numTensors;
    const y = gatherRows(x, idx);
    expect(Array.from(await y.data())).toEqual([5, 6, 0, 0, 1, 2, 5, 6]);
    const dy = tf.tensor2d([1, 10, 100, 1000, 2, 20, 3, 30], [4, 2]);
    const g = tf.grad((a: tf.Tensor) => gatherRows(a as tf.Tensor2D, idx))(x, dy);
    expect(Array.from(await g.data())).toEqual([2, 20, 0, 0, 4, 40]);
    tf.dispose([y, g, dy]);
    expect(tf.memory().numTensors).toBe(n0);
    expect(() => gatherRows(x, Int32Array.from([0, -2]))).toThrow(/index -2 outside \[-1, 3\)/);
    x.dispose();
  });
});
