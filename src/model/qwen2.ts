/** Qwen2ForCausalLM on tfjs tensors, as Hugging Face's modeling_qwen2: RMSNorm, RoPE (rotate-half),
 *  grouped-query attention with q/k/v bias, SwiGLU MLP, causal + padding mask with float32 min, left
 *  padding with position ids from the mask, tied or untied head. KV cache for incremental decoding.
 *  Every projection runs as one 2-D matMul over the flattened (batch·seq) rows with weights held
 *  [in, out]; q/k/v are one matrix and gate/up another (fused at load; LoRA keeps its per-module
 *  adapters and PEFT names), RoPE rotates the query and key heads in one pass, and a decode step's
 *  head transposes are reshapes (one position). The tied head keeps only Eᵀ [hidden, vocab] and
 *  embeds by gathering its columns.
 *  Training forwards whose tape would be large checkpoint each decoder layer (only its input stays on
 *  the gradient tape; activationCheckpointing). The head's chunked log-probs are in head-logprobs.ts,
 *  the KV cache in kv-cache.ts, saving in save.ts.
 *  Leaves out: sliding-window attention, rope scaling, dropout in attention (Qwen2 uses 0). */
import * as tf from "@tensorflow/tfjs";
import { attentionBias, checkBatch, positionIds, ropeInvFreq, ropeTables } from "./attention.ts";
import { LoraAdapter, moduleDims } from "./lora.ts";
import type { HostTensor } from "./safetensors.ts";
import { headLogprobs } from "./head-logprobs.ts";
import { Qwen2KVCache } from "./kv-cache.ts";
import { saveAdapter, savePretrained, stateDict } from "./save.ts";
import { checkpoint } from "../engine/checkpoint.ts";
import { decodeHeads, decodeHeadsInto, seqHeads } from "../engine/heads.ts";
import { rope, swiglu } from "../engine/rope-swiglu.ts";
import { bmm } from "../engine/matmul.ts";
import { backendProfile } from "../engine/profile.ts";
import { rmsNorm } from "../engine/rmsnorm.ts";
import { softmax } from "../engine/softmax.ts";
import { baseBytes, BaseWeight, linearBytes, unpackLinear } from "./weight.ts";
import type { LayerWeights, Qwen2Weights } from "./weight.ts";
import { AUTO_MEMORY_SHARE, layerTapeBytes, trainRowsWithin } from "./config.ts";
import { FUSED, FUSED_MODULES } from "./types.ts";
import type {
  CausalLM,
  ForwardOptions,
  FusedModule,
  KVCache,
  LoraConfig,
  LoraTarget,
  Quantize,
  Qwen2Config,
  UnpackOptions,
} from "./types.ts";

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
  /** A shared prefix (see Qwen2ForCausalLM.sharePrefixes): the layer's rows are the prefix's P tokens,
   *  then each of the B rows' T − P tokens after it; cos, sin and bias are the prefix's ([1, P, 1, hd],
   *  [1, 1, P, P]) and these the rest's ([B, T − P, 1, hd], [B, 1, T − P, T]). */
  shared: { P: number; cos: tf.Tensor4D; sin: tf.Tensor4D; bias: tf.Tensor4D } | null;
  /** A decode step on webgpu: the bias laid out per kv head [B·nKv, 1, S], added by the scores'
   *  product itself (its epilogue, one dispatch fewer per layer, the same bits); null elsewhere. */
  kvBias: tf.Tensor3D | null;
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
  private unpacked = false;
  /** The adapter merged into the unpacked base (unpackBase's mergeAdapter) until its release. */
  private merged: LoraAdapter | null = null;
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

  private get head(): BaseWeight {
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
   *  bias and its members' LoRA terms as one tensor (lora.ts addFusedDelta), plus `residual` where
   *  given: where the backend profile has fusedAddend, it is the base product's epilogue (one dispatch
   *  fewer), elsewhere added last, residual + projection, as the layer always summed. */
  private proj(layer: number, f: FusedModule, x: tf.Tensor2D, opts: ForwardOptions, residual?: tf.Tensor2D): tf.Tensor2D {
    if (residual && !backendProfile().fusedAddend) return tf.add(residual, this.proj(layer, f, x, opts));
    const lw = this.weights.layers[layer];
    let y = lw.proj[f].matmul(x, { bias: f === "qkv_proj" ? lw.qkvBias : undefined, addend: residual });
    const ad = this.adapter;
    if (ad && opts.adapters !== false && this.merged !== ad)
      y = ad.addFusedDelta(
        layer,
        FUSED[f],
        FUSED[f].map((m) => moduleDims(this.config, m)[1]),
        x,
        opts.training === true,
        y,
      );
    return y;
  }

  /** The decoder stack: new tokens (after `cache`, if any) → final-normed hidden [B·T, hidden], and the
   *  updated keys/values per layer when `cache` is given. prefix > 0 (no cache): the rows' first
   *  `prefix` tokens are one shared prefix (sharePrefixes), run once: hidden is then the prefix's rows,
   *  then each row's T − prefix rows after it. Call inside tf.tidy. */
  private run(ids: number[][], mask: number[][], opts: ForwardOptions, cache: Qwen2KVCache | null, prefix = 0) {
    const c = this.config,
      B = ids.length,
      T = ids[0].length,
      hd = c.headDim,
      P = cache ? 0 : prefix,
      R = T - P; // each row's own tokens after the prefix
    if (this.merged && (opts.adapters === false || opts.training || tf.engine().state.gradientDepth > 0))
      throw new Error(
        `a forward ${opts.adapters === false ? "with adapters off" : "that trains"} while the adapter is merged into the unpacked base (unpackBase mergeAdapter): call its release first`,
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

  /** Query, key and value heads of qkv [B·T, (nH + 2·nKv)·hd] with RoPE: queries stacked per kv head
   *  (B·nKv, g·T, hd), keys (B, nKv, hd, T), values (B, nKv, T, hd); with `slot` (a decode step, a
   *  cache layer writable in place) keys and values may be written into the cache at slot.pos
   *  instead (inSlot; webgpu), kT and v then the cache's tensors. */
  private heads(
    qkv: tf.Tensor2D,
    cos: tf.Tensor4D,
    sin: tf.Tensor4D,
    B: number,
    T: number,
    decode: boolean,
    slot: { k: tf.Tensor4D; v: tf.Tensor4D; pos: number } | null = null,
  ): { qg: tf.Tensor3D; kT: tf.Tensor; v: tf.Tensor; inSlot?: boolean } {
    const c = this.config,
      nH = c.numAttentionHeads,
      nKv = c.numKeyValueHeads,
      hd = c.headDim,
      g = nH / nKv;
    // webgpu: k and v computed straight into the cache's slot (then kT, v are the cache's own tensors)
    const into = decode && slot ? decodeHeadsInto(qkv, cos, sin, nH, nKv, hd, 1 / Math.sqrt(hd), slot.k, slot.v, slot.pos) : null;
    if (into && slot) return { qg: into, kT: slot.k, v: slot.v, inSlot: true };
    // With one position (a decode step) moving the T axis keeps the element order: a reshape does it.
    const perm = (t: tf.Tensor, p: number[]): tf.Tensor =>
      T === 1
        ? tf.reshape(
            t,
            p.map((a) => t.shape[a]),
          )
        : tf.transpose(t, p);
    // GQA without repeating K/V: the g query heads sharing a kv head are stacked along the rows, qg.
    const heads = decode ? decodeHeads(qkv, cos, sin, nH, nKv, hd, 1 / Math.sqrt(hd)) : null;
    if (heads) return { qg: heads[0], kT: heads[1], v: heads[2] };
    const seq = seqHeads(qkv, cos, sin, B, T, nH, nKv, hd, 1 / Math.sqrt(hd)); // wasm, cpu, webgpu: one kernel each way
    // (B, nKv, hd, T), (B, nKv, T, hd); (B, nH, T, hd) -> (B·nKv, g·T, hd)
    if (seq) return { qg: tf.reshape<tf.Rank.R3>(seq[0], [B * nKv, g * T, hd]), kT: seq[1], v: seq[2] };
    const [qk, vFlat] = tf.split(qkv, [(nH + nKv) * hd, nKv * hd], 1); // [N, (nH+nKv)·hd], [N, nKv·hd]
    const [qr, k] = tf.split(rope(tf.reshape(qk, [B, T, nH + nKv, hd]), cos, sin), [nH, nKv], 2); // (B, T, nH | nKv, hd)
    const q = perm(tf.mul(qr, 1 / Math.sqrt(hd)), [0, 2, 1, 3]); // (B, nH, T, hd)
    return {
      qg: tf.reshape<tf.Rank.R3>(q, [B * nKv, g * T, hd]),
      kT: perm(k, [0, 2, 3, 1]), // (B, nKv, hd, T)
      v: perm(tf.reshape(vFlat, [B, T, nKv, hd]), [0, 2, 1, 3]), // (B, nKv, T, hd)
    };
  }

  /** Attention of stacked queries qg (B·nKv, g·T, hd) over keys kT (B, nKv, hd, S) and values
   *  (B, nKv, S, hd) with bias [B, 1, T, S] → [B·T, nH·hd]. */
  private attend(
    qg: tf.Tensor3D,
    kT: tf.Tensor,
    v: tf.Tensor,
    bias: tf.Tensor4D,
    B: number,
    T: number,
    kvBias: tf.Tensor3D | null = null,
  ): tf.Tensor2D {
    const c = this.config,
      nH = c.numAttentionHeads,
      nKv = c.numKeyValueHeads,
      hd = c.headDim,
      g = nH / nKv,
      S = bias.shape[3];
    const kT3 = tf.reshape<tf.Rank.R3>(kT, [B * nKv, hd, S]);
    const scores = kvBias
      ? tf.reshape(tf.fused.matMul({ a: qg, b: kT3, bias: kvBias }), [B, nH, T, S]) // the mask in the product's epilogue
      : tf.add(tf.reshape(bmm(qg, kT3), [B, nH, T, S]), bias); // (B, nH, T, S)
    const probs = tf.reshape<tf.Rank.R3>(softmax(scores), [B * nKv, g * T, S]);
    const ctxv = bmm(probs, tf.reshape(v, [B * nKv, S, hd])); // (B·nKv, g·T, hd)
    return tf.reshape<tf.Rank.R2>(T === 1 ? ctxv : tf.transpose(tf.reshape(ctxv, [B, nH, T, hd]), [0, 2, 1, 3]), [B * T, nH * hd]);
  }

  /** One decoder layer: x [N, hidden] → x [N, hidden], with this layer's keys (B, nKv, hd, S) and
   *  values (B, nKv, S, hd) after the cache (if any). With a shared prefix (ctx.shared) x holds the
   *  prefix's rows, then every row's rest: the prefix attends over itself, each row's rest over the
   *  prefix's keys and values followed by its own (the keys it would see unshared, in the same order);
   *  the keys and values returned are then the rest's own. */
  private layer(l: number, x: tf.Tensor2D, ctx: LayerInputs): { x: tf.Tensor2D; kT: tf.Tensor4D; v: tf.Tensor4D } {
    const { B, T, cos, sin, bias, opts, cache, shared } = ctx;
    const lw = this.weights.layers[l];
    const S = bias.shape[3];
    const h = this.rmsNorm(x, lw.inputNorm);
    const qkv = this.proj(l, "qkv_proj", h, opts); // [N, (nH + 2·nKv)·hd]
    let att: tf.Tensor2D, kT: tf.Tensor, v: tf.Tensor;
    if (shared) {
      const P = shared.P,
        W = qkv.shape[1];
      const pre = this.heads(tf.slice(qkv, [0, 0], [P, W]), shared.cos, shared.sin, 1, P, false);
      const own = this.heads(tf.slice(qkv, [P, 0], [B * T, W]), cos, sin, B, T, false);
      ({ kT, v } = own);
      const keys = tf.concat([tf.tile(pre.kT, [B, 1, 1, 1]), own.kT], 3), // (B, nKv, hd, P + T)
        values = tf.concat([tf.tile(pre.v, [B, 1, 1, 1]), own.v], 2); // (B, nKv, P + T, hd)
      att = tf.concat([this.attend(pre.qg, pre.kT, pre.v, shared.bias, 1, P), this.attend(own.qg, keys, values, bias, B, T)], 0);
    } else {
      // a decode step into a cache with room: its new key and value may go straight into the slot
      const slot =
        T === 1 && cache && cache.length && cache.writesInPlace(l, S) ? { k: cache.k[l], v: cache.v[l], pos: cache.length } : null;
      const h = this.heads(qkv, cos, sin, B, T, T === 1 && cache !== null, slot);
      ({ kT, v } = h);
      if (cache && cache.length && !h.inSlot) [kT, v] = cache.extend(l, kT as tf.Tensor4D, v as tf.Tensor4D, S); // (B, nKv, hd, S), (B, nKv, S, hd)
      att = this.attend(h.qg, kT, v, bias, B, T, ctx.kvBias);
    }
    x = this.proj(l, "o_proj", att, opts, x);
    const n = this.rmsNorm(x, lw.postNorm);
    const act = swiglu(this.proj(l, "gate_up_proj", n, opts)); // silu(gate)·up, [N, I]
    x = this.proj(l, "down_proj", act, opts, x);
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
    const mask = checkBatch(this.config.vocabSize, inputIds, attentionMask);
    const B = inputIds.length,
      T = inputIds[0].length,
      H = this.config.hiddenSize;
    const spans = logprobSpans(opts.logprobMask, B, T);
    const res: { lp: tf.Tensor2D; ent?: tf.Tensor2D } = tf.tidy(() => {
      if (spans.every(([lo, hi]) => hi <= lo)) return { lp: tf.zeros([B, T]) as tf.Tensor2D, ent: tf.zeros([B, T]) as tf.Tensor2D };
      const P = this.sharedPrefix(inputIds, mask, opts);
      const { hidden } = this.run(inputIds, mask, opts, null, P); // [B·T, H], or [P + B·(T − P), H]
      // Only each row's span [lo, hi) reaches the head, position t's log-prob from hidden row t − 1 (the
      // vocabulary product is ~a quarter of a 0.5B token's forward, and a GRPO rollout's prompt needs
      // none); the rest of the row is 0. Positions [lo − 1, hi − 1) of row b, in runs of hidden's rows.
      const runsOf = (b: number, t0: number, t1: number): [number, number][] =>
        P === 0
          ? [[b * T + t0, t1 - t0]]
          : ([
              [t0, Math.min(t1, P) - t0], // in the shared prefix
              [P + b * (T - P) + Math.max(t0, P) - P, t1 - Math.max(t0, P)], // in the row's own part
            ] as [number, number][]);
      const targets = spans.flatMap(([lo, hi], b) => inputIds[b].slice(lo, hi));
      if (backendProfile().dispatchBound) {
        // The spans' hidden rows by one gather, and the head's rows back to [B, T] by another from
        // them and a zero row (outside a span, or where logprobMask is 0): a few dispatches whatever
        // the rows, where a slice and a pad per row are ~10 each.
        const rows = spans.flatMap(([lo, hi], b) =>
          hi > lo ? runsOf(b, lo - 1, hi - 1).flatMap(([r, n]) => Array.from({ length: Math.max(0, n) }, (_, i) => r + i)) : [],
        );
        const both = headLogprobs(this.head, tf.gather(hidden, tf.tensor1d(rows, "int32")), targets, this.config.vocabSize);
        let k = 0;
        const at = new Int32Array(B * T).fill(targets.length); // the zero row
        spans.forEach(([lo, hi], b) => {
          for (let t = lo; t < hi; t++, k++) if (!opts.logprobMask || opts.logprobMask[b][t]) at[b * T + t] = k;
        });
        const placed = tf.gather(tf.concat([both, tf.zeros([1, 2])], 0), tf.tensor1d(at, "int32")); // [B·T, 2]
        const column = (col: number) => tf.reshape(tf.slice(placed, [0, col], [B * T, 1]), [B, T]) as tf.Tensor2D;
        return { lp: column(0), ent: opts.withEntropy ? column(1) : undefined };
      }
      const pieces = spans.flatMap(([lo, hi], b) =>
        hi > lo ? runsOf(b, lo - 1, hi - 1).flatMap(([r, n]) => (n > 0 ? [tf.slice(hidden, [r, 0], [n, H])] : [])) : [],
      );
      const both = headLogprobs(
        this.head,
        pieces.length === 1 ? pieces[0] : (tf.concat(pieces, 0) as tf.Tensor2D),
        targets,
        this.config.vocabSize,
      ); // [Σ spans, 2]
      const keep = opts.logprobMask ? tf.tensor2d(opts.logprobMask.flat(), [B, T], "float32") : null;
      const rowsOf = (col: number) => {
        let k = 0;
        const rows = spans.map(([lo, hi]) => {
          const n = Math.max(0, hi - lo);
          const r = n > 0 ? tf.pad(tf.reshape(tf.slice(both, [k, col], [n, 1]), [n]), [[lo, T - hi]]) : tf.zeros([T]);
          k += n;
          return r;
        });
        const all = tf.stack(rows) as tf.Tensor2D; // [B, T]
        return keep ? (tf.mul(all, keep) as tf.Tensor2D) : all; // 0 where logprobMask is 0
      };
      return { lp: rowsOf(0), ent: rowsOf(1) };
    });
    if (opts.withEntropy) return { logprobs: res.lp, entropy: res.ent };
    res.ent?.dispose();
    return { logprobs: res.lp };
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
    const mask = checkBatch(this.config.vocabSize, inputIds, attentionMask);
    // A GRPO group is G rollouts of one prompt: each distinct row is run once and its keys, values
    // and logits copied to its repeats (rows are independent, so the result is the same bits).
    const { unique, of } = distinctRows(inputIds, mask);
    if (unique.length < inputIds.length) {
      const once = this.prefill(
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
      rows = Math.max(
        1,
        Math.floor((this.prefillBytes ?? backendProfile().prefillBytes) / layerTapeBytes(this.config, 1, inputIds[0].length)),
      );
    const parts: { logits: tf.Tensor2D; cache: Qwen2KVCache }[] = [];
    for (let r = 0; r < B; r += rows) {
      const cache = Qwen2KVCache.empty(Math.min(rows, B - r));
      parts.push({ logits: this.step(inputIds.slice(r, r + rows), mask.slice(r, r + rows), cache, opts), cache });
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

  decodeStep(tokens: number[], cache: KVCache, opts: ForwardOptions = {}): tf.Tensor2D {
    if (!(cache instanceof Qwen2KVCache)) throw new Error("decodeStep needs the cache returned by prefill()");
    if (tokens.length !== cache.batchSize) throw new Error(`decodeStep got ${tokens.length} tokens for a cache of ${cache.batchSize} rows`);
    const ids = tokens.map((t) => [t]);
    const hold = opts.hold;
    if (hold && hold.length !== tokens.length) throw new Error(`decodeStep got ${hold.length} hold flags for ${tokens.length} rows`);
    return this.step(ids, checkBatch(this.config.vocabSize, ids, hold ? hold.map((h) => [h ? 0 : 1]) : undefined), cache, opts);
  }

  private step(ids: number[][], mask: number[][], cache: Qwen2KVCache, opts: ForwardOptions): tf.Tensor2D {
    const B = ids.length,
      T = ids[0].length,
      H = this.config.hiddenSize;
    const out = tf.tidy(() => {
      const { hidden, newK, newV } = this.run(ids, mask, opts, cache);
      const last = tf.reshape<tf.Rank.R2>(tf.slice(tf.reshape(hidden, [B, T, H]), [0, T - 1, 0], [B, 1, H]), [B, H]);
      return { logits: this.head.matmul(last), k: newK, v: newV };
    });
    const kept = new Set<tf.Tensor>([...out.k, ...out.v]); // written in place: the same tensors
    tf.dispose([...cache.k, ...cache.v].filter((t) => !kept.has(t)));
    cache.k = out.k;
    cache.v = out.v;
    cache.mask = cache.mask.map((r, b) => r.concat(mask[b]));
    cache.count = cache.count.map((c, b) => c + mask[b].reduce((s, m) => s + (m ? 1 : 0), 0));
    return out.logits;
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
    const unpacks = this.quantize !== "none" && !this.unpacked && this.unpackForGeneration;
    const ad = unpacks && opts.mergeAdapter ? this.adapter : null; // the adapter to merge
    const outDim = (m: LoraTarget) => moduleDims(this.config, m)[1];
    // The adapter's fused factors are held for generation too (lora.ts holdFactors), unless merged:
    // then no LoRA product runs.
    const releaseFactors = ad
      ? () => {}
      : (this.adapter?.holdFactors(
          FUSED_MODULES.map((f) => FUSED[f]),
          outDim,
        ) ?? (() => {}));
    if (!unpacks) return releaseFactors;
    const pack = unpackLinear(this.weights, opts.left ?? this.unpackLeft);
    this.unpacked = true;
    if (ad) {
      for (const f of FUSED_MODULES) {
        const dims = FUSED[f].map(outDim);
        this.weights.layers.forEach((lw, l) => lw.proj[f].addToUnpacked((outIn) => ad.fusedWeightDelta(l, FUSED[f], dims, outIn)));
      }
      this.merged = ad;
    }
    return () => {
      pack();
      this.unpacked = false;
      this.merged = null;
      releaseFactors();
    };
  }

  /** Attach another adapter (or none) and hand back the one attached before, not disposed: a server
   *  holding several adapters switches between them per decode batch (serve/openai/batcher.ts). */
  swapAdapter(adapter: LoraAdapter | null): LoraAdapter | null {
    if (this.merged && adapter !== this.merged)
      throw new Error("swapAdapter: the adapter is merged into the unpacked base (unpackBase mergeAdapter); release it first");
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

/** Per row, the positions [lo, hi) from the first to the last 1 of `mask` (lo ≥ 1: position 0 has no
 *  log-prob; hi ≤ lo when the row needs none); without a mask every row needs [1, T). */
export function logprobSpans(mask: number[][] | undefined, B: number, T: number): [number, number][] {
  if (!mask) return Array.from({ length: B }, () => [1, T]);
  if (mask.length !== B || mask.some((r) => r.length !== T))
    throw new Error(`logprobMask is [${mask.length}][${mask[0]?.length}]; expected [${B}][${T}] like the ids`);
  return mask.map((r) => {
    let lo = 1,
      hi = T;
    while (lo < T && r[lo] === 0) lo++;
    while (hi > lo && r[hi - 1] === 0) hi--;
    return [lo, hi];
  });
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
