/** Generation on a Qwen2 model: the prefill (each distinct row once, rows in groups whose
 *  activations stay within prefillBytes), decode steps against the KV cache, and the base held
 *  unpacked, with the adapter merged into it or its factors held, while generating; and adapter
 *  swaps (a server switching adapters per decode batch). */
import * as tf from "@tensorflow/tfjs";
import { backendProfile } from "../kernels/profile.ts";
import { checkBatch } from "./attention.ts";
import { layerTapeBytes } from "./config.ts";
import { Qwen2KVCache } from "./kv-cache.ts";
import { moduleDims, type LoraAdapter } from "./lora.ts";
import { FUSED, FUSED_MODULES } from "./types.ts";
import type { ForwardOptions, KVCache, LoraTarget, Quantize, Qwen2Config, UnpackOptions } from "./types.ts";
import { unpackLinear, type BaseWeight, type Qwen2Weights } from "./weight.ts";

/** What generation reads and sets of a model (Qwen2ForCausalLM has it; this file does not import the class). */
export interface GeneratingModel {
  readonly config: Qwen2Config;
  readonly quantize: Quantize;
  readonly weights: Qwen2Weights;
  readonly head: BaseWeight;
  readonly loraAdapter: LoraAdapter | null;
  prefillBytes: number | undefined;
  unpackForGeneration: boolean;
  unpackLeft: boolean | undefined;
  unpacked: boolean;
  merged: LoraAdapter | null;
  /** The decoder stack after `cache`: final-normed hidden [B·T, hidden] and each layer's keys and values. */
  run(
    ids: number[][],
    mask: number[][],
    opts: ForwardOptions,
    cache: Qwen2KVCache | null,
  ): { hidden: tf.Tensor2D; newK: tf.Tensor4D[]; newV: tf.Tensor4D[] };
  attach(adapter: LoraAdapter | null): void;
}

/** CausalLM.prefill. */
export function prefill(
  m: GeneratingModel,
  inputIds: number[][],
  attentionMask: number[][],
  opts: ForwardOptions = {},
): { logits: tf.Tensor2D; cache: Qwen2KVCache } {
  const mask = checkBatch(m.config.vocabSize, inputIds, attentionMask);
  // A GRPO group is G rollouts of one prompt: each distinct row is run once and its keys, values
  // and logits copied to its repeats (rows are independent, so the result is the same bits).
  const { unique, of } = distinctRows(inputIds, mask);
  if (unique.length < inputIds.length) {
    const once = prefill(
      m,
      unique.map((r) => inputIds[r]),
      unique.map((r) => mask[r]),
      opts,
    );
    once.cache.select(of);
    const logits = tf.tidy(() => tf.gather(once.logits, tf.tensor1d(of, "int32"))) as tf.Tensor2D;
    once.logits.dispose();
    return { logits, cache: once.cache };
  }
  const B = inputIds.length,
    rows = Math.max(1, Math.floor((m.prefillBytes ?? backendProfile().prefillBytes) / layerTapeBytes(m.config, 1, inputIds[0].length)));
  const parts: { logits: tf.Tensor2D; cache: Qwen2KVCache }[] = [];
  for (let r = 0; r < B; r += rows) {
    const cache = Qwen2KVCache.empty(Math.min(rows, B - r));
    parts.push({ logits: step(m, inputIds.slice(r, r + rows), mask.slice(r, r + rows), cache, opts), cache });
  }
  if (parts.length === 1) return parts[0];
  const cache = Qwen2KVCache.concat(parts.map((p) => p.cache));
  const logits = tf.concat(
    parts.map((p) => p.logits),
    0,
  ) as tf.Tensor2D;
  for (const p of parts) {
    p.logits.dispose();
    p.cache.dispose();
  }
  return { logits, cache };
}

