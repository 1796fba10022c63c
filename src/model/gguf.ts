/** GGUF out, for llama.cpp, LM Studio and Ollama (the writer is gguf-write.ts): the Qwen2 base with its
 *  tokenizer as llama.cpp's convert_hf_to_gguf.py writes it, and a PEFT adapter as
 *  convert_lora_to_gguf.py writes it.
 *  The base comes from stateDict(model): the weights the trainer runs (an int8/NF4 base dequantized),
 *  so llama.cpp samples the trainer's policy. Leaves out: reading GGUF, K-quants, BF16, big-endian
 *  files, sharded output, tokenizers other than Qwen2's byte-level BPE. */
import { createHash } from "node:crypto";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { exists } from "../util/fs.ts";
import { checkGguf } from "./gguf-check.ts";
import type { HostTensor } from "./safetensors.ts";
import type { Qwen2Config, WeightsOnHost } from "./types.ts";
import { GGML_TYPE, f32, i32, Q8_BLOCK, u32, writeGguf, type GgmlType, type GgufValue } from "./gguf-write.ts";
export {
  GGML_TYPE,
  encodeF16,
  encodeQ8_0,
  f32,
  f32ToF16Bits,
  i32,
  tensorBytes,
  u32,
  writeGguf,
  type GgmlType,
  type GgufTensor,
  type GgufValue,
} from "./gguf-write.ts";

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
  model: Pick<WeightsOnHost, "config" | "baseModelName" | "stateDict">,
  modelDir: string,
  opts: { type: WeightType; cacheDir: string },
): Promise<{ file: string; cached: boolean; replaced?: string; removedTemps: number }> {
  const removedTemps = await removeDeadTemps(opts.cacheDir);
  const sd = await model.stateDict();
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
