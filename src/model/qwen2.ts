/** Qwen2ForCausalLM on tfjs tensors, as Hugging Face's modeling_qwen2: RMSNorm, RoPE (rotate-half),
 *  grouped-query attention with q/k/v bias, SwiGLU MLP, causal + padding mask with float32 min, left
 *  padding with position ids from the mask, tied or untied head. KV cache for incremental decoding.
 *  Every projection runs as one 2-D matMul over the flattened (batch·seq) rows with weights held
 *  [in, out]; q/k/v are one matrix and gate/up another (fused at load; LoRA keeps its per-module
 *  adapters and PEFT names), RoPE rotates the query and key heads in one pass, and a decode step's
 *  head transposes are reshapes (one position). The tied head keeps only Eᵀ [hidden, vocab] and
 *  embeds by gathering its columns.
 *  Training forwards whose tape would be large checkpoint each decoder layer (only its input stays on
 *  the gradient tape; activationCheckpointing) and compute the head's log-probs in vocab chunks that recompute their logits in the backward pass.
 *  Leaves out: sliding-window attention, rope scaling, dropout in attention (Qwen2 uses 0). */
import * as tf from "@tensorflow/tfjs";
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { writeDirAtomic, writeFileAtomic } from "../util/fs.ts";
import { attentionBias, positionIds, ropeInvFreq, ropeTables } from "./attention.ts";
import { configToJson } from "./config.ts";
import { adapterConfigJson, LoraAdapter, moduleDims, moduleGroup } from "./lora.ts";
import { encodeSafetensors, type HostTensor } from "./safetensors.ts";
import { checkpoint } from "../engine/checkpoint.ts";
import { decodeHeads, rope, swiglu } from "../engine/rope-swiglu.ts";
import { dLogits, logpEntropy } from "../engine/logprob.ts";
import { bmm, matMulAT, matMulBT, matMulXWT } from "../engine/matmul.ts";
import { backendProfile } from "../engine/profile.ts";
import { rmsNorm } from "../engine/rmsnorm.ts";
import { softmax } from "../engine/softmax.ts";
import { BaseWeight } from "./weight.ts";
import { type CustomGradFn } from "../engine/kernels.ts";
import { FUSED, FUSED_MODULES, type CausalLM, type ForwardOptions, type FusedModule, type KVCache, type LoraConfig, type Quantize, type Qwen2Config } from "./types.ts";

export interface LayerWeights {
  inputNorm: tf.Tensor1D;
  postNorm: tf.Tensor1D;
  qkvBias: tf.Tensor1D; // [q + 2·kv]: the q_proj, k_proj and v_proj biases end to end
  proj: Record<FusedModule, BaseWeight>; // [in, out]; a fused module's outputs side by side (FUSED)
}
export interface Qwen2Weights {
  embedT: BaseWeight; // [hidden, vocab] = model.embed_tokens.weightᵀ (also the head when tied)
  lmHeadT: BaseWeight | null; // [hidden, vocab] = lm_head.weightᵀ when untied
  norm: tf.Tensor1D;
  layers: LayerWeights[];
}

/** What every layer of one forward shares: shapes, RoPE tables [B, T, 1, hd], the attention bias
 *  [B, 1, T, S] and the cache (null in training forwards). */
interface LayerInputs {
  B: number;
  T: number;
  cos: tf.Tensor4D;
  sin: tf.Tensor4D;
  bias: tf.Tensor4D;
  opts: ForwardOptions;
  cache: Qwen2KVCache | null;
}

export class Qwen2KVCache implements KVCache {
  constructor(
    public k: tf.Tensor4D[], // per layer [B, nKv, hd, L]  (keys stored transposed for q·kᵀ as a plain matMul)
    public v: tf.Tensor4D[], // per layer [B, nKv, L, hd]
    public mask: number[][], // [B][L]
    public count: number[], // real tokens seen per row (the next position id)
  ) {}
  get batchSize(): number {
    return this.mask.length;
  }
  get length(): number {
    return this.mask[0]?.length ?? 0;
  }
  select(rows: number[]): void {
    for (const r of rows) if (!(Number.isInteger(r) && r >= 0 && r < this.batchSize)) throw new Error(`cache select: row ${r} out of range 0..${this.batchSize - 1}`);
    const idx = tf.tensor1d(rows, "int32");
    const pick = <T extends tf.Tensor>(ts: T[]) => ts.map((t) => { const g = tf.gather(t, idx, 0) as T; t.dispose(); return g; });
    this.k = pick(this.k);
    this.v = pick(this.v);
    idx.dispose();
    this.mask = rows.map((r) => this.mask[r]);
    this.count = rows.map((r) => this.count[r]);
  }
  dispose(): void {
    tf.dispose([...this.k, ...this.v]);
    this.k = [];
    this.v = [];
  }
}

