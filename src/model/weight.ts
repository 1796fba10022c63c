/** One frozen-or-trainable base matrix held as [in, out] (the layout the wasm matMul fast path wants):
 *  f32 (a constant, or a tf.Variable when the whole model trains) or quantized (int8/nf4, dequantized
 *  on the fly). Quantized matmuls use a custom gradient that dequantizes again in the backward pass,
 *  so the tape never keeps a layer's f32 weights alive.
 * Large frozen f32 models (over 1 GiB on wasm: backendProfile().leftLayoutBytes) hold their matrices as
 * torch's [out, in] instead and multiply
 *  with the weight as the left operand: the fast path packs and caches a copy of every right-hand
 *  weight, which a 2 GB model cannot afford inside the 4 GiB wasm heap.
 *  A frozen f32 matrix larger than the backend's largest storage binding (webgpu:
 *  backendProfile().maxBindingFloats; 0.5B's embedding is 544 MB, a software adapter binds 128 MiB) is
 *  held as column blocks [in, outᵢ]: products are computed per block and concatenated, lookups
 *  gather from every block and keep the block that holds each id. Nothing ever binds the whole. */
import * as tf from "@tensorflow/tfjs";
import { frozenProduct, matMulBT, mm, mmFrozen, mmFrozenLeft, type FrozenProduct } from "../kernels/matmul.ts";
import { backendProfile } from "../kernels/profile.ts";
import { QuantizedMatrix } from "./quant.ts";
import { FUSED_MODULES, type FusedModule, type Quantize } from "./types.ts";
import type { CustomGradFn } from "../kernels/kernels.ts";

export class BaseWeight {
  /** A quantized matrix's f32 values while unpacked (see unpack): [in, out], or [out, in] when left. */
  private unpacked: { w: tf.Tensor2D; left: boolean } | null = null;

  private constructor(
    readonly inDim: number,
    readonly outDim: number,
    readonly f32: tf.Tensor2D | null,
    readonly quant: QuantizedMatrix | null,
    readonly left: tf.Tensor2D | null = null, // frozen f32 held [out, in] (large models)
    readonly parts: tf.Tensor2D[] | null = null, // frozen f32 held as column blocks [in, outᵢ] (file header)
  ) {}

  /** outIn: [out, in] row-major (torch's layout), held as it is (see the file header). */
  static frozenLeft(outIn: Float32Array, inDim: number, outDim: number): BaseWeight {
    return new BaseWeight(inDim, outDim, null, null, tf.tensor2d(outIn, [outDim, inDim]));
  }

  /** data: [in, out] row-major. trainable only with quantize "none". */
  static fromFloat32(data: Float32Array, inDim: number, outDim: number, quantize: Quantize, trainable = false, name?: string): BaseWeight {
    if (quantize === "none") {
      const maxFloats = backendProfile().maxBindingFloats;
      if (!trainable && inDim * outDim > maxFloats)
        return new BaseWeight(inDim, outDim, null, null, null, columnBlocks(data, inDim, outDim, maxFloats));
      const t = tf.tensor2d(data, [inDim, outDim]);
      if (!trainable) return new BaseWeight(inDim, outDim, t, null);
      const v = tf.variable(t, true, name);
      t.dispose();
      return new BaseWeight(inDim, outDim, v as unknown as tf.Tensor2D, null);
    }
    if (trainable) throw new Error(`trainable "full" needs quantize "none", got "${quantize}" (quantized weights are frozen)`);
    return new BaseWeight(inDim, outDim, null, QuantizedMatrix.fromFloat32(quantize, data, inDim, outDim));
  }

  /** How the matrix is held, for kernels that read it as it is (kernels/webgpu/decode/): f32 [in,
   *  out] (frozen or a variable), column blocks [in, outᵢ], quantized codes and scales, or [out, in]. */
  get layout():
    | { kind: "f32"; w: tf.Tensor2D }
    | { kind: "blocks"; parts: tf.Tensor2D[] }
    | { kind: "int8" | "nf4"; packed: tf.Tensor2D; scales: tf.Tensor2D; rowsPad: number }
    | { kind: "left" } {
    if (this.f32) return { kind: "f32", w: this.f32 };
    if (this.parts) return { kind: "blocks", parts: this.parts };
    if (this.quant) return { kind: this.quant.kind, ...this.quant.held };
    return { kind: "left" };
  }

