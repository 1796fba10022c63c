/** Weight-only quantization of the frozen base, stored in tfjs int32 tensors (tfjs has no uint8) and
 *  dequantized on the backend inside the forward, one matrix at a time.
 *  - int8: symmetric, one absmax scale per output channel; 4 codes per int32.
 *  - nf4: QLoRA's 16-value NormalFloat code book, one absmax per block of 64 consecutive weights of an
 *    output channel (bitsandbytes' order on torch's [out, in] layout); 8 codes per int32.
 *  Matrices are held as [in, out] (the layout the wasm matMul fast path wants). Codes are packed along
 *  the `in` axis in slabs: byte/nibble k of packed[i, j] is the code of row k·(inPad/per) + i, so the
 *  unpacked slabs simply concatenate back. Leaves out: double quantization of the absmax values. */
import * as tf from "@tensorflow/tfjs";
import { DEQUANTIZE, hasDequantizeKernel, type DequantizeAttrs } from "../kernels/dequant.ts";
import { backendProfile } from "../kernels/profile.ts";

/** bitsandbytes' NF4 code book (bitsandbytes/functional.py, get_4bit_type "nf4"). */
export const NF4_CODE = new Float32Array([
  -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635, -0.18477343022823334, -0.09105003625154495,
  0.0, 0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
  0.7229568362236023, 1.0,
]);
export const NF4_BLOCK = 64;

export type QuantKind = "int8" | "nf4";

/** Pure. w is [rows=in, cols=out] row-major; q[i·cols+j] = round(w / scale[j]) in [-127, 127]. */
export function quantizeInt8(w: Float32Array, rows: number, cols: number): { q: Int8Array; scale: Float32Array } {
  const scale = new Float32Array(cols);
  for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) scale[j] = Math.max(scale[j], Math.abs(w[i * cols + j]));
  for (let j = 0; j < cols; j++) scale[j] = scale[j] / 127;
  const q = new Int8Array(rows * cols);
  for (let i = 0; i < rows; i++)
    for (let j = 0; j < cols; j++) {
      const s = scale[j];
      q[i * cols + j] = s === 0 ? 0 : Math.max(-127, Math.min(127, Math.round(w[i * cols + j] / s)));
    }
  return { q, scale };
}

export function dequantizeInt8(q: Int8Array, scale: Float32Array, rows: number, cols: number): Float32Array {
  const w = new Float32Array(rows * cols);
  for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) w[i * cols + j] = q[i * cols + j] * scale[j];
  return w;
}

/** Index of the nearest NF4 code value (ties to the lower code, as the bitsandbytes thresholds do). */
export function nf4Code(x: number): number {
  let best = 0;
  for (let c = 1; c < 16; c++) if (Math.abs(x - NF4_CODE[c]) < Math.abs(x - NF4_CODE[best])) best = c;
  return best;
}

/** Pure. Blocks of 64 consecutive rows of each column (rows padded to a multiple of 64 with zeros).
 *  codes[i·cols+j] ∈ 0..15 for i < rowsPad; absmax is [rowsPad/64, cols]. */
export function quantizeNf4(w: Float32Array, rows: number, cols: number): { codes: Uint8Array; absmax: Float32Array; rowsPad: number } {
  const rowsPad = Math.ceil(rows / NF4_BLOCK) * NF4_BLOCK;
  const nb = rowsPad / NF4_BLOCK;
  const absmax = new Float32Array(nb * cols);
  for (let i = 0; i < rows; i++)
    for (let j = 0; j < cols; j++) {
      const k = Math.floor(i / NF4_BLOCK) * cols + j;
      absmax[k] = Math.max(absmax[k], Math.abs(w[i * cols + j]));
    }
  const codes = new Uint8Array(rowsPad * cols).fill(7); // code 7 is exactly 0.0 (the padding)
  for (let i = 0; i < rows; i++)
    for (let j = 0; j < cols; j++) {
      const m = absmax[Math.floor(i / NF4_BLOCK) * cols + j];
      codes[i * cols + j] = m === 0 ? 7 : nf4Code(w[i * cols + j] / m);
    }
  return { codes, absmax, rowsPad };
}

export function dequantizeNf4(codes: Uint8Array, absmax: Float32Array, rows: number, cols: number): Float32Array {
  const w = new Float32Array(rows * cols);
  for (let i = 0; i < rows; i++)
    for (let j = 0; j < cols; j++) w[i * cols + j] = NF4_CODE[codes[i * cols + j]] * absmax[Math.floor(i / NF4_BLOCK) * cols + j];
  return w;
}

/** Pure. `bits`-bit unsigned codes [rowsPad, cols] → int32 [rowsPad/per, cols], per = 32/bits, slab layout. */
export function packCodes(codes: Uint8Array, rowsPad: number, cols: number, bits: 4 | 8): Int32Array {
  const per = 32 / bits;
  const pr = rowsPad / per;
  const out = new Int32Array(pr * cols);
  for (let k = 0; k < per; k++)
    for (let i = 0; i < pr; i++) for (let j = 0; j < cols; j++) out[i * cols + j] |= codes[(k * pr + i) * cols + j] << (bits * k);
  return out;
}

