import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/engine/backend.ts";
import { QuantizedMatrix, dequantizeInt8, dequantizeNf4, quantizeInt8, quantizeNf4 } from "../../src/model/quant.ts";
import { Rng } from "../../src/util/rng.ts";

const randn = (n: number, seed: number) => {
  const r = new Rng(seed);
  return Float32Array.from({ length: n }, () => r.normal());
};

describe("dequantize kernel", () => {
  it("gives the host reference exactly on the cpu and wasm backends", async () => {
    await initBackend("wasm");
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
    for (const backend of ["cpu", "wasm"]) {
      await tf.setBackend(backend);
      for (const kind of ["int8", "nf4"] as const) {
        const m = QuantizedMatrix.fromFloat32(kind, w, rows, cols);
        const d = tf.tidy(() => m.dequantize());
        expect(Array.from(await d.data()), `${backend} ${kind}`).toEqual(Array.from(refs[kind]));
        tf.dispose(d);
        m.dispose();
      }
    }
    await tf.setBackend("wasm");
  });
});