/** Bytes a gradient tape holds for one decoder layer recorded whole, B rows × T tokens: about 12
 *  [T, intermediate], 3 [heads, T, T] and 30 [T, hidden] per row, with a quarter more for what the
 *  backward pass allocates beside them (measured on the small bench config, 8 × 256 tokens, 4 layers:
 *  748 MB of tensors after the forward against 624 MB from the sum). */
export function layerTapeBytes(c: Qwen2Config, B: number, T: number): number {
  return 1.25 * 4 * B * T * (12 * c.intermediateSize + 3 * c.numAttentionHeads * T + 30 * c.hiddenSize);
}
/** Tape size above which "auto" checkpointing recomputes layers (a quarter of wasm's 4 GiB heap):
 *  below it, recording layers whole saves a forward of compute per step (small config, 8 × 256
 *  tokens: 1.2 s instead of 1.5 s per step); 0.5B is above it from one 256-token row. */
export const AUTO_CHECKPOINT_BYTES = 2 ** 30;

/** Activation bytes a prefill may hold at once (see prefillBytes): 32 rollouts of a 0.5B, ~300-token
 *  prompts, in one pass needed ~5 GB beside the unpacked 2 GB base and stalled the wasm heap's
 *  allocator at its 4 GiB limit for good. */
export const PREFILL_BYTES = 512 * 2 ** 20;

export class Qwen2ForCausalLM implements CausalLM {
  readonly lora: LoraConfig | null;
  /** Keep only each layer's input on a gradient tape and recompute the layer in the backward pass
   *  (checkpoint.ts). Same gradients; about one more forward of compute for a fraction of the memory.
   *  "auto": only for a forward whose whole tape would pass AUTO_CHECKPOINT_BYTES (layerTapeBytes). */
  activationCheckpointing: boolean | "auto" = "auto";
  /** Whether unpackBase (called by rollouts) dequantizes a quantized base for generation. */
  unpackForGeneration = true;
  private unpacked = false;
  private readonly invFreq: Float32Array;

  constructor(
    readonly config: Qwen2Config,
    readonly quantize: Quantize,
    readonly weights: Qwen2Weights,
    private adapter: LoraAdapter | null,
    readonly full: boolean,
    readonly baseModelName = "",
  ) {
    this.lora = adapter ? adapter.config : null;
    this.invFreq = ropeInvFreq(config.ropeTheta, config.headDim);
  }

  /** Bytes of the frozen base held on the backend (quantized or f32). */
  baseBytes(): number {
    const w = this.weights;
    let n = w.embedT.bytes + (w.lmHeadT?.bytes ?? 0) + 4 * w.norm.size;
    for (const l of w.layers) {
      n += 4 * (l.inputNorm.size + l.postNorm.size + l.qkvBias.size);
      for (const f of FUSED_MODULES) n += l.proj[f].bytes;
    }
    return n;
  }

  /** Bytes of the 7 linear modules of every layer: the part int8/nf4 quantize (embeddings stay f32). */
  linearBytes(): number {
    return this.weights.layers.reduce((n, l) => n + FUSED_MODULES.reduce((s, f) => s + l.proj[f].bytes, 0), 0);
  }

  private get head(): BaseWeight {
    return this.weights.lmHeadT ?? this.weights.embedT;
  }

  private checkBatch(ids: number[][], mask?: number[][]): number[][] {
    if (!Array.isArray(ids) || ids.length === 0 || !Array.isArray(ids[0]) || ids[0].length === 0)
      throw new Error("inputIds must be a non-empty [batch][seq] array");
    const T = ids[0].length, V = this.config.vocabSize;
    for (const row of ids) {
      if (row.length !== T) throw new Error(`inputIds rows must all have length ${T} (left-pad them), got ${row.length}`);
      for (const t of row) if (!(Number.isInteger(t) && t >= 0 && t < V)) throw new Error(`token id ${t} out of range 0..${V - 1}`);
    }
    const m = mask ?? ids.map((r) => r.map(() => 1));
    if (m.length !== ids.length || m.some((r) => r.length !== T)) throw new Error(`attentionMask must have the shape of inputIds [${ids.length}, ${T}]`);
    return m;
  }