  get bytes(): number {
    if (this.parts) return 4 * this.inDim * this.outDim;
    return this.f32 ? 4 * this.f32.size : this.left ? 4 * this.left.size : this.quant!.bytes;
  }
  get isVariable(): boolean {
    return this.f32 instanceof tf.Variable;
  }

  /** Hold a quantized matrix dequantized until pack(): its products then skip the dequantization
   *  (for generation, where it costs more than the product). The values are the ones dequantize()
   *  gives every time, so results do not change. left: hold it [out, in], multiplied as the left
   *  operand (large models; see the file header). No-op for f32 weights. */
  unpack(left: boolean): void {
    if (!this.quant || this.unpacked) return;
    this.unpacked = { w: tf.tidy(() => (left ? tf.transpose(this.quant!.dequantize()) : this.quant!.dequantize())), left };
  }
  pack(): void {
    this.unpacked?.w.dispose();
    this.unpacked = null;
  }

  /** Adds delta(left) to the values held while unpacked (an adapter merged for generation): delta in
   *  the held layout, [out, in] when left, else [in, out]; null adds nothing. pack() drops the sum, so
   *  the quantized matrix itself never changes. */
  addToUnpacked(delta: (left: boolean) => tf.Tensor2D | null): void {
    const u = this.unpacked;
    if (!u) throw new Error("addToUnpacked: the matrix is not unpacked (unpack it first)");
    const w = tf.tidy(() => {
      const d = delta(u.left);
      return d ? (tf.add(u.w, d) as tf.Tensor2D) : u.w;
    });
    if (w === u.w) return;
    u.w.dispose();
    this.unpacked = { w, left: u.left };
  }

  /** f32 [in, out] (dequantized when quantized). Call inside tf.tidy. Not for a matrix held in column
   *  blocks (it would bind the whole): use matmul, columns, backward or outInData. */
  value(): tf.Tensor2D {
    if (this.parts)
      throw new Error(`a [${this.inDim}, ${this.outDim}] matrix held in ${this.parts.length} blocks has no single value tensor`);
    if (this.left) return tf.transpose(this.left);
    if (this.unpacked) return this.unpacked.left ? tf.transpose(this.unpacked.w) : this.unpacked.w;
    return this.f32 ?? this.quant!.dequantize();
  }

  /** x [N, in] → [N, out], plus a frozen bias [out] and an addend [N, out] (a residual, differentiated)
   *  where given: a frozen matrix held [in, out] takes them as the product's epilogue where the backend
   *  profile says so (mmFrozen), others add them after it. Frozen weights get no gradient; a
   *  quantized one is dequantized again in the backward pass instead of being kept on the tape. */
  matmul(x: tf.Tensor2D, extra: { bias?: tf.Tensor1D; addend?: tf.Tensor2D } = {}): tf.Tensor2D {
    const fw = this.frozenWeight();
    if (fw) return mmFrozen(x, fw.w, fw.wForward, extra);
    const y = this.product(x);
    const b: tf.Tensor2D = extra.bias ? tf.add(y, extra.bias) : y;
    return extra.addend ? tf.add(extra.addend, b) : b;
  }

  /** The product's halves (matmul.ts frozenProduct) with this frozen matrix and `bias`, for ops that
   *  hold it inside their own gradient (lora-linear.ts); null for the matrices mmFrozen does not take
   *  (trained, in column blocks, or held [out, in]). */
  frozen(bias?: tf.Tensor1D): FrozenProduct | null {
    const fw = this.frozenWeight();
    return fw && frozenProduct(fw.w, fw.wForward, bias);
  }

