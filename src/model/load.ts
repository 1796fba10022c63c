/** Building a Qwen2ForCausalLM: from a Hugging Face folder or hub id (weights read one tensor at a
 *  time and quantized as they arrive, so a 0.5B model never needs two f32 copies), or with random
 *  weights (normal, std 0.02 like HF's initializer_range) for benchmarks and tiny from-scratch models.
 *  Optionally attaches a PEFT adapter from a folder, or a fresh one. */
import * as tf from "@tensorflow/tfjs";
import * as path from "node:path";
import { Rng } from "../util/rng.ts";
import { BadFileError } from "../util/errors.ts";
import { readConfig } from "./config.ts";
import { resolveModelDir } from "./model-dir.ts";
import { LoraAdapter, moduleDims } from "./lora.ts";
import { moduleGroup } from "./peft.ts";
import { Qwen2ForCausalLM } from "./qwen2.ts";
import { type LayerWeights } from "./weight.ts";
import { Checkpoint } from "./safetensors.ts";
import { backendProfile } from "../kernels/profile.ts";
import { BaseWeight } from "./weight.ts";
import { FUSED, FUSED_MODULES, LORA_TARGETS, type FusedModule, type LoraConfig, type Quantize, type Qwen2Config } from "./types.ts";

export interface ModelOptions {
  quantize?: Quantize;
  lora?: LoraConfig; // attach a fresh adapter
  trainable?: "lora" | "full";
  seed?: number;
  /** Hold frozen f32 weights [out, in] as the left matMul operand (see weight.ts). Default: only when
   *  they exceed the backend profile's leftLayoutBytes (1 GiB on wasm, never on webgpu). */
  frozenLeft?: boolean;
}
export interface LoadOptions extends ModelOptions {
  adapter?: string; // PEFT folder to attach
}

const QUANTIZE: Quantize[] = ["none", "int8", "nf4"];
let modelCount = 0;

/** Where each weight comes from: name and torch shape → host data. `inOut` marks a matrix that is
 *  already [in, out] (random init has no layout to preserve, so it skips the transpose). */
type Source = (name: string, shape: number[]) => Promise<Float32Array | { inOut: Float32Array }>;
const plain = (d: Float32Array | { inOut: Float32Array }): Float32Array => ("inOut" in d ? d.inOut : d);

/** Pure: row-major [rows, cols_i] matrices side by side → [rows, Σ cols_i]. */
export function concatColumns(parts: Float32Array[], rows: number): Float32Array {
  const cols = parts.map((p) => p.length / rows),
    total = cols.reduce((a, b) => a + b, 0);
  const out = new Float32Array(rows * total);
  for (let i = 0, off = 0; i < parts.length; off += cols[i], i++)
    for (let r = 0; r < rows; r++) out.set(parts[i].subarray(r * cols[i], (r + 1) * cols[i]), r * total + off);
  return out;
}

/** Pure: arrays end to end (rows stacked, for [out, in] matrices or 1-D biases). */
export function concatRows(parts: Float32Array[]): Float32Array {
  if (parts.length === 1) return parts[0];
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  parts.reduce((off, p) => (out.set(p, off), off + p.length), 0);
  return out;
}

/** Pure: [rows, cols] row-major → [cols, rows]. */
export function transpose2d(a: Float32Array, rows: number, cols: number): Float32Array {
  const out = new Float32Array(a.length);
  for (let i = 0; i < rows; i++) for (let j = 0; j < cols; j++) out[j * rows + i] = a[i * cols + j];
  return out;
}