  private rmsNorm(x: tf.Tensor2D, w: tf.Tensor1D): tf.Tensor2D {
    return rmsNorm(x, w, this.config.rmsNormEps);
  }

  /** Whether a forward of B rows × T tokens checkpoints its layers (see activationCheckpointing). */
  checkpointsLayers(B: number, T: number): boolean {
    const on = this.activationCheckpointing;
    return on === "auto" ? this.config.numHiddenLayers * layerTapeBytes(this.config, B, T) > AUTO_CHECKPOINT_BYTES : on;
  }

  /** One fused module: x [N, in] → [N, out] (its members' outputs side by side), with the q/k/v
   *  bias and its members' LoRA terms as one tensor (lora.ts fusedDelta). */
  private proj(layer: number, f: FusedModule, x: tf.Tensor2D, opts: ForwardOptions): tf.Tensor2D {
    const lw = this.weights.layers[layer];
    let y = lw.proj[f].matmul(x);
    if (f === "qkv_proj") y = tf.add(y, lw.qkvBias);
    const ad = this.adapter;
    if (ad && opts.adapters !== false) {
      const d = ad.fusedDelta(layer, FUSED[f], FUSED[f].map((m) => moduleDims(this.config, m)[1]), x, opts.training === true);
      if (d) y = tf.add(y, d);
    }
    return y;
  }

  /** The decoder stack: new tokens (after `cache`, if any) → final-normed hidden [B·T, hidden], and the
   *  updated keys/values per layer when `cache` is given. Call inside tf.tidy. */
  private run(ids: number[][], mask: number[][], opts: ForwardOptions, cache: Qwen2KVCache | null) {
    const c = this.config, B = ids.length, T = ids[0].length, hd = c.headDim;
    const keyMask = cache ? mask.map((r, b) => cache.mask[b].concat(r)) : mask;
    const S = keyMask[0].length;
    const pos = positionIds(mask, cache?.count).flat();
    const { cos: cosA, sin: sinA } = ropeTables(pos, this.invFreq);
    const cos = tf.tensor4d(cosA, [B, T, 1, hd]), sin = tf.tensor4d(sinA, [B, T, 1, hd]);
    const bias = tf.tensor4d(attentionBias(keyMask, T), [B, 1, T, S]);

    const ctx: LayerInputs = { B, T, cos, sin, bias, opts, cache };
    // Training forwards (a gradient tape recording) keep only each layer's input on the tape and run
    // the layer again in the backward pass; LoRA dropout draws fresh masks per call, so with dropout
    // on the layers are recorded whole instead.
    const ckpt = !cache && this.checkpointsLayers(B, T) && !(opts.training && this.adapter && opts.adapters !== false && this.adapter.config.dropout > 0);
    let x = this.weights.embedT.columns(tf.tensor1d(ids.flat(), "int32")); // [N, H]
    const newK: tf.Tensor4D[] = [], newV: tf.Tensor4D[] = [];
    for (let l = 0; l < c.numHiddenLayers; l++) {
      if (ckpt) {
        // One tidy per layer (inside checkpoint and here): a layer's intermediates are freed before the
        // next one runs.
        const xIn = x;
        const layer = (xx: tf.Tensor2D, [cs, sn, bs]: tf.Tensor[]) =>
          tf.tidy(() => this.layer(l, xx, { ...ctx, cos: cs as tf.Tensor4D, sin: sn as tf.Tensor4D, bias: bs as tf.Tensor4D }).x);
        x = tf.tidy(() => checkpoint(layer, xIn, [cos, sin, bias], this.layerVariables(l, opts)));
        continue;
      }
      // One tidy per layer: a layer's intermediates are freed before the next one runs (tensors the
      // gradient tape needs are kept by the tape itself).
      const xIn = x;
      const out = tf.tidy(() => this.layer(l, xIn, ctx));
      x = out.x;
      if (cache) {
        newK.push(out.kT);
        newV.push(out.v);
      } else tf.dispose([out.kT, out.v]);
    }
    return { hidden: this.rmsNorm(x, this.weights.norm), newK, newV };
  }

