/** The wasm Concat kernel (src/kernels/wasm/concat.ts) against the cpu backend's: every axis of 1-D to
 *  4-D tensors, float32, int32 and bool, empty inputs, one input, and flat tensor counts. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { Rng } from "../../src/util/rng.ts";

const rng = new Rng(5);
const values = (n: number, dtype: "float32" | "int32" | "bool") =>
  Array.from({ length: n }, () =>
    dtype === "float32" ? rng.normal() : dtype === "int32" ? Math.floor(rng.normal() * 1000) : rng.normal() > 0 ? 1 : 0,
  );

/** Concat on `backend` of tensors with the given shapes and values. */
async function concatOn(backend: string, shapes: number[][], vals: number[][], dtype: "float32" | "int32" | "bool", axis: number) {
  await tf.setBackend(backend);
  return tf.tidy(() => {
    const c = tf.concat(
      shapes.map((s, i) => tf.tensor(vals[i], s, dtype)),
      axis,
    );
    return { shape: c.shape, data: Array.from(c.dataSync()) };
  });
}

describe("wasm Concat", () => {
  beforeAll(async () => {
    await initBackend("wasm");
  });

  it("equals the cpu backend's on every axis, dtype, empty and single inputs", async () => {
    const cases: [number[][], number][] = [
      [[[5], [3], [1]], 0],
      [
        [
          [4, 3],
          [4, 5],
        ],
        1,
      ],
      [
        [
          [2, 3],
          [4, 3],
          [1, 3],
        ],
        0,
      ],
      [
        [
          [2, 3, 4],
          [2, 1, 4],
        ],
        1,
      ],
      [
        [
          [2, 3, 4],
          [2, 3, 7],
          [2, 3, 1],
        ],
        2,
      ],
      [
        [
          [8, 2, 64, 17],
          [8, 2, 64, 1],
        ],
        3,
      ], // a decode step's key append, [B, kv heads, head dim, positions]
      [
        [
          [2, 2, 3, 5],
          [2, 2, 0, 5],
          [2, 2, 2, 5],
        ],
        2,
      ], // an empty input among them
      [[[3, 4]], 1], // one input
      [
        [
          [0, 4],
          [0, 2],
        ],
        1,
      ], // empty output
    ];
    for (const dtype of ["float32", "int32", "bool"] as const)
      for (const [shapes, axis] of cases) {
        const vals = shapes.map((s) =>
          values(
            s.reduce((p, d) => p * d, 1),
            dtype,
          ),
        );
        const want = await concatOn("cpu", shapes, vals, dtype, axis);
        const got = await concatOn("wasm", shapes, vals, dtype, axis);
        expect(got, `${dtype} ${JSON.stringify(shapes)} axis ${axis}`).toEqual(want);
      }
  });

  it("keeps tensor counts flat", () => {
    const a = tf.ones([4, 6]),
      b = tf.zeros([4, 2]);
    tf.tidy(() => {
      tf.concat([a, b], 1);
    });
    const before = tf.memory().numTensors;
    for (let i = 0; i < 3; i++)
      tf.tidy(() => {
        tf.concat([a, b, a], 1);
      });
    expect(tf.memory().numTensors).toBe(before);
    tf.dispose([a, b]);
  });
});
