/** GGUF out, for llama.cpp, LM Studio and Ollama: a GGUF v3 writer (little-endian; metadata of string,
 *  bool, u32, i32, f32 and arrays of them; tensors F32, F16 or Q8_0, aligned to 32 bytes, streamed to a
 *  temp file in chunks and renamed into place), the Qwen2 base with its tokenizer as llama.cpp's
 *  convert_hf_to_gguf.py writes it, and a PEFT adapter as convert_lora_to_gguf.py writes it.
 *  The base comes from stateDict(model): the weights the trainer runs (an int8/NF4 base dequantized),
 *  so llama.cpp samples the trainer's policy. Leaves out: reading GGUF, K-quants, BF16, big-endian
 *  files, sharded output, tokenizers other than Qwen2's byte-level BPE. */
import { createHash } from "node:crypto";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { exists } from "../util/fs.ts";
import { checkGguf } from "./gguf-check.ts";
import type { Qwen2ForCausalLM } from "./qwen2.ts";
import type { HostTensor } from "./safetensors.ts";
import { stateDict } from "./save.ts";
import type { Qwen2Config } from "./types.ts";

// ---------------------------------------------------------------- writer core

export const GGML_TYPE = { F32: 0, F16: 1, Q8_0: 8 } as const;
export type GgmlType = (typeof GGML_TYPE)[keyof typeof GGML_TYPE];
const ALIGNMENT = 32;
const Q8_BLOCK = 32; // Q8_0 block: f16 scale d, then 32 int8

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

// ---------------------------------------------------------------- Qwen2 names and metadata

/** Hugging Face module → GGUF tensor (gguf-py constants.py / tensor_mapping.py). */
const LAYER_NAMES: Record<string, string> = {
  input_layernorm: "attn_norm",
  post_attention_layernorm: "ffn_norm",
  "self_attn.q_proj": "attn_q",
  "self_attn.k_proj": "attn_k",
  "self_attn.v_proj": "attn_v",
  "self_attn.o_proj": "attn_output",
  "mlp.gate_proj": "ffn_gate",
  "mlp.up_proj": "ffn_up",
  "mlp.down_proj": "ffn_down",
};
const TOP_NAMES: Record<string, string> = {
  "model.embed_tokens.weight": "token_embd.weight",
  "model.norm.weight": "output_norm.weight",
  "lm_head.weight": "output.weight",
};

/** `model.layers.3.self_attn.q_proj.bias` → `blk.3.attn_q.bias`. */
export function ggufName(hf: string): string {
  if (TOP_NAMES[hf]) return TOP_NAMES[hf];
  const m = /^model\.layers\.(\d+)\.(.+)\.(weight|bias)$/.exec(hf);
  if (!m || !LAYER_NAMES[m[2]]) throw new Error(`ggufName: no GGUF name for tensor ${hf}`);
  return `blk.${m[1]}.${LAYER_NAMES[m[2]]}.${m[3]}`;
}

export type WeightType = "f32" | "f16" | "q8_0";
export const WEIGHT_TYPES: readonly WeightType[] = ["f32", "f16", "q8_0"];
const FILE_TYPE: Record<WeightType, number> = { f32: 0, f16: 1, q8_0: 7 }; // LlamaFileType

/** Norms, biases and every 1-D tensor stay F32. Q8_0 needs rows of a multiple of 32: a tensor
 *  without them is written F16 (convert_hf_to_gguf.py falls back the same way). */
function tensorType(name: string, shape: number[], type: WeightType): GgmlType {
  if (shape.length < 2 || !/\.(weight|lora_a|lora_b)$/.test(name) || /norm\.weight$/.test(name)) return GGML_TYPE.F32;
  if (type === "q8_0") return shape[shape.length - 1] % Q8_BLOCK === 0 ? GGML_TYPE.Q8_0 : GGML_TYPE.F16;
  return type === "f16" ? GGML_TYPE.F16 : GGML_TYPE.F32;
}

