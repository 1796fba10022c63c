/** A GGUF v3 writer (little-endian; metadata of string, bool, u32, i32, f32 and arrays of them;
 *  tensors F32, F16 or Q8_0, aligned to 32 bytes, streamed to a temp file in chunks and renamed into
 *  place) and its tensor encoders. What goes into a file (Qwen2's names, the tokenizer, a LoRA) is
 *  gguf.ts'. Leaves out: reading GGUF, K-quants, BF16, big-endian files. */
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

export const GGML_TYPE = { F32: 0, F16: 1, Q8_0: 8 } as const;
export type GgmlType = (typeof GGML_TYPE)[keyof typeof GGML_TYPE];
const ALIGNMENT = 32;
export const Q8_BLOCK = 32; // Q8_0 block: f16 scale d, then 32 int8

/** A metadata value: a string or bool as is; numbers and number arrays say their GGUF type. */
export type GgufValue =
  | string
  | boolean
  | { type: "u32" | "i32" | "f32"; value: number }
  | { type: "string[]"; value: readonly string[] }
  | { type: "u32[]" | "i32[]" | "f32[]"; value: ArrayLike<number> };
export const u32 = (value: number): GgufValue => ({ type: "u32", value });
export const i32 = (value: number): GgufValue => ({ type: "i32", value });
export const f32 = (value: number): GgufValue => ({ type: "f32", value });

/** shape: torch order ([out, in]); the file holds it reversed (GGML's ne[0] is the innermost). */
export interface GgufTensor {
  name: string;
  shape: number[];
  type: GgmlType;
  data: Float32Array;
}

const VT = { u32: 4, i32: 5, f32: 6, bool: 7, string: 8, array: 9 } as const; // gguf_type

/** A growing little-endian byte buffer for the header. */
class Bytes {
  buf = new Uint8Array(1 << 16);
  len = 0;
  private view = new DataView(this.buf.buffer);
  private room(n: number) {
    if (this.len + n <= this.buf.length) return;
    const next = new Uint8Array(Math.max(this.buf.length * 2, this.len + n));
    next.set(this.buf.subarray(0, this.len));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }
  u32(v: number) {
    this.room(4);
    this.view.setUint32(this.len, v, true);
    this.len += 4;
  }
  i32(v: number) {
    this.room(4);
    this.view.setInt32(this.len, v, true);
    this.len += 4;
  }
  f32(v: number) {
    this.room(4);
    this.view.setFloat32(this.len, v, true);
    this.len += 4;
  }
  u64(v: number) {
    this.room(8);
    this.view.setBigUint64(this.len, BigInt(v), true);
    this.len += 8;
  }
  bytes(b: Uint8Array) {
    this.room(b.length);
    this.buf.set(b, this.len);
    this.len += b.length;
  }
  str(s: string) {
    const b = new TextEncoder().encode(s);
    this.u64(b.length);
    this.bytes(b);
  }
  pad() {
    this.bytes(new Uint8Array((ALIGNMENT - (this.len % ALIGNMENT)) % ALIGNMENT));
  }
}

/** type tag, then the value; an array is its element type, count, then the elements. */
function putValue(h: Bytes, v: GgufValue): void {
  if (typeof v === "string") {
    h.u32(VT.string);
    h.str(v);
  } else if (typeof v === "boolean") {
    h.u32(VT.bool);
    h.bytes(Uint8Array.of(v ? 1 : 0));
  } else if (!v.type.endsWith("[]")) {
    const t = v.type as "u32" | "i32" | "f32";
    h.u32(VT[t]);
    h[t]((v as { value: number }).value);
  } else putArray(h, v as Extract<GgufValue, { value: ArrayLike<unknown> }>);
}

function putArray(h: Bytes, v: Extract<GgufValue, { value: ArrayLike<unknown> }>): void {
  const elem = v.type.slice(0, -2) as "string" | "u32" | "i32" | "f32";
  h.u32(VT.array);
  h.u32(VT[elem]);
  h.u64(v.value.length);
  for (let i = 0; i < v.value.length; i++) {
    if (elem === "string") h.str((v.value as readonly string[])[i]);
    else h[elem]((v.value as ArrayLike<number>)[i]);
  }
}

export function tensorBytes(shape: number[], type: GgmlType): number {
  const n = shape.reduce((a, b) => a * b, 1);
  return type === GGML_TYPE.F32 ? 4 * n : type === GGML_TYPE.F16 ? 2 * n : (n / Q8_BLOCK) * (2 + Q8_BLOCK);
}

/** Write a GGUF v3 file atomically (temp name beside it, then rename). Tensor data is encoded and
 *  written a few MB at a time, so the file is never held whole. Returns its size in bytes. */