  /** One decoder layer: x [N, hidden] → x [N, hidden], with this layer's keys (B, nKv, hd, S) and
   *  values (B, nKv, S, hd) after the cache (if any). */
  private layer(l: number, x: tf.Tensor2D, ctx: LayerInputs): { x: tf.Tensor2D; kT: tf.Tensor4D; v: tf.Tensor4D } {
    const c = this.config, { B, T, cos, sin, bias, opts, cache } = ctx, N = B * T;
    const nH = c.numAttentionHeads, nKv = c.numKeyValueHeads, hd = c.headDim, g = nH / nKv;
    const S = bias.shape[3];
    const lw = this.weights.layers[l];
    // With one position (a decode step) moving the T axis keeps the element order: a reshape does it.
    const perm = (t: tf.Tensor, p: number[]): tf.Tensor => (T === 1 ? tf.reshape(t, p.map((a) => t.shape[a])) : tf.transpose(t, p));
    const h = this.rmsNorm(x, lw.inputNorm);
    const qkv = this.proj(l, "qkv_proj", h, opts); // [N, (nH + 2·nKv)·hd]
    // GQA without repeating K/V: the g query heads sharing a kv head are stacked along the rows, qg.
    let qg: tf.Tensor3D, kT: tf.Tensor, v: tf.Tensor;
    const heads = T === 1 && cache ? decodeHeads(qkv, cos, sin, nH, nKv, hd, 1 / Math.sqrt(hd)) : null;
    if (heads) [qg, kT, v] = heads;
    else {
      const [qk, vFlat] = tf.split(qkv, [(nH + nKv) * hd, nKv * hd], 1); // [N, (nH+nKv)·hd], [N, nKv·hd]
      const [qr, k] = tf.split(rope(tf.reshape(qk, [B, T, nH + nKv, hd]), cos, sin), [nH, nKv], 2); // (B, T, nH | nKv, hd)
      const q = perm(tf.mul(qr, 1 / Math.sqrt(hd)), [0, 2, 1, 3]); // (B, nH, T, hd)
      kT = perm(k, [0, 2, 3, 1]); // (B, nKv, hd, T)
      v = perm(tf.reshape(vFlat, [B, T, nKv, hd]), [0, 2, 1, 3]); // (B, nKv, T, hd)
      qg = tf.reshape<tf.Rank.R3>(q, [B * nKv, g * T, hd]);
    }
    if (cache && cache.length) {
      kT = tf.concat([cache.k[l], kT], 3); // (B, nKv, hd, S)
      v = tf.concat([cache.v[l], v], 2); // (B, nKv, S, hd)
    }
    const scores = tf.add(tf.reshape(bmm(qg, tf.reshape(kT, [B * nKv, hd, S])), [B, nH, T, S]), bias); // (B, nH, T, S)
    const probs = tf.reshape<tf.Rank.R3>(softmax(scores), [B * nKv, g * T, S]);
    const ctxv = bmm(probs, tf.reshape(v, [B * nKv, S, hd])); // (B·nKv, g·T, hd)
    const att = tf.reshape<tf.Rank.R2>(T === 1 ? ctxv : tf.transpose(tf.reshape(ctxv, [B, nH, T, hd]), [0, 2, 1, 3]), [N, nH * hd]);
    x = tf.add(x, this.proj(l, "o_proj", att, opts)) as tf.Tensor2D;
    const n = this.rmsNorm(x, lw.postNorm);
    const act = swiglu(this.proj(l, "gate_up_proj", n, opts)); // silu(gate)·up, [N, I]
    x = tf.add(x, this.proj(l, "down_proj", act, opts)) as tf.Tensor2D;
    return { x, kT: kT as tf.Tensor4D, v: v as tf.Tensor4D };
  }

  /** The trainable variables layer l reads: its LoRA pairs (when adapters are on) and, in full mode,
   *  its own weights. A checkpointed layer must name them all (see checkpoint.ts). */
  private layerVariables(l: number, opts: ForwardOptions): tf.Variable[] {
    const vars: tf.Variable[] = [];
    if (this.full) {
      const lw = this.weights.layers[l];
      vars.push(...([lw.inputNorm, lw.postNorm, lw.qkvBias, ...FUSED_MODULES.map((f) => lw.proj[f].f32!)] as unknown as tf.Variable[]));
    }
    if (this.adapter && opts.adapters !== false) {
      const prefix = `base_model.model.model.layers.${l}.`; // the adapter's variables carry PEFT names
      vars.push(...this.adapter.variables().filter((v) => v.name.startsWith(prefix)));
    }
    return vars.filter((v) => v instanceof tf.Variable && v.trainable);
  }