async function build(cfg: Qwen2Config, src: Source, opts: ModelOptions, hasLmHead: boolean, name: string): Promise<Qwen2ForCausalLM> {
  const quantize = opts.quantize ?? "none";
  if (!QUANTIZE.includes(quantize)) throw new Error(`unknown quantize "${quantize}"; accepted: ${QUANTIZE.join(", ")}`);
  const full = opts.trainable === "full";
  if (opts.trainable !== undefined && opts.trainable !== "lora" && !full)
    throw new Error(`unknown trainable "${opts.trainable}"; accepted: lora, full`);
  if (full && quantize !== "none")
    throw new Error(`trainable "full" needs quantize "none", got "${quantize}" (quantized weights are frozen)`);
  const created: { dispose(): void }[] = [];
  const uid = ++modelCount; // tfjs variable names are global: full-mode models get a suffix each
  // Frozen f32 weights over 1 GiB: held [out, in] and used as the left operand (see weight.ts).
  const big = opts.frozenLeft ?? 4 * paramCount(cfg) > backendProfile().leftLayoutBytes;
  const left = quantize === "none" && !full && big;
  // The embedding (and an untied head) stays f32 under int8/nf4, as QLoRA / bitsandbytes quantize only
  // the Linear layers inside the blocks: a quantized head would be dequantized whole at every decode
  // step (136M weights for 0.5B), and a lookup needs only a few of its columns anyway.
  const embedLeft = !full && big;
  // Several names (the q/k/v biases) are read in order and held end to end as one vector.
  const vec = async (names: string | string[], sizes: number | number[]): Promise<tf.Tensor1D> => {
    const ns = ([] as string[]).concat(names),
      ss = ([] as number[]).concat(sizes);
    const parts: Float32Array[] = [];
    for (let i = 0; i < ns.length; i++) parts.push(plain(await src(ns[i], [ss[i]])));
    const t = tf.tensor1d(concatRows(parts));
    const out = full ? (tf.variable(t, true, `${ns[0]}#${uid}`) as unknown as tf.Tensor1D) : t;
    if (full) t.dispose();
    created.push(out);
    return out;
  };
  // torch stores Linear weights [out, in]; we hold [in, out] (transposed on the host, once), or
  // [out, in] as they come for the left-operand layout. Several names (q/k/v, gate/up) sharing an
  // input become one matrix, their outputs side by side: one product instead of several. Quantization
  // is per output column, so the fused matrix quantizes exactly as its parts would.
  const mat = async (names: string | string[], outDs: number | number[], inD: number, embedding = false): Promise<BaseWeight> => {
    const ns = ([] as string[]).concat(names),
      os = ([] as number[]).concat(outDs);
    const useLeft = embedding ? embedLeft : left;
    const parts: Float32Array[] = [];
    for (let i = 0; i < ns.length; i++) {
      const d = await src(ns[i], [os[i], inD]);
      if (useLeft) parts.push("inOut" in d ? transpose2d(d.inOut, inD, os[i]) : d);
      else parts.push("inOut" in d ? d.inOut : transpose2d(d, os[i], inD));
    }
    const outD = os.reduce((a, b) => a + b, 0);
    const w = useLeft
      ? BaseWeight.frozenLeft(concatRows(parts), inD, outD)
      : BaseWeight.fromFloat32(
          parts.length === 1 ? parts[0] : concatColumns(parts, inD),
          inD,
          outD,
          embedding ? "none" : quantize,
          full,
          `${ns[0]}#${uid}`,
        );
    created.push(w);
    return w;
  };
  try {
    const H = cfg.hiddenSize,
      V = cfg.vocabSize;
    const embedT = await mat("model.embed_tokens.weight", V, H, true);
    const lmHeadT = cfg.tieWordEmbeddings ? null : hasLmHead ? await mat("lm_head.weight", V, H, true) : null;
    if (!cfg.tieWordEmbeddings && !lmHeadT) throw new BadFileError(`${name}: tensor lm_head.weight missing (tie_word_embeddings is false)`);
    const layers: LayerWeights[] = [];
    for (let i = 0; i < cfg.numHiddenLayers; i++) {
      const p = `model.layers.${i}`;
      const proj = {} as Record<FusedModule, BaseWeight>;
      for (const f of FUSED_MODULES) {
        const members = FUSED[f];
        proj[f] = await mat(
          members.map((m) => `${p}.${moduleGroup(m)}.${m}.weight`),
          members.map((m) => moduleDims(cfg, m)[1]),
          moduleDims(cfg, members[0])[0],
        );
      }
      const qkv = FUSED.qkv_proj;
      layers.push({
        inputNorm: await vec(`${p}.input_layernorm.weight`, H),
        postNorm: await vec(`${p}.post_attention_layernorm.weight`, H),
        qkvBias: await vec(
          qkv.map((m) => `${p}.self_attn.${m}.bias`),
          qkv.map((m) => moduleDims(cfg, m)[1]),
        ),
        proj,
      });
    }
    const norm = await vec("model.norm.weight", H);
    const adapter = opts.lora ? LoraAdapter.init(cfg, opts.lora, opts.seed ?? 0) : null;
    return new Qwen2ForCausalLM(cfg, quantize, { embedT, lmHeadT, norm, layers }, adapter, full, name);
  } catch (err) {
    for (const c of created) c.dispose();
    throw err;
  }
}

