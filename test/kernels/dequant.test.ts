/** The dequantize kernel (src/kernels/dequant.ts): the model's matrices come back as the host
 *  reference on cpu and wasm, and on wasm the heap module's kernel (heap-dequant-code.ts) gives
 *  dequantizeInto's bits exactly, for int8 and NF4, at shapes that leave partial words, partial
 *  vectors of columns and NF4 blocks across slabs, on the calling thread alone and split over the
 *  helper threads; tensor counts stay flat. */
import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { DEQUANTIZE, dequantizeInto, type DequantizeAttrs } from "../../src/kernels/dequant.ts";
import { heapHelpersReady, heapModule, splitJobCount } from "../../src/kernels/wasm/heap.ts";
import { heapOffset } from "../../src/kernels/kernels.ts";
import { wasmThreads } from "../../src/kernels/wasm/threads.ts";
import { NF4_BLOCK, NF4_CODE, QuantizedMatrix, dequantizeInt8, dequantizeNf4, quantizeInt8, quantizeNf4 } from "../../src/model/quant.ts";
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

  /** Random packed words (every code, the padding rows' too) and scales for [inDim, n]. */
  const operands = (kind: "int8" | "nf4", inDim: number, n: number, seed: number) => {
    const per = kind === "int8" ? 4 : 8,
      rowsPad = Math.ceil(inDim / (kind === "int8" ? 4 : NF4_BLOCK)) * (kind === "int8" ? 4 : NF4_BLOCK),
      P = rowsPad / per,
      S = kind === "int8" ? 1 : rowsPad / NF4_BLOCK;
    const r = new Rng(seed);
    const packed = Int32Array.from({ length: P * n }, () => (r.next() * 2 ** 32) | 0);
    // scales of every magnitude, subnormal products among them (rounded the same in f64 then f32 as in f32)
    const scales = Float32Array.from({ length: S * n }, (_, i) => (i % 5 === 4 ? 3e-39 : Math.abs(r.normal()) * 10 ** ((i % 7) - 3)));
    const attrs: DequantizeAttrs = { kind, inDim, table: Array.from(NF4_CODE), block: NF4_BLOCK };
    const want = new Float32Array(inDim * n);
    dequantizeInto(want, packed, scales, P, n, attrs);
    return { packed, scales, attrs, want, P, S };
  };
  const bytes = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);

  // [inDim, n]: inDim off the codes per word (int8) or the 64-row blocks (nf4, whose slabs of P rows
  // then cross block boundaries), n off 4 and 8; the last two of each reach 64 K outputs (split).
  const shapes: Record<"int8" | "nf4", [number, number][]> = {
    int8: [
      [1, 1],
      [3, 5],
      [203, 13],
      [9, 8],
      [330, 203],
      [1021, 70],
    ],
    nf4: [
      [1, 3],
      [130, 7],
      [200, 9],
      [64, 12],
      [333, 203],
      [1000, 69],
    ],
  };

  it("on wasm, the heap module's kernel gives dequantizeInto's bits, on one thread and split over the helper threads", async () => {
    await initBackend("wasm");
    await tf.setBackend("wasm");
    const be = tf.backend();
    await heapHelpersReady(be); // they start in the background with the heap module
    const e = heapModule(be),
      table = e.malloc(64) >>> 0;
    new Float32Array(e.memory.buffer, table, 16).set(NF4_CODE);
    let seed = 1;
    try {
      for (const kind of ["int8", "nf4"] as const)
        for (const [inDim, n] of shapes[kind]) {
          const label = `${kind} [${inDim}, ${n}]`;
          const { packed, scales, attrs, want, P, S } = operands(kind, inDim, n, seed++);
          const pt = tf.tensor2d(packed, [P, n], "int32"),
            st = tf.tensor2d(scales, [S, n]);
          const before = tf.memory().numTensors,
            splits = splitJobCount();
          // through the op: split over the helpers from 64 K outputs where the backend has them
          const got = tf.engine().runKernel(DEQUANTIZE, { packed: pt, scales: st }, attrs as unknown as tf.NamedAttrMap) as tf.Tensor;
          expect(got.shape, label).toEqual([inDim, n]);
          expect(bytes((await got.data()) as Float32Array).equals(bytes(want)), `${label}, op`).toBe(true);
          tf.dispose(got);
          expect(tf.memory().numTensors, label).toBe(before);
          const split = wasmThreads() > 1 && inDim * n >= 64 * 1024 ? 1 : 0;
          expect(splitJobCount() - splits, `${label}: split`).toBe(split);
          // the kernel itself over every packed row on this thread, into an output of NaN
          const out = tf.fill([inDim, n], NaN);
          const k = kind === "int8" ? e.k.dequantInt8 : e.k.dequantNf4;
          k(heapOffset(be, pt), heapOffset(be, st), heapOffset(be, out), 0, P, P, n, inDim, NF4_BLOCK, table);
          expect(bytes((await out.data()) as Float32Array).equals(bytes(want)), `${label}, one thread`).toBe(true);
          tf.dispose([out, pt, st]);
        }
    } finally {
      e.free(table);
    }
  });

  it("on wasm, selected columns (an embedding lookup) equal the cpu backend's, and tensor counts stay flat", async () => {
    await initBackend("wasm");
    const rows = 130,
      cols = 21,
      w = randn(rows * cols, 5),
      ids = [20, 0, 7, 7, 13];
    const pick = async (backend: string, kind: "int8" | "nf4") => {
      await tf.setBackend(backend);
      const m = QuantizedMatrix.fromFloat32(kind, w, rows, cols),
        before = tf.memory().numTensors;
      const d = tf.tidy(() => m.columns(tf.tensor1d(ids, "int32")));
      const v = (await d.data()) as Float32Array;
      tf.dispose(d);
      expect(tf.memory().numTensors, `${backend} ${kind}`).toBe(before);
      m.dispose();
      return bytes(v.slice());
    };
    for (const kind of ["int8", "nf4"] as const) expect((await pick("wasm", kind)).equals(await pick("cpu", kind)), kind).toBe(true);
    await tf.setBackend("wasm");
  });
});