  forward(inputIds: number[][], attentionMask?: number[][], opts: ForwardOptions = {}): tf.Tensor3D {
    const mask = this.checkBatch(inputIds, attentionMask);
    return tf.tidy(() => {
      const { hidden } = this.run(inputIds, mask, opts, null);
      return tf.reshape(this.head.matmul(hidden), [inputIds.length, inputIds[0].length, this.config.vocabSize]);
    });
  }

  tokenLogprobs(inputIds: number[][], attentionMask: number[][], opts: ForwardOptions & { withEntropy?: boolean } = {}) {
    const mask = this.checkBatch(inputIds, attentionMask);
    const B = inputIds.length, T = inputIds[0].length, H = this.config.hiddenSize, V = this.config.vocabSize;
    const res = tf.tidy(() => {
      if (T === 1) return { lp: tf.zeros([B, 1]) as tf.Tensor2D, ent: tf.zeros([B, 1]) as tf.Tensor2D };
      const { hidden } = this.run(inputIds, mask, opts, null);
      const h = tf.reshape<tf.Rank.R2>(tf.slice(tf.reshape(hidden, [B, T, H]), [0, 0, 0], [B, T - 1, H]), [B * (T - 1), H]);
      const targets = inputIds.flatMap((r) => r.slice(1));
      // Rows of logits materialised at once (wasm: 4M floats, 16 MB per chunk; the forward and
      // backward of a chunk hold ~7 such tensors: ~110 MB, 27 rows of the 0.5B vocab).
      // (a multiple of 8 rows where it can be: the wasm kernel's row and column blocks are whole then)
      const fit = Math.max(1, Math.floor(backendProfile().logitChunkFloats / V)), rows = fit >= 8 ? fit - (fit % 8) : fit;
      const head = this.head, left = head.left;
      const w = left || head.parts ? null : head.value();
      const outs: tf.Tensor2D[] = [];
      for (let s = 0; s < targets.length; s += rows) {
        const n = Math.min(rows, targets.length - s);
        const hc = tf.slice(h, [s, 0], [n, H]), tc = targets.slice(s, s + n);
        outs.push(left ? logprobChunkLeft(hc, left, tc) : head.parts ? logprobChunkBlocks(hc, head, tc) : logprobChunk(hc, w!, () => head.value(), tc, head.isVariable));
      }
      const both = outs.length === 1 ? outs[0] : tf.concat(outs, 0); // [B·(T−1), 2]
      const zero = tf.zeros([B, 1]);
      const lp = tf.concat([zero, tf.reshape(tf.slice(both, [0, 0], [-1, 1]), [B, T - 1])], 1) as tf.Tensor2D;
      const ent = tf.concat([zero, tf.reshape(tf.slice(both, [0, 1], [-1, 1]), [B, T - 1])], 1) as tf.Tensor2D;
      return { lp, ent };
    });
    if (opts.withEntropy) return { logprobs: res.lp, entropy: res.ent };
    res.ent.dispose();
    return { logprobs: res.lp };
  }

  /** Bytes of one layer's gradient tape (layerTapeBytes) a training micro-batch may hold; undefined:
   *  the backend profile's trainLayerBytes. */
  trainLayerBytes: number | undefined = undefined;

  trainRowsFor(length: number): number {
    return Math.max(1, Math.floor((this.trainLayerBytes ?? backendProfile().trainLayerBytes) / layerTapeBytes(this.config, 1, length)));
  }

  /** Rows of a prefill are run in groups whose one-layer activations (layerTapeBytes) stay below
   *  this; rows are independent, so the result is the same bits as one pass. */
  prefillBytes = PREFILL_BYTES;