  /** A frozen matrix held [in, out] as mmFrozen and frozenProduct take it: the weight, fetched again
   *  for the backward pass (a quantized one dequantized then), and the one the forward uses where it
   *  is held; null for a trained matrix, one in column blocks or one held [out, in]. */
  private frozenWeight(): { w: () => tf.Tensor2D; wForward?: tf.Tensor2D } | null {
    if (this.isVariable || this.parts || this.left) return null;
    const f32 = this.f32,
      u = this.unpacked,
      q = this.quant;
    if (f32) return { w: () => f32, wForward: f32 };
    if (u && !u.left) return { w: () => u.w, wForward: u.w };
    if (!u && q) return { w: () => q.dequantize() };
    return null;
  }

  /** x · W for the weights mmFrozen does not take: trained, split in parts, or held [out, in]. */
  private product(x: tf.Tensor2D): tf.Tensor2D {
    if (this.isVariable) return mm(x, this.f32!);
    if (this.parts) {
      const parts = this.parts;
      const f = tf.customGrad(((xx: tf.Tensor2D) => ({
        value: tf.concat(
          parts.map((p) => tf.matMul(xx, p)),
          1,
        ) as tf.Tensor2D,
        gradFunc: (dy: tf.Tensor2D) => this.backward(dy),
      })) as unknown as CustomGradFn);
      return f(x) as tf.Tensor2D;
    }
    if (this.left) return mmFrozenLeft(x, this.left);
    const u = this.unpacked!;
    return mmFrozenLeft(x, u.w); // held [out, in]
  }

  /** Columns as rows: [ids.length, in] (embedding lookup on a transposed embedding matrix). A frozen
   *  matrix is looked up inside a custom gradient that saves nothing: recorded as a plain Gather, the
   *  tape would keep a copy of the whole matrix (the wasm backend clones saved inputs by copying;
   *  544 MB for the 0.5B embedding). */
  columns(ids: tf.Tensor1D): tf.Tensor2D {
    if (this.isVariable) return tf.transpose(tf.gather(this.f32!, ids, 1)) as tf.Tensor2D;
    const f = tf.customGrad(((i: tf.Tensor1D) => ({
      value: tf.tidy(() => this.lookup(i)),
      gradFunc: () => tf.zeros(i.shape), // token ids take no gradient (never reached from a variable)
    })) as unknown as CustomGradFn);
    return f(ids) as tf.Tensor2D;
  }

  /** dy [N, out] · wᵀ → [N, in] (the input gradient of a product with this frozen matrix). A matrix held
   *  [out, in] is multiplied as it is (value() would transpose it: 544 MB for the 0.5B head). Call
   *  inside tf.tidy. */
  backward(dy: tf.Tensor2D): tf.Tensor2D {
    const left = this.left ?? (this.unpacked?.left ? this.unpacked.w : null);
    if (left) return tf.matMul(dy, left);
    if (!this.parts) return matMulBT(dy, this.value());
    let off = 0;
    return sumOf(
      this.parts.map((p) => {
        const n = p.shape[1];
        const d = matMulBT(tf.slice(dy, [0, off], [dy.shape[0], n]), p);
        off += n;
        return d;
      }),
    );
  }

  /** The matrix as torch stores it, [out, in] row-major on the host (for saving). */
  async outInData(): Promise<Float32Array> {
    if (!this.parts) {
      const t = tf.tidy(() => (this.left ? tf.clone(this.left) : tf.transpose(this.value())));
      const d = (await t.data()) as Float32Array;
      t.dispose();
      return d;
    }
    const out = new Float32Array(this.inDim * this.outDim);
    let row = 0;
    for (const p of this.parts) {
      const t = tf.transpose(p); // [outᵢ, in]: the next rows of the torch layout
      out.set((await t.data()) as Float32Array, row * this.inDim);
      row += p.shape[1];
      t.dispose();
    }
    return out;
  }