/** CausalLM.decodeStep. */
export function decodeStep(m: GeneratingModel, tokens: number[], cache: KVCache, opts: ForwardOptions = {}): tf.Tensor2D {
  if (!(cache instanceof Qwen2KVCache)) throw new Error("decodeStep needs the cache returned by prefill()");
  if (tokens.length !== cache.batchSize) throw new Error(`decodeStep got ${tokens.length} tokens for a cache of ${cache.batchSize} rows`);
  const ids = tokens.map((t) => [t]);
  const hold = opts.hold;
  if (hold && hold.length !== tokens.length) throw new Error(`decodeStep got ${hold.length} hold flags for ${tokens.length} rows`);
  return step(m, ids, checkBatch(m.config.vocabSize, ids, hold ? hold.map((h) => [h ? 0 : 1]) : undefined), cache, opts);
}

/** New tokens through the model after `cache`: the last position's logits [B, vocab]; the cache
 *  takes their keys, values and mask. */
function step(m: GeneratingModel, ids: number[][], mask: number[][], cache: Qwen2KVCache, opts: ForwardOptions): tf.Tensor2D {
  const B = ids.length,
    T = ids[0].length,
    H = m.config.hiddenSize;
  const out = tf.tidy(() => {
    const { hidden, newK, newV } = m.run(ids, mask, opts, cache);
    const last = tf.reshape<tf.Rank.R2>(tf.slice(tf.reshape(hidden, [B, T, H]), [0, T - 1, 0], [B, 1, H]), [B, H]);
    return { logits: m.head.matmul(last), k: newK, v: newV };
  });
  const kept = new Set<tf.Tensor>([...out.k, ...out.v]); // written in place: the same tensors
  tf.dispose([...cache.k, ...cache.v].filter((t) => !kept.has(t)));
  cache.k = out.k;
  cache.v = out.v;
  cache.mask = cache.mask.map((r, b) => r.concat(mask[b]));
  cache.count = cache.count.map((c, b) => c + mask[b].reduce((s, m) => s + (m ? 1 : 0), 0));
  return out.logits;
}

/** Qwen2ForCausalLM.swapAdapter: attach `adapter` (or none), handing back the one before (not
 *  disposed); refused while an adapter is merged into the unpacked base, unless it is that one. */
export function swapAdapter(m: GeneratingModel, adapter: LoraAdapter | null): LoraAdapter | null {
  if (m.merged && adapter !== m.merged)
    throw new Error("swapAdapter: the adapter is merged into the unpacked base (unpackBase mergeAdapter); release it first");
  const before = m.loraAdapter;
  m.attach(adapter);
  return before;
}

/** Qwen2ForCausalLM.unpackBase (its doc there). */
export function unpackBase(m: GeneratingModel, opts: UnpackOptions = {}): () => void {
  const unpacks = m.quantize !== "none" && !m.unpacked && m.unpackForGeneration;
  const ad = unpacks && opts.mergeAdapter ? m.loraAdapter : null; // the adapter to merge
  const outDim = (t: LoraTarget) => moduleDims(m.config, t)[1];
  // The adapter's fused factors are held for generation too (lora.ts holdFactors), unless merged:
  // then no LoRA product runs.
  const releaseFactors = ad
    ? () => {}
    : (m.loraAdapter?.holdFactors(
        FUSED_MODULES.map((f) => FUSED[f]),
        outDim,
      ) ?? (() => {}));
  if (!unpacks) return releaseFactors;
  const pack = unpackLinear(m.weights, opts.left ?? m.unpackLeft);
  m.unpacked = true;
  if (ad) {
    for (const f of FUSED_MODULES) {
      const dims = FUSED[f].map(outDim);
      m.weights.layers.forEach((lw, l) => lw.proj[f].addToUnpacked((outIn) => ad.fusedWeightDelta(l, FUSED[f], dims, outIn)));
    }
    m.merged = ad;
  }
  return () => {
    pack();
    m.unpacked = false;
    m.merged = null;
    releaseFactors();
  };
}

/** The first row of each distinct (ids, mask) pair, and for every row the index of its pair in that list. */
export function distinctRows(ids: number[][], mask: number[][]): { unique: number[]; of: number[] } {
  const seen = new Map<string, number>(),
    unique: number[] = [];
  const of = ids.map((r, i) => {
    const key = `${r.join(",")}|${mask[i].join(",")}`;
    let k = seen.get(key);
    if (k === undefined) {
      seen.set(key, (k = unique.length));
      unique.push(i);
    }
    return k;
  });
  return { unique, of };
}
