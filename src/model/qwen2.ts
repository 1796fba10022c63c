/** Qwen2ForCausalLM on tfjs tensors, as Hugging Face's modeling_qwen2: RMSNorm, RoPE (rotate-half),
 *  grouped-query attention with q/k/v bias, SwiGLU MLP, causal + padding mask with float32 min, left
 *  padding with position ids from the mask, tied or untied head. KV cache for incremental decoding.
 *  Every projection runs as one 2-D matMul over the flattened (batch·seq) rows with weights held
 *  [in, out]; q/k/v are one matrix and gate/up another (fused at load; LoRA keeps its per-module
 *  adapters and PEFT names), RoPE rotates the query and key heads in one pass, and a decode step's
 *  head transposes are reshapes (one position). The tied head keeps only Eᵀ [hidden, vocab] and
 *  embeds by gathering its columns.
 *  Training forwards whose tape would be large checkpoint each decoder layer (only its input stays on
 *  the gradient tape; activationCheckpointing). This file is the forward pass; the attention heads,
 *  attention and a layer's three attention paths are in self-attention.ts, the token log-probs and the head's chunks in head-logprobs.ts,
 *  prefill, decode steps and the unpacked base in generation.ts, the KV cache in kv-cache.ts, saving
 *  in save.ts.
 *  Leaves out: sliding-window attention, rope scaling, dropout in attention (Qwen2 uses 0). */
import * as tf from "@tensorflow/tfjs";
import { attentionBias, checkBatch, positionIds, ropeInvFreq, ropeTables } from "./attention.ts";
import { layerAttention, type AttentionInputs } from "./self-attention.ts";
import { LoraAdapter, moduleDims } from "./lora.ts";
import type { HostTensor } from "./safetensors.ts";
import { tokenLogprobs } from "./head-logprobs.ts";
import * as generation from "./generation.ts";
import { Qwen2KVCache } from "./kv-cache.ts";
import { saveAdapter, savePretrained, stateDict } from "./save.ts";
import { checkpoint } from "../kernels/checkpoint.ts";
import { swiglu } from "../kernels/rope-swiglu.ts";
import { backendProfile } from "../kernels/profile.ts";
import { rmsNorm } from "../kernels/rmsnorm.ts";
import { baseBytes, BaseWeight, disposeWeights, linearBytes } from "./weight.ts";
import type { Qwen2Weights } from "./weight.ts";
import { AUTO_MEMORY_SHARE, layerTapeBytes, trainRowsWithin } from "./config.ts";
import { FUSED, FUSED_MODULES } from "./types.ts";
import type { CausalLM, ForwardOptions, FusedModule, KVCache, LoraConfig, Quantize, Qwen2Config, UnpackOptions } from "./types.ts";

/** What every layer of one forward shares: its attention's inputs (self-attention.ts) and the options. */
interface LayerInputs extends AttentionInputs {
  opts: ForwardOptions;
}