/** Weights in the linear layers and embeddings (norms and biases are negligible). */
export function paramCount(c: Qwen2Config): number {
  const perLayer = LORA_TARGETS.reduce((s, m) => {
    const [i, o] = moduleDims(c, m);
    return s + i * o;
  }, 0);
  return c.numHiddenLayers * perLayer + c.vocabSize * c.hiddenSize * (c.tieWordEmbeddings ? 1 : 2);
}

/** Random weights: linear and embedding ~ N(0, 0.02²), biases 0, norms 1 (HF's _init_weights). */
export async function createModel(config: Qwen2Config, opts: ModelOptions = {}): Promise<Qwen2ForCausalLM> {
  const rng = new Rng(opts.seed ?? 0);
  const src: Source = async (name, shape) => {
    const n = shape.reduce((p, d) => p * d, 1);
    const a = new Float32Array(n);
    if (name.endsWith("norm.weight")) a.fill(1);
    else if (!name.endsWith(".bias")) for (let i = 0; i < n; i++) a[i] = 0.02 * rng.normal();
    return shape.length === 2 ? { inOut: a } : a;
  };
  return build(config, src, opts, !config.tieWordEmbeddings, "random init");
}

/** A Hugging Face folder or hub id → model (with an adapter if asked). */
export async function loadModel(pathOrId: string, opts: LoadOptions = {}): Promise<Qwen2ForCausalLM> {
  const dir = await resolveModelDir(pathOrId);
  const cfg = await readConfig(dir);
  const ckpt = await Checkpoint.open(dir);
  let model: Qwen2ForCausalLM;
  try {
    const src: Source = async (name, shape) => {
      if (!ckpt.has(name)) throw new BadFileError(`${ckpt.fileOf(name)}: tensor ${name} missing from the checkpoint`);
      const got = ckpt.shape(name);
      if (got.join() !== shape.join())
        throw new BadFileError(`${ckpt.fileOf(name)}: tensor ${name} has shape [${got}], config.json implies [${shape}]`);
      return (await ckpt.read(name)).data;
    };
    model = await build(cfg, src, { ...opts, lora: opts.adapter ? undefined : opts.lora }, ckpt.has("lm_head.weight"), pathOrId);
  } finally {
    await ckpt.close();
  }
  if (opts.adapter) {
    try {
      const ad = await LoraAdapter.load(path.resolve(opts.adapter), cfg, opts.seed ?? 0);
      if (opts.lora && (opts.lora.r !== ad.config.r || opts.lora.targetModules.join() !== ad.config.targetModules.join())) {
        ad.dispose();
        throw new Error(
          `${path.join(opts.adapter, "adapter_config.json")}: adapter has r ${ad.config.r} on ` +
            `${ad.config.targetModules.join(",")}, but r ${opts.lora.r} on ${opts.lora.targetModules.join(",")} ` +
            `was asked for`,
        );
      }
      model.setAdapter(ad);
    } catch (err) {
      model.dispose();
      throw err;
    }
  }
  return model;
}
