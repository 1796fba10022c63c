/** int8 / NF4: hand values, round-trip error bounds, backend unpacking equals the host reference,
 *  bytes held, and the logits error of a quantized qwen2-tiny against f32. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { loadModel } from "../../src/model/load.ts";
import {
  dequantizeInt8,
  dequantizeNf4,
  NF4_CODE,
  nf4Code,
  packCodes,
  QuantizedMatrix,
  quantizeInt8,
  quantizeNf4,
} from "../../src/model/quant.ts";
import { Rng } from "../../src/util/rng.ts";

const FIX = "test/fixtures/qwen2-tiny";
const randn = (n: number, seed: number) => {
  const r = new Rng(seed);
  return Float32Array.from({ length: n }, () => r.normal());
};

describe("quantization, pure functions", () => {
  it("int8: per-output-channel absmax/127 scale and rounding on hand values", () => {
    // [in=2, out=2]: column 0 absmax 2 → scale 2/127; column 1 absmax 0.5
    const { q, scale } = quantizeInt8(new Float32Array([2, -0.5, -1.5, 0.3]), 2, 2);
    expect(Array.from(scale)).toEqual([Math.fround(2 / 127), Math.fround(0.5 / 127)]);
    expect(Array.from(q)).toEqual([127, -127, -95, 76]); // −1.5·127/2 = −95.25, 0.3·127/0.5 = 76.2
  });
  it("nf4: code book is bitsandbytes', nearest-code lookup, blocks of 64 along `in`", () => {
    expect(NF4_CODE.length).toBe(16);
    expect(NF4_CODE[0]).toBe(-1);
    expect(NF4_CODE[7]).toBe(0);
    expect(NF4_CODE[15]).toBe(1);
    expect(nf4Code(0.07)).toBe(8);
    expect(nf4Code(-0.65)).toBe(1); // −0.696 is nearer than −0.525
    expect(nf4Code(0.03)).toBe(7);
    // 70 rows × 1 col: block 0 = rows 0..63 (absmax 4), block 1 = rows 64..69 (absmax 0.5)
    const w = new Float32Array(70);
    w.fill(1, 0, 64);
    w[3] = -4;
    w[64] = 0.5;
    w[65] = -0.25;
    const { codes, absmax, rowsPad } = quantizeNf4(w, 70, 1);
    expect(rowsPad).toBe(128);
    expect(Array.from(absmax)).toEqual([4, 0.5]);
    expect(codes[3]).toBe(0); // −4/4 = −1
    expect(codes[0]).toBe(nf4Code(0.25)); // 1/4
    expect(codes[64]).toBe(15);
    expect(codes[100]).toBe(7); // padding is code 7 = 0.0
  });
  it("round-trip error is within half a quantization step", () => {
    const rows = 96,
      cols = 40,
      w = randn(rows * cols, 3);
    const { q, scale } = quantizeInt8(w, rows, cols);
    const w8 = dequantizeInt8(q, scale, rows, cols);
    for (let i = 0; i < w.length; i++) expect(Math.abs(w8[i] - w[i])).toBeLessThanOrEqual(scale[i % cols] / 2 + 1e-6);
    const { codes, absmax } = quantizeNf4(w, rows, cols);
    const w4 = dequantizeNf4(codes, absmax, rows, cols);
    let maxGap = 0; // widest gap between neighbouring codes bounds the error at half of it × absmax
    for (let c = 1; c < 16; c++) maxGap = Math.max(maxGap, NF4_CODE[c] - NF4_CODE[c - 1]);
    for (let i = 0; i < rows; i++)
      for (let j = 0; j < cols; j++) {
        const m = absmax[Math.floor(i / 64) * cols + j];
        expect(Math.abs(w4[i * cols + j] - w[i * cols + j])).toBeLessThanOrEqual((maxGap / 2) * m + 1e-6);
      }
  });
  it("packs 8-bit and 4-bit codes into int32 slabs", () => {
    // rowsPad 4, cols 1, 8-bit: byte k holds row k
    expect(Array.from(packCodes(new Uint8Array([1, 2, 3, 255]), 4, 1, 8))).toEqual([(255 << 24) | (3 << 16) | (2 << 8) | 1]);
    expect(Array.from(packCodes(new Uint8Array([1, 2, 3, 4, 5, 6, 7, 15]), 8, 1, 4))).toEqual([0xf7654321 | 0]);
  });
});

describe("quantized matrices on the backend (wasm)", () => {
  beforeAll(async () => {
    await initBackend("wasm");
  });
  it("dequantize and column gathers equal the host reference exactly; bytes ≤ 0.3× f32", async () => {
    const rows = 176,
      cols = 24,
      w = randn(rows * cols, 5);
    const before = tf.memory().numTensors;
    for (const kind of ["int8", "nf4"] as const) {
      const m = QuantizedMatrix.fromFloat32(kind, w, rows, cols);
      const host =
        kind === "int8"
          ? (() => {
              const { q, scale } = quantizeInt8(w, rows, cols);
              return dequantizeInt8(q, scale, rows, cols);
            })()
          : (() => {
              const { codes, absmax } = quantizeNf4(w, rows, cols);
              return dequantizeNf4(codes, absmax, rows, cols);
            })();
      const d = tf.tidy(() => m.dequantize());
      expect(d.shape).toEqual([rows, cols]);
      expect(Array.from(await d.data())).toEqual(Array.from(host));
      const c = tf.tidy(() => m.columns(tf.tensor1d([5, 0, 5, 23], "int32")));
      const cv = (await c.array()) as number[][];
      for (let i = 0; i < rows; i++) expect(cv[i]).toEqual([5, 0, 5, 23].map((j) => host[i * cols + j]));
      tf.dispose([d, c]);
      console.log(`${kind}: ${m.bytes} bytes held vs f32 ${4 * rows * cols} (${(m.bytes / (4 * rows * cols)).toFixed(3)}×)`);
      expect(m.bytes).toBeLessThanOrEqual(0.3 * 4 * rows * cols);
      m.dispose();
    }
    expect(tf.memory().numTensors).toBe(before);
  });

  it("quantized qwen2-tiny: the quantized linear layers take ≤ 0.3× their f32 bytes, embeddings stay f32, bounded logits error", async () => {
    const ids = [
      [16, 217, 62, 54, 40, 191, 113, 143],
      [0, 0, 56, 61, 139, 212, 80, 20],
    ];
    const mask = [
      [1, 1, 1, 1, 1, 1, 1, 1],
      [0, 0, 1, 1, 1, 1, 1, 1],
    ];
    const ref = await loadModel(FIX);
    const want = ref.forward(ids, mask);
    const wv = await want.data();
    const f32Bytes = ref.linearBytes();
    // Random weights make every 4-bit rounding error count: an NF4 step is ~16× an int8 step, and the
    // measured errors are 1.7e-2 (int8) and 2.4e-1 (nf4) on logits of scale ~0.5.
    const bounds = { int8: 0.03, nf4: 0.35 };
    for (const q of ["int8", "nf4"] as const) {
      const m = await loadModel(FIX, { quantize: q, adapter: `${FIX}/lora` });
      const got = m.forward(ids, mask, { adapters: false });
      const gv = await got.data();
      let err = 0,
        scale = 0;
      for (let i = 0; i < gv.length; i++)
        if (mask[Math.floor(i / (8 * 256))][Math.floor(i / 256) % 8]) {
          err = Math.max(err, Math.abs(gv[i] - wv[i]));
          scale = Math.max(scale, Math.abs(wv[i]));
        }
      const ratio = m.linearBytes() / f32Bytes;
      console.log(
        `${q}: linear layers ${m.linearBytes()} bytes = ${ratio.toFixed(3)}× f32; whole base ${(m.baseBytes() / ref.baseBytes()).toFixed(3)}× f32; logits max |Δ| ${err.toExponential(2)} (logit scale ${scale.toFixed(3)})`,
      );
      expect(ratio).toBeLessThanOrEqual(0.3);
      // QLoRA / bitsandbytes keep the embedding (and head) in full precision
      expect(m.weights.embedT.quant).toBeNull();
      expect(m.weights.layers[0].proj.qkv_proj.quant).not.toBeNull();
      expect(m.baseBytes() - m.linearBytes()).toBe(ref.baseBytes() - ref.linearBytes());
      expect(err).toBeLessThanOrEqual(bounds[q]);
      // the LoRA still trains through the quantized base (custom gradient re-dequantizes)
      const { grads, value } = tf.variableGrads(() => tf.mean(m.tokenLogprobs(ids, mask).logprobs) as tf.Scalar, m.trainableVariables());
      expect(Object.keys(grads).length).toBe(m.trainableVariables().length);
      expect(Number.isFinite((await value.data())[0])).toBe(true);
      tf.dispose([value, grads, got]);
      m.dispose();
    }
    want.dispose();
    ref.dispose();
  });
});
