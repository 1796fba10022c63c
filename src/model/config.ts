/** config.json → Qwen2Config. Only what the Qwen2 forward needs is read; everything else in the file
 *  is ignored. Only full attention is supported (use_sliding_window must be false). */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import type { Qwen2Config } from "./types.ts";
import { BadFileError } from "../util/errors.ts";

export async function readConfig(dir: string): Promise<Qwen2Config> {
  const file = path.join(dir, "config.json");
  let text: string;
  try {
    text = await fs.readFile(file, "utf8");
  } catch {
    throw new Error(`${file}: missing config.json (a Hugging Face model folder needs one)`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new BadFileError(`${file}: not valid JSON (${(err as Error).message})`);
  }
  return parseConfig(json, file);
}

/** Pure: HF snake_case JSON → Qwen2Config; `file` only names the source in errors. */
export function parseConfig(json: unknown, file = "config.json"): Qwen2Config {
  if (typeof json !== "object" || json === null || Array.isArray(json)) throw new BadFileError(`${file}: expected a JSON object`);
  const c = json as Record<string, unknown>;
  if (c.model_type !== "qwen2")
    throw new BadFileError(`${file}: unsupported model_type ${JSON.stringify(c.model_type)}; accepted: "qwen2"`);
  if (c.use_sliding_window === true)
    throw new BadFileError(`${file}: use_sliding_window is true; only full attention is supported (set it to false)`);
  const int = (key: string, fallback?: number): number => {
    const v = c[key] ?? fallback;
    if (typeof v !== "number" || !Number.isInteger(v) || v <= 0)
      throw new BadFileError(`${file}: ${key} must be a positive integer, got ${JSON.stringify(c[key])}`);
    return v;
  };
  const num = (key: string, v: unknown): number => {
    if (typeof v !== "number" || !(v > 0)) throw new BadFileError(`${file}: ${key} must be a positive number, got ${JSON.stringify(v)}`);
    return v;
  };
  const hiddenSize = int("hidden_size");
  const numAttentionHeads = int("num_attention_heads");
  const numKeyValueHeads = int("num_key_value_heads", numAttentionHeads);
  if (numAttentionHeads % numKeyValueHeads !== 0)
    throw new BadFileError(
      `${file}: num_attention_heads ${numAttentionHeads} must be a multiple of num_key_value_heads ${numKeyValueHeads}`,
    );
  const headDim = c.head_dim === undefined || c.head_dim === null ? hiddenSize / numAttentionHeads : int("head_dim");
  if (!Number.isInteger(headDim) || headDim % 2 !== 0)
    throw new BadFileError(`${file}: head_dim ${headDim} (hidden_size / num_attention_heads) must be an even integer`);
  const rp = c.rope_parameters as Record<string, unknown> | undefined;
  const ropeTheta = num("rope_theta", c.rope_theta ?? rp?.rope_theta ?? 10000);
  const eos = c.eos_token_id;
  return {
    modelType: "qwen2",
    vocabSize: int("vocab_size"),
    hiddenSize,
    intermediateSize: int("intermediate_size"),
    numHiddenLayers: int("num_hidden_layers"),
    numAttentionHeads,
    numKeyValueHeads,
    headDim,
    ropeTheta,
    rmsNormEps: num("rms_norm_eps", c.rms_norm_eps ?? 1e-6),
    tieWordEmbeddings: c.tie_word_embeddings === undefined ? false : c.tie_word_embeddings === true,
    maxPositionEmbeddings: int("max_position_embeddings", 32768),
    ...(typeof c.bos_token_id === "number" ? { bosTokenId: c.bos_token_id } : {}),
    ...(typeof eos === "number" || Array.isArray(eos) ? { eosTokenId: eos as number | number[] } : {}),
  };
}

/** Qwen2Config → the config.json a Hugging Face Qwen2ForCausalLM reads. */
export function configToJson(cfg: Qwen2Config): Record<string, unknown> {
  return {
    architectures: ["Qwen2ForCausalLM"],
    attention_dropout: 0.0,
    ...(cfg.bosTokenId !== undefined ? { bos_token_id: cfg.bosTokenId } : {}),
    ...(cfg.eosTokenId !== undefined ? { eos_token_id: cfg.eosTokenId } : {}),
    head_dim: cfg.headDim,
    hidden_act: "silu",
    hidden_size: cfg.hiddenSize,
    initializer_range: 0.02,
    intermediate_size: cfg.intermediateSize,
    max_position_embeddings: cfg.maxPositionEmbeddings,
    model_type: "qwen2",
    num_attention_heads: cfg.numAttentionHeads,
    num_hidden_layers: cfg.numHiddenLayers,
    num_key_value_heads: cfg.numKeyValueHeads,
    rms_norm_eps: cfg.rmsNormEps,
    rope_theta: cfg.ropeTheta,
    tie_word_embeddings: cfg.tieWordEmbeddings,
    torch_dtype: "float32",
    use_cache: true,
    use_sliding_window: false,
    vocab_size: cfg.vocabSize,
  };
}

/** Bytes a gradient tape holds for one decoder layer recorded whole, B rows × T tokens: about 12
 *  [T, intermediate], 3 [heads, T, T] and 30 [T, hidden] per row, with a quarter more for what the
 *  backward pass allocates beside them (measured on the small bench config, 8 × 256 tokens, 4 layers:
 *  748 MB of tensors after the forward against 624 MB from the sum). */
export function layerTapeBytes(c: Qwen2Config, B: number, T: number): number {
  return 1.25 * 4 * B * T * (12 * c.intermediateSize + 3 * c.numAttentionHeads * T + 30 * c.hiddenSize);
}

/** The share of a GPU's memory `--micro_batch_size auto` lets a micro-step's activations take; the
 *  rest is for the weights, generation's unpacked copies and the allocator's slack. */
export const AUTO_MEMORY_SHARE = 0.5;

/** The most rows of `length` tokens whose training activations fit `budget` bytes: every layer's tape
 *  held, or, where a forward of that many rows checkpoints its layers (`checkpoints`), each layer's
 *  input and one layer's tape at a time. At least 1. */
export function trainRowsWithin(c: Qwen2Config, length: number, budget: number, checkpoints: (rows: number) => boolean): number {
  const tape = layerTapeBytes(c, 1, length);
  const whole = Math.max(1, Math.floor(budget / (c.numHiddenLayers * tape)));
  if (!checkpoints(whole)) return whole;
  return Math.max(1, Math.floor(budget / (tape + c.numHiddenLayers * 4 * length * c.hiddenSize)));
}
