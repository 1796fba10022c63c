/** The kernels the project adds for webgpu, against host references: int8/NF4 dequantization (a WGSL
 *  program), including the column lookup an embedding uses. */
import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../../src/kernels/backend.ts";
import { QuantizedMatrix, dequantizeInt8, dequantizeNf4, quantizeInt8, quantizeNf4 } from "../../../src/model/quant.ts";
import { Rng } from "../../../src/util/rng.ts";
import { webgpuForTests } from "./helpers/adapter.ts";

const gpu = await webgpuForTests();
const randn = (n: number, seed: number) => {
  const r = new Rng(seed);
  return Float32Array.from({ length: n }, () => r.normal());
};

describe.skipIf(!gpu)("webgpu kernels", () => {
  it("dequantizes int8 and NF4 exactly as the host reference, whole and by columns", async () => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    const rows = 200,
      cols = 7,
      w = randn(rows * cols, 11); // 200 rows: padding to 4 (int8) and 64 (nf4)
    const refs = {
      int8: (() => {
        const { q, scale } = quantizeInt8(w, rows, cols);
        return dequantizeInt8(q, scale, rows, cols);
      })(),
      nf4: (() => {
        const { codes, absmax } = quantizeNf4(w, rows, cols);
        return dequantizeNf4(codes, absmax, rows, cols);
      })(),
    };
    const before = tf.memory().numTensors;
    for (const kind of ["int8", "nf4"] as const) {
      const m = QuantizedMatrix.fromFloat32(kind, w, rows, cols);
      const d = tf.tidy(() => m.dequantize());
      expect(Array.from(await d.data()), kind).toEqual(Array.from(refs[kind]));
      const ids = [6, 0, 3, 3];
      const c = tf.tidy(() => m.columns(tf.tensor1d(ids, "int32"))); // [rows, ids.length]
      const got = await c.array();
      const want = Array.from({ length: rows }, (_, i) => ids.map((j) => refs[kind][i * cols + j]));
      expect(got, `${kind} columns`).toEqual(want);
      tf.dispose([d, c]);
      m.dispose();
    }
    expect(tf.memory().numTensors).toBe(before);
  });
});