export class Qwen2ForCausalLM implements CausalLM {
  readonly lora: LoraConfig | null;
  /** Keep only each layer's input on a gradient tape and recompute the layer in the backward pass
   *  (checkpoint.ts). Same gradients; about one more forward of compute for a fraction of the memory.
   *  "auto": only for a forward whose whole tape would pass AUTO_CHECKPOINT_BYTES (layerTapeBytes). */
  activationCheckpointing: boolean | "auto" = "auto";
  /** Run the tokens that every row of a log-prob forward shares at its start (a GRPO group's prompt)
   *  once instead of once per row: each layer's products, norms and MLP see the prefix once and every
   *  row's rest; the rows' queries attend over the prefix's keys and values and their own. The same
   *  values (each row's keys are the same list in the same order); the prefix's gradients are summed
   *  over the rows. Not with LoRA dropout in training (rows would share the prefix's dropout masks). */
  sharePrefixes = true;
  /** Whether unpackBase (called by rollouts) dequantizes a quantized base for generation. */
  unpackForGeneration = true;
  /** How unpackBase holds the dequantized layers when not told: [out, in], multiplied as the left
   *  operand (true), [in, out] (false), or by their f32 size (undefined: weight.ts unpackLinear). The
   *  bench sets it when it runs a model cut to fewer layers, so the cut model is laid out as the whole. */
  unpackLeft: boolean | undefined = undefined;
  /** Whether unpackBase holds the base unpacked now (generation.ts). */
  unpacked = false;
  /** The adapter merged into the unpacked base (unpackBase's mergeAdapter) until its release. */
  merged: LoraAdapter | null = null;
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
    return baseBytes(this.weights);
  }

  /** Bytes of the 7 linear modules of every layer: the part int8/nf4 quantize (embeddings stay f32). */
  linearBytes(): number {
    return linearBytes(this.weights);
  }

  /** The vocabulary head: the untied lm_head, else the tied embedding. */
  get head(): BaseWeight {
    return this.weights.lmHeadT ?? this.weights.embedT;
  }

  private rmsNorm(x: tf.Tensor2D, w: tf.Tensor1D): tf.Tensor2D {
    return rmsNorm(x, w, this.config.rmsNormEps);
  }

  /** Whether a forward of B rows × T tokens checkpoints its layers (see activationCheckpointing). */
  checkpointsLayers(B: number, T: number): boolean {
    const on = this.activationCheckpointing;
    return on === "auto" ? this.config.numHiddenLayers * layerTapeBytes(this.config, B, T) > backendProfile().autoCheckpointBytes : on;
  }

  /** One fused module: x [N, in] → [N, out] (its members' outputs side by side), with the q/k/v
   *  bias and its members' LoRA terms as one tensor (on webgpu one op, lora.ts linear; elsewhere
   *  lora.ts addFusedDelta), plus `residual` where given: where the backend profile has fusedAddend,
   *  it is the base product's epilogue (one dispatch fewer), elsewhere added last, residual +
   *  projection, as the layer always summed. act "swiglu": silu(gate)·up of gate/up's output (inside
   *  the one LoRA op where it runs). */
  private proj(layer: number, f: FusedModule, x: tf.Tensor2D, opts: ForwardOptions, residual?: tf.Tensor2D, act?: "swiglu"): tf.Tensor2D {
    if (residual && !backendProfile().fusedAddend) return tf.add(residual, this.proj(layer, f, x, opts));
    const lw = this.weights.layers[layer],
      bias = f === "qkv_proj" ? lw.qkvBias : undefined;
    const ad = this.adapter,
      lora = ad && opts.adapters !== false && this.merged !== ad;
    const one = lora ? ad.linear(layer, FUSED[f], x, opts.training === true, () => lw.proj[f].frozen(bias), residual, act) : null;
    if (one) return one;
    let y = lw.proj[f].matmul(x, { bias, addend: residual });
    if (lora)
      y = ad.addFusedDelta(
        layer,
        FUSED[f],
        FUSED[f].map((m) => moduleDims(this.config, m)[1]),
        x,
        opts.training === true,
        y,
      );
    return act ? swiglu(y) : y;
  }

  /** The decoder stack: new tokens (after `cache`, if any) → final-normed hidden [B·T, hidden], and the
   *  updated keys/values per layer when `cache` is given. prefix > 0 (no cache): the rows' first
   *  `prefix` tokens are one shared prefix (sharePrefixes), run once: hidden is then the prefix's rows,
   *  then each row's T − prefix rows after it. Call inside tf.tidy. */
  run(ids: number[][], mask: number[][], opts: ForwardOptions, cache: Qwen2KVCache | null, prefix = 0) {
    const c = this.config,
      B = ids.length,
      T = ids[0].length,
      hd = c.headDim,
      P = cache ? 0 : prefix,
      R = T - P; // each row's own tokens after the prefix
    if (this.merged && (opts.adapters === false || opts.training || tf.engine().state.gradientDepth > 0))
      throw new Error(
        `a forward ${opts.adapters === false ? "with adapters off" : "that trains"} while the adapter is ` +
          `merged into the unpacked base (unpackBase mergeAdapter): call its release first`,
      );
    const keyMask = cache ? mask.map((r, b) => cache.mask[b].concat(r)) : mask;
    const S = cache ? cache.width(T) : keyMask[0].length; // keys attended over: the cache's room included
    const allPos = positionIds(mask, cache?.count);
    const table = (pos: number[][], rows: number, n: number) => {
      const { cos, sin } = ropeTables(pos.flat(), this.invFreq);
      return [tf.tensor4d(cos, [rows, n, 1, hd]), tf.tensor4d(sin, [rows, n, 1, hd])];
    };
    const [cos, sin] = table(
      allPos.map((r) => r.slice(P)),
      B,
      R,
    );
    const biasData = attentionBias(keyMask, R, S);
    const bias = tf.tensor4d(biasData, [B, 1, R, S]);
    const nKv = c.numKeyValueHeads;
    let kvBias: tf.Tensor3D | null = null;
    if (R === 1 && cache && backendProfile().fusedAddend) {
      // a decode step's mask as the scores product's epilogue: each row's bias once per kv head
      const perKv = new Float32Array(B * nKv * S);
      for (let r = 0; r < B * nKv; r++) perKv.set(biasData.subarray(Math.floor(r / nKv) * S, (Math.floor(r / nKv) + 1) * S), r * S);
      kvBias = tf.tensor3d(perKv, [B * nKv, 1, S]);
    }
    let shared: LayerInputs["shared"] = null;
    if (P > 0) {
      const [pc, ps] = table([allPos[0].slice(0, P)], 1, P);
      shared = { P, cos: pc, sin: ps, bias: tf.tensor4d(attentionBias([mask[0].slice(0, P)], P), [1, 1, P, P]) };
    }
    const ctx: LayerInputs = { B, T: R, cos, sin, bias, opts, cache, shared, kvBias };
    // Training forwards (a gradient tape recording) keep only each layer's input on the tape and run
    // the layer again in the backward pass; LoRA dropout draws fresh masks per call, so with dropout
    // on the layers are recorded whole instead.
    const ckpt = !cache && this.checkpointsLayers(B, T) && !this.dropsOut(opts);
    const tokens = P > 0 ? [...ids[0].slice(0, P), ...ids.flatMap((r) => r.slice(P))] : ids.flat();
    let x = this.weights.embedT.columns(tf.tensor1d(tokens, "int32")); // [N, H]
    const newK: tf.Tensor4D[] = [],
      newV: tf.Tensor4D[] = [];
    const consts: tf.Tensor[] = shared ? [cos, sin, bias, shared.cos, shared.sin, shared.bias] : [cos, sin, bias];
    const withConsts = (t: tf.Tensor[]): LayerInputs => {
      const [c0, s0, b0, c1, s1, b1] = t as tf.Tensor4D[];
      return { ...ctx, cos: c0, sin: s0, bias: b0, shared: shared && { P, cos: c1, sin: s1, bias: b1 } };
    };
    for (let l = 0; l < c.numHiddenLayers; l++) {
      if (ckpt) {
        // One tidy per layer (inside checkpoint and here): a layer's intermediates are freed before the
        // next one runs.
        const xIn = x;
        const layer = (xx: tf.Tensor2D, t: tf.Tensor[]) => tf.tidy(() => this.layer(l, xx, withConsts(t)).x);
        x = tf.tidy(() => checkpoint(layer, xIn, consts, this.layerVariables(l, opts)));
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
   *  values (B, nKv, S, hd) after the cache (if any; self-attention.ts layerAttention). */
  private layer(l: number, x: tf.Tensor2D, ctx: LayerInputs): { x: tf.Tensor2D; kT: tf.Tensor4D; v: tf.Tensor4D } {
    const opts = ctx.opts,
      lw = this.weights.layers[l];
    const h = this.rmsNorm(x, lw.inputNorm);
    const qkv = this.proj(l, "qkv_proj", h, opts); // [N, (nH + 2·nKv)·hd]
    const { att, kT, v } = layerAttention(this.config, l, qkv, ctx);
    x = this.proj(l, "o_proj", att, opts, x);
    const n = this.rmsNorm(x, lw.postNorm);
    const act = this.proj(l, "gate_up_proj", n, opts, undefined, "swiglu"); // silu(gate)·up, [N, I]
    x = this.proj(l, "down_proj", act, opts, x);
    return { x, kT, v };
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
    const mask = checkBatch(this.config.vocabSize, inputIds, attentionMask);
    return tf.tidy(() => {
      const { hidden } = this.run(inputIds, mask, opts, null);
      return tf.reshape(this.head.matmul(hidden), [inputIds.length, inputIds[0].length, this.config.vocabSize]);
    });
  }

  tokenLogprobs(
    inputIds: number[][],
    attentionMask: number[][],
    opts: ForwardOptions & { withEntropy?: boolean; logprobMask?: number[][] } = {},
  ) {
    return tokenLogprobs(this, inputIds, attentionMask, opts);
  }

  /** The length of the prefix every row shares (same ids, attended) that a log-prob forward runs once
   *  (sharePrefixes); 0 when there is none to share or sharing is off. At least one token of each row
   *  is left after it. */
  sharedPrefix(ids: number[][], mask: number[][], opts: ForwardOptions): number {
    if (!this.sharePrefixes || ids.length < 2 || this.dropsOut(opts)) return 0;
    const T = ids[0].length;
    let P = 0;
    while (P < T - 1 && ids.every((r, b) => r[P] === ids[0][P] && mask[b][P] === 1)) P++;
    return P;
  }

  /** Whether a forward with these options applies LoRA dropout (training, adapters on, dropout > 0):
   *  it draws fresh masks per call, so such a forward neither recomputes layers nor shares prefixes. */
  private dropsOut(opts: ForwardOptions): boolean {
    return opts.training === true && this.adapter !== null && opts.adapters !== false && this.adapter.config.dropout > 0;
  }

  /** Bytes of one layer's gradient tape (layerTapeBytes) a training micro-batch may hold; undefined:
   *  the backend profile's trainLayerBytes. */
  trainLayerBytes: number | undefined = undefined;

  trainRowsFor(length: number): number {
    return Math.max(1, Math.floor((this.trainLayerBytes ?? backendProfile().trainLayerBytes) / layerTapeBytes(this.config, 1, length)));
  }

  autoTrainRows(length: number): number {
    const p = backendProfile();
    if (this.trainLayerBytes !== undefined || Number.isFinite(p.trainLayerBytes)) return this.trainRowsFor(length);
    const budget = AUTO_MEMORY_SHARE * p.deviceMemoryBytes - this.baseBytes();
    return trainRowsWithin(this.config, length, budget, (rows) => this.checkpointsLayers(rows, length));
  }

  /** Rows of a prefill are run in groups whose one-layer activations (layerTapeBytes) stay below
   *  this (undefined: the backend profile's prefillBytes); rows are independent, so the result is the
   *  same bits as one pass. */
  prefillBytes: number | undefined = undefined;

  prefill(inputIds: number[][], attentionMask: number[][], opts: ForwardOptions = {}): { logits: tf.Tensor2D; cache: Qwen2KVCache } {
    return generation.prefill(this, inputIds, attentionMask, opts);
  }

  decodeStep(tokens: number[], cache: KVCache, opts: ForwardOptions = {}): tf.Tensor2D {
    return generation.decodeStep(this, tokens, cache, opts);
  }

  trainableVariables(): tf.Variable[] {
    if (this.full) {
      const w = this.weights,
        vars: tf.Tensor[] = [w.embedT.f32!, ...(w.lmHeadT ? [w.lmHeadT.f32!] : []), w.norm];
      for (const l of w.layers) vars.push(l.inputNorm, l.postNorm, l.qkvBias, ...FUSED_MODULES.map((f) => l.proj[f].f32!));
      return [...(vars as tf.Variable[]), ...(this.adapter?.variables() ?? [])];
    }
    return this.adapter?.variables() ?? [];
  }

  /** The attached adapter (null when none). */
  get loraAdapter(): LoraAdapter | null {
    return this.adapter;
  }

  /** The attached adapter in PEFT's format (save.ts). */
  saveAdapter(dir: string): Promise<void> {
    return saveAdapter(this, dir);
  }

  /** HF names → torch-layout f32 tensors (save.ts). */
  stateDict(): Promise<Record<string, HostTensor>> {
    return stateDict(this);
  }

  /** A Hugging Face folder: config.json and model.safetensors (save.ts). */
  savePretrained(dir: string): Promise<void> {
    return savePretrained(this, dir);
  }

  /** Hold every quantized base matrix dequantized until the returned function is called. For
   *  generation: a decode step otherwise dequantizes the whole base for a few rows of products. The
   *  outputs do not change; memory holds the linear layers in f32 meanwhile. A no-op (with a no-op
   *  release) for an f32 base, when already unpacked, or when unpackForGeneration is false. left:
   *  the layout (default: unpackLeft). mergeAdapter: add the adapter's weight deltas into the held
   *  matrices (PEFT's merge_adapter; TRL merges before handing weights to vLLM), so a decode step runs
   *  4 products a layer instead of 12 (LoRA on every module) and the outputs agree with the unmerged
   *  ones to float32 rounding; until the release, forwards with adapters off, training forwards and
   *  adapter swaps throw (the held weights carry this adapter). */
  unpackBase(opts: UnpackOptions = {}): () => void {
    return generation.unpackBase(this, opts);
  }

  /** Attach another adapter (or none) and hand back the one attached before, not disposed: a server
   *  holding several adapters switches between them per decode batch (serve/openai/batcher.ts). */
  swapAdapter(adapter: LoraAdapter | null): LoraAdapter | null {
    return generation.swapAdapter(this, adapter);
  }

  /** Replace (or remove, with null) the attached adapter; the old one is disposed. */
  setAdapter(adapter: LoraAdapter | null): void {
    this.loraAdapter?.dispose();
    this.attach(adapter);
  }

  /** Make `adapter` (or none) the attached one (generation.ts' swaps). */
  attach(adapter: LoraAdapter | null): void {
    this.adapter = adapter;
    (this as { lora: LoraConfig | null }).lora = adapter ? adapter.config : null;
  }

  dispose(): void {
    disposeWeights(this.weights);
    this.adapter?.dispose();
  }
}