  prefill(inputIds: number[][], attentionMask: number[][], opts: ForwardOptions = {}) {
    const mask = this.checkBatch(inputIds, attentionMask);
    const B = inputIds.length, rows = Math.max(1, Math.floor(this.prefillBytes / layerTapeBytes(this.config, 1, inputIds[0].length)));
    const parts: { logits: tf.Tensor2D; cache: Qwen2KVCache }[] = [];
    for (let r = 0; r < B; r += rows) {
      const cache = new Qwen2KVCache([], [], inputIds.slice(r, r + rows).map(() => []), inputIds.slice(r, r + rows).map(() => 0));
      parts.push({ logits: this.step(inputIds.slice(r, r + rows), mask.slice(r, r + rows), cache, opts), cache });
    }
    if (parts.length === 1) return parts[0];
    const join = <T extends tf.Tensor>(ts: T[]): T => tf.concat(ts, 0) as T;
    const cache = new Qwen2KVCache(
      parts[0].cache.k.map((_, l) => join(parts.map((p) => p.cache.k[l]))),
      parts[0].cache.v.map((_, l) => join(parts.map((p) => p.cache.v[l]))),
      parts.flatMap((p) => p.cache.mask),
      parts.flatMap((p) => p.cache.count),
    );
    const logits = join(parts.map((p) => p.logits));
    for (const p of parts) {
      p.logits.dispose();
      p.cache.dispose();
    }
    return { logits, cache };
  }

  decodeStep(tokens: number[], cache: KVCache, opts: ForwardOptions = {}): tf.Tensor2D {
    if (!(cache instanceof Qwen2KVCache)) throw new Error("decodeStep needs the cache returned by prefill()");
    if (tokens.length !== cache.batchSize) throw new Error(`decodeStep got ${tokens.length} tokens for a cache of ${cache.batchSize} rows`);
    const ids = tokens.map((t) => [t]);
    const hold = opts.hold;
    if (hold && hold.length !== tokens.length) throw new Error(`decodeStep got ${hold.length} hold flags for ${tokens.length} rows`);
    return this.step(ids, this.checkBatch(ids, hold ? hold.map((h) => [h ? 0 : 1]) : undefined), cache, opts);
  }

  private step(ids: number[][], mask: number[][], cache: Qwen2KVCache, opts: ForwardOptions): tf.Tensor2D {
    const B = ids.length, T = ids[0].length, H = this.config.hiddenSize;
    const out = tf.tidy(() => {
      const { hidden, newK, newV } = this.run(ids, mask, opts, cache);
      const last = tf.reshape<tf.Rank.R2>(tf.slice(tf.reshape(hidden, [B, T, H]), [0, T - 1, 0], [B, 1, H]), [B, H]);
      return { logits: this.head.matmul(last), k: newK, v: newV };
    });
    tf.dispose([...cache.k, ...cache.v]);
    cache.k = out.k;
    cache.v = out.v;
    cache.mask = cache.mask.map((r, b) => r.concat(mask[b]));
    cache.count = cache.count.map((c, b) => c + mask[b].reduce((s, m) => s + (m ? 1 : 0), 0));
    return out.logits;
  }

  trainableVariables(): tf.Variable[] {
    if (this.full) {
      const w = this.weights, vars: tf.Tensor[] = [w.embedT.f32!, ...(w.lmHeadT ? [w.lmHeadT.f32!] : []), w.norm];
      for (const l of w.layers) vars.push(l.inputNorm, l.postNorm, l.qkvBias, ...FUSED_MODULES.map((f) => l.proj[f].f32!));
      return [...(vars as tf.Variable[]), ...(this.adapter?.variables() ?? [])];
    }
    return this.adapter?.variables() ?? [];
  }

  /** The attached adapter (null when none). */
  get loraAdapter(): LoraAdapter | null {
    return this.adapter;
  }

  async saveAdapter(dir: string): Promise<void> {
    const ad = this.adapter;
    if (!ad) throw new Error(`saveAdapter(${dir}): the model has no LoRA adapter attached`);
    const tensors = await ad.toPeft();
    await writeDirAtomic(dir, async (tmp) => {
      await fs.writeFile(path.join(tmp, "adapter_model.safetensors"), encodeSafetensors(tensors, { format: "pt" }));
      await fs.writeFile(path.join(tmp, "adapter_config.json"), JSON.stringify(adapterConfigJson(ad.config, this.baseModelName), null, 2) + "\n");
    });
  }