export async function writeGguf(file: string, kv: Record<string, GgufValue>, tensors: GgufTensor[]): Promise<number> {
  if (os.endianness() !== "LE") throw new Error("writeGguf: only little-endian hosts are supported");
  const h = new Bytes();
  const meta = { ...kv, "general.alignment": u32(ALIGNMENT) };
  h.bytes(new TextEncoder().encode("GGUF"));
  h.u32(3); // version
  h.u64(tensors.length);
  h.u64(Object.keys(meta).length);
  for (const [key, v] of Object.entries(meta)) {
    h.str(key);
    putValue(h, v);
  }
  let offset = 0; // from the start of the data section
  for (const t of tensors) {
    const n = t.shape.reduce((a, b) => a * b, 1);
    if (t.data.length !== n) throw new Error(`writeGguf: ${t.name} has ${t.data.length} values, shape [${t.shape}] holds ${n}`);
    if (t.type === GGML_TYPE.Q8_0 && t.shape[t.shape.length - 1] % Q8_BLOCK !== 0)
      throw new Error(`writeGguf: ${t.name} [${t.shape}]: Q8_0 needs rows of a multiple of ${Q8_BLOCK} values`);
    h.str(t.name);
    h.u32(t.shape.length);
    for (const d of [...t.shape].reverse()) h.u64(d);
    h.u32(t.type);
    h.u64(offset);
    offset += Math.ceil(tensorBytes(t.shape, t.type) / ALIGNMENT) * ALIGNMENT;
  }
  h.pad();
  await fs.mkdir(path.dirname(file), { recursive: true });
  const tmp = `${file}.${process.pid}.${Date.now()}.tmp`; // the name cleanTempFiles knows
  const out = await fs.open(tmp, "w");
  try {
    await out.write(h.buf.subarray(0, h.len));
    for (const t of tensors) {
      const row = t.shape[t.shape.length - 1] ?? 1;
      const step = Math.max(row, Math.floor((1 << 20) / row) * row); // whole rows, ~1M values a chunk
      let written = 0;
      for (let i = 0; i < t.data.length; i += step) {
        const chunk = encode(t.data.subarray(i, Math.min(t.data.length, i + step)), t.type);
        await out.write(chunk);
        written += chunk.length;
      }
      await out.write(new Uint8Array((ALIGNMENT - (written % ALIGNMENT)) % ALIGNMENT));
    }
    await out.sync(); // on disk before the name is: a crash leaves the old file or the whole new one
    await out.close();
    await fs.rename(tmp, file);
  } catch (err) {
    await out.close().catch(() => {});
    await fs.rm(tmp, { force: true });
    throw err;
  }
  return h.len + offset;
}

function encode(x: Float32Array, type: GgmlType): Uint8Array {
  if (type === GGML_TYPE.F32) return new Uint8Array(x.buffer, x.byteOffset, x.byteLength);
  return type === GGML_TYPE.F16 ? encodeF16(x) : encodeQ8_0(x);
}

// ---------------------------------------------------------------- encoders

const f32Box = new Float32Array(1);
const f32Bits = new Uint32Array(f32Box.buffer);

/** IEEE half bits of x, rounded to nearest even (numpy's astype(float16)); overflow → ±inf. */
export function f32ToF16Bits(x: number): number {
  f32Box[0] = x;
  return halfOfBits(f32Bits[0]);
}

/** The same from a float32's bits. */
function halfOfBits(f: number): number {
  const sign = (f >>> 16) & 0x8000;
  const exp = (f >>> 23) & 0xff;
  const mant = f & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 | (mant >>> 13) : 0); // inf, nan
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e > 0) {
    // normal: keep 10 mantissa bits; a carry from rounding moves into the exponent, as it should
    const h = (e << 10) | (mant >>> 13),
      rem = mant & 0x1fff;
    return sign | (rem > 0x1000 || (rem === 0x1000 && h & 1) ? h + 1 : h);
  }
  // subnormal: the value is m·2⁻²⁴ with m = 1.mant >> (14 − e); below 2⁻²⁵ it rounds to zero
  const shift = 14 - e;
  if (shift > 24) return sign;
  const full = mant | 0x800000,
    m = full >>> shift,
    rem = full & ((1 << shift) - 1),
    half = 1 << (shift - 1);
  return sign | (rem > half || (rem === half && m & 1) ? m + 1 : m);
}

export function encodeF16(x: Float32Array): Uint8Array {
  const bits = new Uint32Array(x.buffer, x.byteOffset, x.length);
  const out = new Uint16Array(x.length);
  for (let i = 0; i < x.length; i++) out[i] = halfOfBits(bits[i]);
  return new Uint8Array(out.buffer);
}

/** Q8_0 as ggml's quantize_row_q8_0_ref: per block of 32, d = max|x| / 127 (stored as f16) and
 *  q = round(x / d) (half away from zero), in float32 arithmetic. */
export function encodeQ8_0(x: Float32Array): Uint8Array {
  if (x.length % Q8_BLOCK !== 0) throw new Error(`encodeQ8_0: ${x.length} values is not a multiple of ${Q8_BLOCK}`);
  const out = new Uint8Array((x.length / Q8_BLOCK) * (2 + Q8_BLOCK));
  const q = new Int8Array(out.buffer);
  for (let b = 0, o = 0; b < x.length; b += Q8_BLOCK, o += 2 + Q8_BLOCK) {
    let amax = 0;
    for (let j = 0; j < Q8_BLOCK; j++) amax = Math.max(amax, Math.abs(x[b + j]));
    const d = Math.fround(amax / 127);
    const id = d === 0 ? 0 : Math.fround(1 / d);
    const h = f32ToF16Bits(d);
    out[o] = h & 0xff;
    out[o + 1] = h >>> 8;
    for (let j = 0; j < Q8_BLOCK; j++) {
      const v = Math.fround(x[b + j] * id); // roundf: half away from zero (v + 0.5 is exact in f64)
      q[o + 2 + j] = v >= 0 ? Math.floor(v + 0.5) : -Math.floor(0.5 - v);
    }
  }
  return out;
}