  private lookup(ids: tf.Tensor1D): tf.Tensor2D {
    if (this.parts) {
      // Every block gathers (ids clipped into it) and keeps the rows whose id it holds.
      let off = 0;
      const rows = this.parts.map((p) => {
        const n = p.shape[1];
        const local = tf.clipByValue(tf.sub(ids, tf.scalar(off, "int32")), 0, n - 1);
        const mine = tf.cast(tf.logicalAnd(tf.greaterEqual(ids, off), tf.less(ids, off + n)), "float32"); // [N]
        off += n;
        return tf.mul(tf.transpose(tf.gather(p, local, 1)), tf.expandDims(mine, 1)) as tf.Tensor2D; // [N, in]
      });
      return sumOf(rows);
    }
    if (this.left) return tf.gather(this.left, ids, 0) as tf.Tensor2D;
    const u = this.unpacked;
    if (u) return u.left ? (tf.gather(u.w, ids, 0) as tf.Tensor2D) : tf.transpose(tf.gather(u.w, ids, 1));
    const cols = this.f32 ? (tf.gather(this.f32, ids, 1) as tf.Tensor2D) : this.quant!.columns(ids);
    return tf.transpose(cols);
  }

  dispose(): void {
    this.pack();
    if (this.parts) tf.dispose(this.parts);
    this.f32?.dispose();
    this.left?.dispose();
    this.quant?.dispose();
  }
}

/** data [rows, cols] row-major → tensors of column blocks [rows, colsᵢ], each at most maxFloats. */
function columnBlocks(data: Float32Array, rows: number, cols: number, maxFloats: number): tf.Tensor2D[] {
  const per = Math.max(1, Math.floor(maxFloats / rows));
  const out: tf.Tensor2D[] = [];
  for (let c0 = 0; c0 < cols; c0 += per) {
    const n = Math.min(per, cols - c0);
    const block = new Float32Array(rows * n);
    for (let i = 0; i < rows; i++) block.set(data.subarray(i * cols + c0, i * cols + c0 + n), i * n);
    out.push(tf.tensor2d(block, [rows, n]));
  }
  return out;
}

/** Σ of same-shape tensors by pairwise adds: tfjs' AddN binds every input in one webgpu kernel, and a
 *  stage binds at most 8–16 buffers (a large head can have more blocks). Call inside tf.tidy. */
function sumOf(ts: tf.Tensor2D[]): tf.Tensor2D {
  return ts.reduce((acc, t) => tf.add(acc, t));
}

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

/** Bytes of the frozen base held on the backend (quantized or f32). */
/** Frees every tensor of the weights. */
export function disposeWeights(w: Qwen2Weights): void {
  w.embedT.dispose();
  w.lmHeadT?.dispose();
  w.norm.dispose();
  for (const l of w.layers) {
    tf.dispose([l.inputNorm, l.postNorm, l.qkvBias]);
    for (const f of FUSED_MODULES) l.proj[f].dispose();
  }
}

export function baseBytes(w: Qwen2Weights): number {
  let n = w.embedT.bytes + (w.lmHeadT?.bytes ?? 0) + 4 * w.norm.size;
  for (const l of w.layers) {
    n += 4 * (l.inputNorm.size + l.postNorm.size + l.qkvBias.size);
    for (const f of FUSED_MODULES) n += l.proj[f].bytes;
  }
  return n;
}

/** Bytes of the linear modules of every layer: the part int8/nf4 quantize (embeddings stay f32). */
export function linearBytes(w: Qwen2Weights): number {
  return w.layers.reduce((n, l) => n + FUSED_MODULES.reduce((s, f) => s + l.proj[f].bytes, 0), 0);
}

/** Every layer's linear matrices held dequantized (BaseWeight.unpack) until the returned function
 *  packs them again. Over the profile's leftLayoutBytes of f32 (unless `left` says): held [out, in]
 *  as the left operand, like large f32 models. */
export function unpackLinear(w: Qwen2Weights, left?: boolean): () => void {
  const mats = w.layers.flatMap((l) => FUSED_MODULES.map((f) => l.proj[f]));
  left ??= 4 * mats.reduce((n, m) => n + m.inDim * m.outDim, 0) > backendProfile().leftLayoutBytes;
  for (const m of mats) m.unpack(left);
  return () => {
    for (const m of mats) m.pack();
  };
}