  /** HF names → torch-layout f32 tensors (W [out, in]); the tied head is written once (as embed_tokens). */
  async stateDict(): Promise<Record<string, HostTensor>> {
    const out: Record<string, HostTensor> = {};
    const put = async (name: string, t: tf.Tensor) => {
      out[name] = { shape: t.shape.slice(), data: (await t.data()) as Float32Array };
    };
    // A fused module is written as its members, each torch's [out, in] (HF names, as loaded). The
    // rows come back on the host (outInData also reassembles a matrix held in column blocks).
    const putT = async (names: string[], outDims: number[], w: BaseWeight) => {
      const data = await w.outInData(); // [out, in] row-major
      let row = 0;
      names.forEach((n, i) => {
        out[n] = { shape: [outDims[i], w.inDim], data: data.slice(row * w.inDim, (row + outDims[i]) * w.inDim) };
        row += outDims[i];
      });
    };
    const c = this.config;
    const w = this.weights;
    await putT(["model.embed_tokens.weight"], [c.vocabSize], w.embedT);
    if (w.lmHeadT) await putT(["lm_head.weight"], [c.vocabSize], w.lmHeadT);
    await put("model.norm.weight", w.norm);
    for (let i = 0; i < w.layers.length; i++) {
      const l = w.layers[i], p = `model.layers.${i}`;
      await put(`${p}.input_layernorm.weight`, l.inputNorm);
      await put(`${p}.post_attention_layernorm.weight`, l.postNorm);
      for (const f of FUSED_MODULES)
        await putT(FUSED[f].map((m) => `${p}.${moduleGroup(m)}.${m}.weight`), FUSED[f].map((m) => moduleDims(c, m)[1]), l.proj[f]);
      const biases = tf.split(l.qkvBias, FUSED.qkv_proj.map((m) => moduleDims(c, m)[1]));
      for (let j = 0; j < biases.length; j++) await put(`${p}.self_attn.${FUSED.qkv_proj[j]}.bias`, biases[j]);
      tf.dispose(biases);
    }
    return out;
  }

  async savePretrained(dir: string): Promise<void> {
    const tensors = await this.stateDict();
    const cfg = JSON.stringify(configToJson(this.config), null, 2) + "\n";
    await writeDirAtomic(dir, async (tmp) => {
      await fs.writeFile(path.join(tmp, "model.safetensors"), encodeSafetensors(tensors, { format: "pt" }));
      await writeFileAtomic(path.join(tmp, "config.json"), cfg);
    });
  }

  /** Hold every quantized base matrix dequantized until the returned function is called. For
   *  generation: a decode step otherwise dequantizes the whole base for a few rows of products. The
   *  outputs do not change; memory holds the linear layers in f32 meanwhile. A no-op (with a no-op
   *  release) for an f32 base, when already unpacked, or when unpackForGeneration is false. left:
   *  the layout (default: by size). */
  unpackBase(left?: boolean): () => void {
    // The adapter's fused factors are held for generation too (lora.ts holdFactors).
    const releaseFactors = this.adapter?.holdFactors(FUSED_MODULES.map((f) => FUSED[f]), (m) => moduleDims(this.config, m)[1]) ?? (() => {});
    if (this.quantize === "none" || this.unpacked || !this.unpackForGeneration) return releaseFactors;
    const mats = this.weights.layers.flatMap((l) => FUSED_MODULES.map((f) => l.proj[f]));
    // Over the profile's leftLayoutBytes of f32: held [out, in] as the left operand, like large f32 models (weight.ts).
    left ??= 4 * mats.reduce((n, w) => n + w.inDim * w.outDim, 0) > backendProfile().leftLayoutBytes;
    for (const w of mats) w.unpack(left);
    this.unpacked = true;
    return () => {
      for (const w of mats) w.pack();
      this.unpacked = false;
      releaseFactors();
    };
  }

  /** Attach another adapter (or none) and hand back the one attached before, not disposed: a server
   *  holding several adapters switches between them per decode batch (serve/openai/engine.ts). */
  swapAdapter(adapter: LoraAdapter | null): LoraAdapter | null {
    const before = this.adapter;
    this.adapter = adapter;
    (this as { lora: LoraConfig | null }).lora = adapter ? adapter.config : null;
    return before;
  }

  /** Replace (or remove, with null) the attached adapter; the old one is disposed. */
  setAdapter(adapter: LoraAdapter | null): void {
    this.adapter?.dispose();
    this.adapter = adapter;
    (this as { lora: LoraConfig | null }).lora = adapter ? adapter.config : null;
  }