async function readJson(file: string): Promise<Record<string, any>> {
  try {
    return JSON.parse(await fs.readFile(file, "utf8"));
  } catch (err) {
    throw new Error(`${file}: cannot read it as JSON (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
  }
}

/** The same split the tokenizer.json of Qwen2/2.5 does before BPE: what llama.cpp's "qwen2" pre means. */
const QWEN2_SPLIT =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/** tokenizer.ggml.* and the chat template from a tokenizer folder, as convert_hf_to_gguf.py's
 *  _set_vocab_gpt2 + SpecialVocab write them: every id below vocabSize ([PADi], unused, for holes),
 *  types 1 normal / 3 control (special added tokens, and <|…|>) / 4 user-defined (other added ones). */
export async function tokenizerMetadata(dir: string, cfg: Qwen2Config): Promise<Record<string, GgufValue>> {
  const tokFile = path.join(dir, "tokenizer.json");
  const tok = await readJson(tokFile);
  const tc = await readJson(path.join(dir, "tokenizer_config.json"));
  if (tok.model?.type !== "BPE") throw new Error(`${tokFile}: model type ${tok.model?.type}; expected a byte-level BPE (Qwen2) tokenizer`);
  const splits = JSON.stringify(tok.pre_tokenizer ?? {});
  if (!splits.includes(JSON.stringify(QWEN2_SPLIT)))
    throw new Error(`${tokFile}: the pre-tokenizer is not Qwen2's split regex; llama.cpp would tokenize text differently`);
  const tokens: string[] = Array.from({ length: cfg.vocabSize }, (_, i) => `[PAD${i}]`);
  const types = new Int32Array(cfg.vocabSize).fill(5); // UNUSED
  const ids = new Map<string, number>();
  const put = (content: string, id: number, type: number) => {
    if (!(id >= 0 && id < cfg.vocabSize))
      throw new Error(`${tokFile}: token ${JSON.stringify(content)} has id ${id}, outside the model's vocab_size ${cfg.vocabSize}`);
    tokens[id] = content;
    types[id] = type;
    ids.set(content, id);
  };
  for (const [content, id] of Object.entries(tok.model.vocab as Record<string, number>)) put(content, id, 1);
  const added = (tok.added_tokens ?? []) as { id: number; content: string; special: boolean }[];
  for (const a of added) put(a.content, a.id, a.special || /^<\|.*\|>$/s.test(a.content) ? 3 : 4);
  // merges: "a b" strings, or [a, b] pairs (a space inside a part is written as U+0120 + 256, as gguf-py does)
  const merges = ((tok.model.merges ?? []) as (string | [string, string])[]).map((m) =>
    typeof m === "string" ? m : m.map((p) => p.replace(/ /g, String.fromCharCode(32 + 256))).join(" "),
  );
  const idOf = (key: string, fallback?: number | number[]) => {
    const v = tc[key];
    const text = typeof v === "string" ? v : v?.content;
    const id = typeof text === "string" ? ids.get(text) : undefined;
    return id ?? (Array.isArray(fallback) ? fallback[0] : fallback);
  };
  const eos = idOf("eos_token", cfg.eosTokenId);
  const pad = idOf("pad_token");
  const bos = idOf("bos_token", cfg.bosTokenId ?? ids.get("<|endoftext|>")); // Qwen: <|endoftext|>
  const kv: Record<string, GgufValue> = {
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "qwen2",
    "tokenizer.ggml.tokens": { type: "string[]", value: tokens },
    "tokenizer.ggml.token_type": { type: "i32[]", value: types },
    "tokenizer.ggml.merges": { type: "string[]", value: merges },
  };
  if (eos !== undefined) kv["tokenizer.ggml.eos_token_id"] = u32(eos);
  if (pad !== undefined) kv["tokenizer.ggml.padding_token_id"] = u32(pad);
  if (bos !== undefined) kv["tokenizer.ggml.bos_token_id"] = u32(bos);
  kv["tokenizer.ggml.add_bos_token"] = tc.add_bos_token === true;
  // The template this project renders with: chat_template.jinja wins over tokenizer_config's (tokenizer.ts)
  const jinja = await fs.readFile(path.join(dir, "chat_template.jinja"), "utf8").catch(() => undefined);
  const template: unknown = jinja ?? tc.chat_template;
  if (typeof template === "string") kv["tokenizer.chat_template"] = template;
  else if (Array.isArray(template)) {
    const names: string[] = [];
    for (const { name, template: t } of template as { name: string; template: string }[]) {
      if (name === "default") {
        kv["tokenizer.chat_template"] = t;
        continue;
      }
      const key = name.replace(/[^A-Za-z0-9]/g, "_");
      names.push(key);
      kv[`tokenizer.chat_template.${key}`] = t;
    }
    if (names.length) kv["tokenizer.chat_templates"] = { type: "string[]", value: names };
  }
  return kv;
}

// ---------------------------------------------------------------- base model and LoRA adapter

export interface ModelGgufOptions {
  file: string;
  config: Qwen2Config;
  tensors: Record<string, HostTensor>; // stateDict(model): HF names, torch [out, in]
  tokenizerDir: string; // tokenizer.json + tokenizer_config.json (+ chat_template.jinja)
  type?: WeightType; // default f16
  name?: string; // general.name
}

/** The base model as a GGUF llama.cpp loads as architecture qwen2. Returns the file's size. */
export async function writeModelGguf(o: ModelGgufOptions): Promise<number> {
  const c = o.config,
    type = o.type ?? "f16";
  const kv: Record<string, GgufValue> = {
    "general.architecture": "qwen2",
    "general.type": "model",
    "general.name": o.name ?? "qwen2",
    "general.quantization_version": u32(2),
    "general.file_type": u32(FILE_TYPE[type]),
    "qwen2.block_count": u32(c.numHiddenLayers),
    "qwen2.context_length": u32(c.maxPositionEmbeddings),
    "qwen2.embedding_length": u32(c.hiddenSize),
    "qwen2.feed_forward_length": u32(c.intermediateSize),
    "qwen2.attention.head_count": u32(c.numAttentionHeads),
    "qwen2.attention.head_count_kv": u32(c.numKeyValueHeads),
    "qwen2.attention.key_length": u32(c.headDim),
    "qwen2.attention.value_length": u32(c.headDim),
    "qwen2.rope.freq_base": f32(c.ropeTheta),
    "qwen2.attention.layer_norm_rms_epsilon": f32(c.rmsNormEps),
    ...(await tokenizerMetadata(o.tokenizerDir, c)),
  };
  const tensors = Object.entries(o.tensors).map(([hf, t]) => {
    const name = ggufName(hf);
    return { name, shape: t.shape, type: tensorType(name, t.shape, type), data: t.data };
  });
  return writeGguf(o.file, kv, tensors);
}

/** `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` → `blk.N.attn_q.weight.lora_a`. */
export function loraGgufName(peft: string): string {
  const m = /^base_model\.model\.(model\.layers\.\d+\..+)\.lora_([AB])\.weight$/.exec(peft);
  if (!m) throw new Error(`loraGgufName: ${peft} is not a PEFT lora_A/lora_B weight`);
  return `${ggufName(m[1] + ".weight")}.lora_${m[2].toLowerCase()}`;
}

export interface LoraGgufOptions {
  file: string;
  tensors: Record<string, HostTensor>; // PEFT keys: lora_A [r, in], lora_B [out, r]
  alpha: number; // lora_alpha as PEFT has it; llama.cpp scales by alpha / r (r read from the tensors)
  type?: "f32" | "f16"; // default f32
  name?: string;
}

/** A PEFT LoRA adapter as a GGUF adapter (convert_lora_to_gguf.py): A and B in torch's layouts
 *  ([r, in] and [out, r], so GGML ne [in, r] and [r, out]), alpha unscaled. Returns the file's size. */
export async function writeLoraGguf(o: LoraGgufOptions): Promise<number> {
  const kv: Record<string, GgufValue> = {
    "general.architecture": "qwen2",
    "general.type": "adapter",
    "general.name": o.name ?? "lora",
    "general.quantization_version": u32(2),
    "adapter.type": "lora",
    "adapter.lora.alpha": f32(o.alpha),
  };
  const tensors = Object.entries(o.tensors).map(([k, t]) => {
    const name = loraGgufName(k);
    return { name, shape: t.shape, type: tensorType(name, t.shape, o.type ?? "f32"), data: t.data };
  });
  return writeGguf(o.file, kv, tensors);
}

/** The state dict with the adapter merged in (PEFT's merge: W += scaling · B·A), new arrays for the
 *  merged weights. scaling = alpha / r. */
export function mergeLora(sd: Record<string, HostTensor>, peft: Record<string, HostTensor>, scaling: number): Record<string, HostTensor> {
  const out = { ...sd };
  for (const [k, A] of Object.entries(peft)) {
    if (!k.endsWith(".lora_A.weight")) continue;
    const B = peft[k.replace(".lora_A.", ".lora_B.")];
    const wName = k.replace(/^base_model\.model\./, "").replace(".lora_A.weight", ".weight");
    const W = sd[wName];
    if (!B || !W) throw new Error(`mergeLora: ${B ? wName : k.replace(".lora_A.", ".lora_B.")} missing`);
    const [outD, inD] = W.shape,
      r = A.shape[0];
    const w = W.data.slice(); // [out, in]
    for (let o = 0; o < outD; o++)
      for (let j = 0; j < r; j++) {
        const s = scaling * B.data[o * r + j]; // B [out, r], A [r, in]
        for (let i = 0; i < inD; i++) w[o * inD + i] += s * A.data[j * inD + i];
      }
    out[wName] = { shape: W.shape, data: w };
  }
  return out;
}

/** The model's base as a GGUF in cacheDir, named by a sha256 of what goes into it (weights as the
 *  trainer holds them, config, tokenizer files, type): an unchanged model is written once. A cached
 *  file is checked before it is reused (checkGguf: header and size); a damaged one is removed and
 *  written again, and `replaced` says what was wrong with it. The temp files of writes that were
 *  killed (their process gone) are removed; `removedTemps` counts them. */
export async function cachedModelGguf(
  model: Qwen2ForCausalLM,
  modelDir: string,
  opts: { type: WeightType; cacheDir: string },
): Promise<{ file: string; cached: boolean; replaced?: string; removedTemps: number }> {
  const removedTemps = await removeDeadTemps(opts.cacheDir);
  const sd = await stateDict(model);
  const hash = createHash("sha256").update(`gguf-qwen2-v1 ${opts.type} ${JSON.stringify(model.config)}\n`);
  for (const f of ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]) {
    const text = await fs.readFile(path.join(modelDir, f)).catch(() => null);
    hash.update(`${f} ${text?.length ?? -1}\n`);
    if (text) hash.update(text);
  }
  for (const name of Object.keys(sd).sort()) {
    const t = sd[name];
    hash.update(`${name} [${t.shape}]\n`).update(new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength));
  }
  const file = path.join(opts.cacheDir, `${hash.digest("hex").slice(0, 32)}.gguf`);
  const damaged = (await exists(file)) ? await checkGguf(file) : undefined;
  if (damaged === null) return { file, cached: true, removedTemps };
  if (damaged) await fs.rm(file, { force: true });
  const name = path.basename(model.baseModelName || modelDir);
  await writeModelGguf({ file, config: model.config, tensors: sd, tokenizerDir: modelDir, type: opts.type, name });
  return { file, cached: false, removedTemps, ...(damaged ? { replaced: damaged } : {}) };
}

/** Removes writeGguf's temp files (`<name>.<pid>.<ms>.tmp`) whose process is no longer running: a
 *  write that was killed. Another run's write in progress is left alone. */
async function removeDeadTemps(dir: string): Promise<number> {
  let n = 0;
  for (const name of await fs.readdir(dir).catch(() => [] as string[])) {
    const m = /\.gguf\.(\d+)\.\d+\.tmp$/.exec(name);
    if (!m || alive(Number(m[1]))) continue;
    await fs.rm(path.join(dir, name), { force: true });
    n++;
  }
  return n;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM"; // running, as another user
  }
}
