/** The wasm GatherV2 kernel (src/kernels/wasm/gather.ts) against the cpu backend's: every axis, float32
 *  (NaN and -0 bits kept) and int32, slices of one element and of whole rows, 2-D indices, repeats,
 *  empty inputs, tfjs' error for an out-of-range index, and flat tensor counts. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { Rng } from "../../src/util/rng.ts";

const rng = new Rng(11);

async function gatherOn(
  backend: string,
  x: { v: number[]; shape: number[]; dtype: "float32" | "int32" },
  ids: { v: number[]; shape: number[] },
  axis: number,
) {
  await tf.setBackend(backend);
  return tf.tidy(() => {
    const g = tf.gather(tf.tensor(x.v, x.shape, x.dtype), tf.tensor(ids.v, ids.shape, "int32"), axis);
    const data = g.dataSync();
    // float32 compared by bits: a copy must not canonicalise NaN or lose -0
    return {
      shape: g.shape,
      dtype: g.dtype,
      bits: Array.from(g.dtype === "float32" ? new Uint32Array(new Float32Array(data).buffer) : data),
    };
  });
}

describe("wasm GatherV2", () => {
  beforeAll(async () => {
    await initBackend("wasm");
  });

  it("equals the cpu backend's on every axis, dtype and index shape", async () => {
    const cases: [number[], number[], number[], number][] = [
      // x shape, index shape, index values (taken mod the axis length), axis
      [[7], [5], [3, 0, 6, 3, 1], 0],
      [[512, 40], [9], [0, 511, 7, 7, 300, 2, 1, 0, 44], 0], // rows of 40: copied whole
      [[40, 512], [9], [0, 511, 7, 7, 300, 2, 1, 0, 44], 1], // an embedding held transposed: columns
      [[3, 6, 5, 4], [2, 3], [5, 0, 2, 2, 1, 4], 1], // 2-D indices, slices of 20
      [[3, 6, 5, 4], [4], [3, 0, 3, 1], 3],
      [[2, 3, 4], [0], [], 1], // no index: empty output
      [[0, 4], [3], [0, 0, 0], 1], // empty input
    ];
    for (const dtype of ["float32", "int32"] as const)
      for (const [shape, idShape, idVals, axis] of cases) {
        const size = shape.reduce((p, d) => p * d, 1);
        const v = Array.from({ length: size }, (_, i) =>
          dtype === "int32" ? Math.floor(rng.normal() * 1e6) : i % 17 === 0 ? NaN : i % 13 === 0 ? -0 : rng.normal(),
        );
        const ids = { v: idVals.map((i) => (shape[axis] ? i % shape[axis] : i)), shape: idShape };
        const want = await gatherOn("cpu", { v, shape, dtype }, ids, axis);
        const got = await gatherOn("wasm", { v, shape, dtype }, ids, axis);
        expect(got, `${dtype} ${JSON.stringify(shape)} axis ${axis}`).toEqual(want);
      }
  });

  it("an index out of range fails as tfjs' kernel does, and tensor counts stay flat", () => {
    const x = tf.ones([4, 6]),
      ids = tf.tensor1d([1, 6], "int32");
    const before = tf.memory().numTensors;
    expect(() => tf.gather(x, ids, 1)).toThrow("GatherV2: the index value 6 is not in [0, 5]");
    expect(() => tf.gather(x, tf.tensor1d([-1], "int32"), 0)).toThrow("GatherV2: the index value -1 is not in [0, 3]");
    tf.tidy(() => {
      tf.gather(x, tf.tensor1d([3, 0], "int32"), 0);
    });
    expect(tf.memory().numTensors).toBe(before + 1); // the -1 index tensor above
    tf.dispose([x, ids]);
  });
});