/** A frozen [in, out] matrix held packed on the backend. */
export class QuantizedMatrix {
  private constructor(
    readonly kind: QuantKind,
    readonly inDim: number,
    readonly outDim: number,
    private readonly rowsPad: number,
    private readonly packed: tf.Tensor2D, // int32 [rowsPad/per, out]
    private readonly scales: tf.Tensor2D, // int8: [1, out]; nf4: [rowsPad/64, out]
  ) {}

  /** w: [in, out] row-major f32 (the caller's array is not kept). */
  static fromFloat32(kind: QuantKind, w: Float32Array, inDim: number, outDim: number): QuantizedMatrix {
    if (w.length !== inDim * outDim)
      throw new Error(`quantize ${kind}: data has ${w.length} values, [${inDim}, ${outDim}] needs ${inDim * outDim}`);
    if (kind === "int8") {
      const { q, scale } = quantizeInt8(w, inDim, outDim);
      const rowsPad = Math.ceil(inDim / 4) * 4;
      const u = new Uint8Array(rowsPad * outDim).fill(128); // offset binary: u = q + 128 (pad rows are 0)
      for (let i = 0; i < q.length; i++) u[i] = q[i] + 128;
      const packed = tf.tensor2d(packCodes(u, rowsPad, outDim, 8), [rowsPad / 4, outDim], "int32");
      return new QuantizedMatrix(kind, inDim, outDim, rowsPad, packed, tf.tensor2d(scale, [1, outDim]));
    }
    if (kind === "nf4") {
      const { codes, absmax, rowsPad } = quantizeNf4(w, inDim, outDim);
      const packed = tf.tensor2d(packCodes(codes, rowsPad, outDim, 4), [rowsPad / 8, outDim], "int32");
      return new QuantizedMatrix(kind, inDim, outDim, rowsPad, packed, tf.tensor2d(absmax, [rowsPad / NF4_BLOCK, outDim]));
    }
    throw new Error(`unknown quantization "${kind}"; accepted: int8, nf4`);
  }

  /** The tensors as held, for kernels that read them packed (kernels/webgpu/decode/): codes int32
   *  [rowsPad/per, out] in the slab layout, scales (int8: [1, out]; nf4: [rowsPad/64, out]). */
  get held(): { packed: tf.Tensor2D; scales: tf.Tensor2D; rowsPad: number } {
    return { packed: this.packed, scales: this.scales, rowsPad: this.rowsPad };
  }

  /** Bytes of the tensors held (packed codes + scales). */
  get bytes(): number {
    return 4 * (this.packed.size + this.scales.size);
  }

  /** f32 [in, out], computed on the backend. Call inside tf.tidy. */
  dequantize(): tf.Tensor2D {
    return this.unpack(this.packed, this.scales);
  }

  /** f32 [in, ids.length]: only the chosen columns (an embedding lookup on Eᵀ). Call inside tf.tidy. */
  columns(ids: tf.Tensor1D): tf.Tensor2D {
    if (!backendProfile().exactIntGather) return tf.gather(this.dequantize(), ids, 1) as tf.Tensor2D;
    const p = tf.gather(this.packed, ids, 1) as tf.Tensor2D;
    const s = tf.gather(this.scales, ids, 1) as tf.Tensor2D;
    return this.unpack(p, s);
  }

  private unpack(packed: tf.Tensor2D, scales: tf.Tensor2D): tf.Tensor2D {
    if (hasDequantizeKernel()) {
      const attrs: DequantizeAttrs = { kind: this.kind, inDim: this.inDim, table: Array.from(NF4_CODE), block: NF4_BLOCK };
      return tf.engine().runKernel(DEQUANTIZE, { packed, scales }, attrs as unknown as tf.NamedAttrMap) as tf.Tensor2D;
    }
    const bits = this.kind === "int8" ? 8 : 4;
    const per = 32 / bits,
      top = (1 << bits) >>> 0,
      field = top - 1;
    const slabs: tf.Tensor[] = [];
    for (let k = 0; k < per; k++) {
      // AND isolates field k as field·2^(bits·k): at most `bits` significant bits, so the float32
      // cast and the power-of-two scaling are exact. The top field carries the int32 sign bit, so
      // mod brings it back to 0..top-1.
      const mask = tf.fill(packed.shape, (field << (bits * k)) | 0, "int32");
      let v = tf.mul(tf.cast(tf.bitwiseAnd(packed, mask), "float32"), 2 ** (-bits * k));
      if (k === per - 1) v = tf.mod(v, top);
      slabs.push(v);
    }
    const codes = tf.concat(slabs, 0) as tf.Tensor2D; // [rowsPad, n] codes as floats
    const n = packed.shape[1];
    let w: tf.Tensor2D;
    if (this.kind === "int8") {
      w = tf.mul(tf.sub(codes, 128), scales);
    } else {
      const vals = tf.gather(tf.tensor1d(NF4_CODE), tf.cast(codes, "int32")) as unknown as tf.Tensor2D;
      const nb = this.rowsPad / NF4_BLOCK;
      w = tf.reshape(tf.mul(tf.reshape(vals, [nb, NF4_BLOCK, n]), tf.reshape(scales, [nb, 1, n])), [this.rowsPad, n]);
    }
    return this.rowsPad === this.inDim ? w : tf.slice(w, [0, 0], [this.inDim, n]);
  }

  dispose(): void {
    this.packed.dispose();
    this.scales.dispose();
  }
}