  dispose(): void {
    const w = this.weights;
    w.embedT.dispose();
    w.lmHeadT?.dispose();
    w.norm.dispose();
    for (const l of w.layers) {
      tf.dispose([l.inputNorm, l.postNorm, l.qkvBias]);
      for (const f of FUSED_MODULES) l.proj[f].dispose();
    }
    this.adapter?.dispose();
  }
}

/** logprobChunk for a frozen head held [vocab, hidden] (large f32 models, see weight.ts): the logits
 *  are h · wᵀ and the input gradient dLogits · w. */
function logprobChunkLeft(h: tf.Tensor2D, wLeft: tf.Tensor2D, targets: number[]): tf.Tensor2D {
  const logitsOf = (hh: tf.Tensor2D) => matMulXWT(hh, wLeft); // [n, V]
  const f = tf.customGrad(((hh: tf.Tensor2D, save: tf.GradSaveFunc) => {
    save([hh]);
    return {
      value: tf.tidy(() => logpEntropy(logitsOf(hh), targets)),
      gradFunc: (dy: tf.Tensor2D, saved: tf.Tensor[]) => tf.tidy(() => tf.matMul(dLogits(logitsOf(saved[0] as tf.Tensor2D), targets, dy), wLeft)),
    };
  }) as unknown as CustomGradFn);
  return f(h) as tf.Tensor2D;
}

/** logprobChunk for a frozen head held in column blocks (weight.ts): logits and the backward product
 *  go block by block, so no kernel binds the whole head. */
function logprobChunkBlocks(h: tf.Tensor2D, head: BaseWeight, targets: number[]): tf.Tensor2D {
  const f = tf.customGrad(((hh: tf.Tensor2D, save: tf.GradSaveFunc) => {
    save([hh]);
    return {
      value: tf.tidy(() => logpEntropy(head.matmul(hh), targets)),
      gradFunc: (dy: tf.Tensor2D, saved: tf.Tensor[]) => tf.tidy(() => head.backward(dLogits(head.matmul(saved[0] as tf.Tensor2D), targets, dy))),
    };
  }) as unknown as CustomGradFn);
  return f(h) as tf.Tensor2D;
}

/** log p(target) and the entropy for a chunk of rows: h [n, H], w [H, V] → [n, 2]. The custom gradient
 *  recomputes the logits in the backward pass, so the tape never holds a [n, V] chunk; w gets a
 *  gradient only when it is trainable (full mode). A frozen w is fetched again by `weightAgain` in the
 *  backward pass (a dequantized head is gone by then). Entropy carries no gradient. */
function logprobChunk(h: tf.Tensor2D, w: tf.Tensor2D, weightAgain: () => tf.Tensor2D, targets: number[], wTrainable: boolean): tf.Tensor2D {
  const fwd = (hh: tf.Tensor2D, ww: tf.Tensor2D) => tf.tidy(() => logpEntropy(tf.matMul(hh, ww), targets));
  const dLogitsFor = (hh: tf.Tensor2D, ww: tf.Tensor2D, dy: tf.Tensor2D) => dLogits(tf.matMul(hh, ww), targets, dy);
  if (wTrainable) {
    const f = tf.customGrad(((hh: tf.Tensor2D, ww: tf.Tensor2D, save: tf.GradSaveFunc) => {
      save([hh, ww]);
      return {
        value: fwd(hh, ww),
        gradFunc: (dy: tf.Tensor2D, saved: tf.Tensor[]) =>
          tf.tidy(() => {
            const [hs, ws] = saved as tf.Tensor2D[];
            const g = dLogitsFor(hs, ws, dy);
            return [matMulBT(g, ws), matMulAT(hs, g)];
          }),
      };
    }) as unknown as CustomGradFn);
    return f(h, w) as tf.Tensor2D;
  }
  const f = tf.customGrad(((hh: tf.Tensor2D, save: tf.GradSaveFunc) => {
    save([hh]);
    return {
      value: fwd(hh, w),
      gradFunc: (dy: tf.Tensor2D, saved: tf.Tensor[]) =>
        tf.tidy(() => {
          const wb = weightAgain();
          return matMulBT(dLogitsFor(saved[0] as tf.Tensor2D, wb, dy), wb);
        }),
    };
  }) as unknown as CustomGradFn);
  return f(h) as tf.Tensor2D;
}
