/** LoRA adapters as PEFT's: y = x Wᵀ + b + dropout(x) Aᵀ Bᵀ · (alpha / r) on any of the 7 linear
 *  modules of each layer. A and B are held transposed ([in, r] and [r, out]) so both products are
 *  plain 2-D matMuls; they are transposed back to torch's A [r, in], B [out, r] for PEFT's files
 *  (peft.ts reads and writes them). Init as PEFT: A kaiming-uniform(a=√5) (bound 1/√in, like torch
 *  nn.Linear), B zeros. Leaves out: DoRA, rsLoRA, per-module rank/alpha patterns (peft.ts refuses them). */
import * as tf from "@tensorflow/tfjs";
import { Rng } from "../util/rng.ts";
import { mm, mmAdd, type FrozenProduct } from "../kernels/matmul.ts";
import { loraLinear, loraLinearRuns } from "../kernels/lora-linear.ts";
import { backendProfile } from "../kernels/profile.ts";
import { blockDiagonal } from "../kernels/block-diag.ts";
import { checkLoraConfig, peftKey, readAdapterConfig, readPeftFactors } from "./peft.ts";
import type { HostTensor } from "./safetensors.ts";
import type { LoraConfig, LoraTarget, Qwen2Config } from "./types.ts";

/** [in, out] of each linear module of a Qwen2 layer. */
export function moduleDims(cfg: Qwen2Config, m: LoraTarget): [number, number] {
  const q = cfg.numAttentionHeads * cfg.headDim,
    kv = cfg.numKeyValueHeads * cfg.headDim;
  const H = cfg.hiddenSize,
    I = cfg.intermediateSize;
  const dims: Record<LoraTarget, [number, number]> = {
    q_proj: [H, q],
    k_proj: [H, kv],
    v_proj: [H, kv],
    o_proj: [q, H],
    gate_proj: [H, I],
    up_proj: [H, I],
    down_proj: [I, H],
  };
  return dims[m];
}

let adapterCount = 0;

interface Pair {
  a: tf.Variable; // [in, r]  (Aᵀ)
  b: tf.Variable; // [r, out] (Bᵀ)
}

export class LoraAdapter {
  readonly scaling: number;
  private readonly pairs = new Map<string, Pair>();
  private dropoutRng: Rng;
  private readonly uid = ++adapterCount;
  /** Fused factors kept for generation (holdFactors, fusedDelta), by layer and module. */
  private holding = false;
  /** The scaling as a tensor while factors are held: a number would be a new host scalar, uploaded to
   *  a GPU backend, at every product. */
  private heldScaling: tf.Scalar | null = null;
  private readonly fusedCache = new Map<string, { ids: object[]; a: tf.Tensor2D; b: tf.Tensor2D; scaled: boolean }>();

  private constructor(
    readonly config: LoraConfig,
    readonly numLayers: number,
    seed: number,
  ) {
    checkLoraConfig(config);
    this.scaling = config.alpha / config.r;
    this.dropoutRng = new Rng(seed ^ 0x5eed);
  }

  /** Fresh adapter, PEFT init, seeded. */
  static init(model: Qwen2Config, config: LoraConfig, seed = 0): LoraAdapter {
    const ad = new LoraAdapter({ ...config, targetModules: [...config.targetModules] }, model.numHiddenLayers, seed);
    const rng = new Rng(seed);
    for (let l = 0; l < model.numHiddenLayers; l++)
      for (const m of config.targetModules) {
        const [inD, outD] = moduleDims(model, m);
        const bound = 1 / Math.sqrt(inD); // kaiming_uniform(a=√5) on A [r, in]: gain √(1/3) · √(3/fan_in)
        const a = new Float32Array(inD * config.r);
        for (let i = 0; i < a.length; i++) a[i] = (2 * rng.next() - 1) * bound;
        ad.set(l, m, tf.tensor2d(a, [inD, config.r]), tf.zeros([config.r, outD]));
      }
    return ad;
  }

  /** PEFT folder → adapter, checked against the model's shapes (peft.ts). Errors name the file. */
  static async load(dir: string, model: Qwen2Config, seed = 0): Promise<LoraAdapter> {
    const config = await readAdapterConfig(dir);
    const factors = await readPeftFactors(dir, config, model.numHiddenLayers, (m) => moduleDims(model, m));
    const ad = new LoraAdapter(config, model.numHiddenLayers, seed);
    // torch layout → ours; tidy frees the untransposed copies (24 tensors a load for the tiny preset's adapter otherwise)
    for (const { layer, module: m, A, B } of factors)
      ad.set(
        layer,
        m,
        tf.tidy(() => tf.transpose(tf.tensor2d(A.data, A.shape as [number, number]))),
        tf.tidy(() => tf.transpose(tf.tensor2d(B.data, B.shape as [number, number]))),
      );
    return ad;
  }

  private set(layer: number, m: LoraTarget, aT: tf.Tensor, bT: tf.Tensor): void {
    const name = peftKey(layer, m, "A").replace(/\.lora_A\.weight$/, "");
    // tfjs variable names are global: a per-adapter suffix lets several models coexist
    this.pairs.set(`${layer}.${m}`, {
      a: tf.variable(aT, true, `${name}.lora_A#${this.uid}`),
      b: tf.variable(bT, true, `${name}.lora_B#${this.uid}`),
    });
    aT.dispose();
    bT.dispose();
  }

  /** The LoRA term for x [N, in] → [N, out], or null when this module has no adapter. */
  delta(layer: number, m: LoraTarget, x: tf.Tensor2D, training: boolean): tf.Tensor2D | null {
    const p = this.pairs.get(`${layer}.${m}`);
    if (!p) return null;
    const xin =
      training && this.config.dropout > 0
        ? (tf.dropout(x, this.config.dropout, undefined, this.dropoutRng.int(0, 2 ** 31 - 1)) as tf.Tensor2D)
        : x;
    // scaled between the products, as fusedDelta does, so every path rounds alike
    return mm(tf.mul(mm(xin, p.a as tf.Tensor as tf.Tensor2D), this.scaling), p.b as tf.Tensor as tf.Tensor2D);
  }

  /** The LoRA terms of a fused module's members for x [N, in] → [N, Σout]: the members' outputs side
   *  by side (zeros for a member without adapter), or null when none has one. Without dropout the
   *  members share one product x·[A₁|A₂|…] [in, k·r] and one with the block-diagonal B
   *  [k·r, Σout] (each Bᵢ padded with zero columns to its place): two matMuls per fused module instead
   *  of two per member. While training with dropout each member draws its own mask (PEFT has one
   *  lora_dropout per module), so each takes its own products. While generation holds the factors
   *  (holdFactors) and no gradient tape records, they are built once and rebuilt only when a
   *  variable changes (an assign gives it a new dataId); the products are the same either way. */
  fusedDelta(layer: number, members: readonly LoraTarget[], outDims: number[], x: tf.Tensor2D, training: boolean): tf.Tensor2D | null {
    const pairs = members.map((m) => this.pairs.get(`${layer}.${m}`));
    if (!pairs.some((p) => p)) return null;
    const held = this.heldNow();
    if ((members.length === 1 && !held) || (training && this.config.dropout > 0)) {
      const ds = members.map((m, i) => this.delta(layer, m, x, training) ?? tf.zeros([x.shape[0], outDims[i]]));
      return ds.length === 1 ? (ds[0] as tf.Tensor2D) : (tf.concat(ds, 1) as tf.Tensor2D);
    }
    const fuse = this.fuser(pairs, outDims);
    if (!held) {
      const f = fuse();
      return mm(tf.mul(mm(x, f.a), this.scaling) as tf.Tensor2D, f.b); // [N, k·r] → [N, Σout]
    }
    return this.heldTerms(layer, members, pairs, fuse, x, null);
  }

  /** y + fusedDelta (y itself when no member has an adapter). Where the backend profile has
   *  fusedAddend (webgpu), y is the last product's epilogue (tfjs' fused matMul with y as its bias):
   *  one dispatch fewer per fused module, in decode steps (held factors) and in training (mmAdd, its
   *  gradient y's too); with dropout each member's own products and an add. */
  addFusedDelta(
    layer: number,
    members: readonly LoraTarget[],
    outDims: number[],
    x: tf.Tensor2D,
    training: boolean,
    y: tf.Tensor2D,
  ): tf.Tensor2D {
    const dropout = training && this.config.dropout > 0;
    if (!dropout && backendProfile().fusedAddend) {
      const pairs = members.map((m) => this.pairs.get(`${layer}.${m}`));
      if (!pairs.some((p) => p)) return y;
      if (this.heldNow()) return this.heldTerms(layer, members, pairs, this.fuser(pairs, outDims), x, y);
      // y as the second product's epilogue, differentiable (mmAdd): one dispatch fewer per module
      const f =
        pairs.length === 1
          ? { a: pairs[0]!.a as tf.Tensor as tf.Tensor2D, b: pairs[0]!.b as tf.Tensor as tf.Tensor2D }
          : this.fuser(pairs, outDims)();
      return mmAdd(tf.mul(mm(x, f.a), this.scaling) as tf.Tensor2D, f.b, y);
    }
    const d = this.fusedDelta(layer, members, outDims, x, training);
    return d ? tf.add(y, d) : y;
  }

  /** A frozen fused module with its members' LoRA terms as one op (lora-linear.ts: 5 dispatches where
   *  the ops take 10 to 17), where it runs: webgpu, every member with an adapter, no dropout while
   *  training and no held factors (generation's); null elsewhere (the caller takes the ops). act
   *  "swiglu" (gate/up): the output is the activation, silu(gate)·up. */
  linear(
    layer: number,
    members: readonly LoraTarget[],
    x: tf.Tensor2D,
    training: boolean,
    base: () => FrozenProduct | null,
    addend?: tf.Tensor2D,
    act?: "swiglu",
  ): tf.Tensor2D | null {
    if ((training && this.config.dropout > 0) || this.heldNow()) return null;
    const pairs = members.map((m) => this.pairs.get(`${layer}.${m}`));
    if (!pairs.every((p) => p)) return null;
    const as = pairs.map((p) => p!.a as tf.Tensor as tf.Tensor2D),
      bs = pairs.map((p) => p!.b as tf.Tensor as tf.Tensor2D);
    if (!loraLinearRuns(as, bs)) return null;
    const product = base();
    return product && loraLinear(x, product, addend, as, bs, this.scaling, act);
  }

  /** A fused module's weight delta scaling · [A₁|A₂|…] · blockdiag(B₁, B₂, …) [in, Σout] (zero columns
   *  for a member without adapter), or its transpose [Σout, in] with outIn (the product taken as
   *  Bᵀ·Aᵀ, no transpose of the result), or null when no member has one: what merging the adapter
   *  into a base held in f32 for generation adds to it (PEFT's merge_adapter). Call inside tf.tidy. */
  fusedWeightDelta(layer: number, members: readonly LoraTarget[], outDims: number[], outIn = false): tf.Tensor2D | null {
    const pairs = members.map((m) => this.pairs.get(`${layer}.${m}`));
    if (!pairs.some((p) => p)) return null;
    const f = this.fuser(pairs, outDims)();
    return tf.mul(outIn ? tf.matMul(f.b, f.a, true, true) : tf.matMul(f.a, f.b), this.scaling) as tf.Tensor2D;
  }

  /** Whether products use the held factors: generation holds them and no gradient tape records. */
  private heldNow(): boolean {
    return this.holding && tf.engine().state.gradientDepth === 0;
  }

  /** The held path: x·A, scaled unless the scaling is in B, times B, plus y as the product's
   *  epilogue where given. */
  private heldTerms(
    layer: number,
    members: readonly LoraTarget[],
    pairs: (Pair | undefined)[],
    fuse: () => { a: tf.Tensor2D; b: tf.Tensor2D },
    x: tf.Tensor2D,
    y: tf.Tensor2D | null,
  ): tf.Tensor2D {
    const c = this.heldFactors(layer, members, pairs, fuse);
    const xa = tf.matMul(x, c.a);
    const a = c.scaled ? xa : (tf.mul(xa, this.heldScaling ?? this.scaling) as tf.Tensor2D);
    return (y ? tf.fused.matMul({ a, b: c.b, bias: y }) : tf.matMul(a, c.b)) as tf.Tensor2D;
  }

  /** [A₁|A₂|…] [in, k·r] and the block-diagonal B [k·r, Σout] of a fused module's members. */
  private fuser(pairs: (Pair | undefined)[], outDims: number[]): () => { a: tf.Tensor2D; b: tf.Tensor2D } {
    const total = outDims.reduce((a, b) => a + b, 0);
    return () => {
      // webgpu: B's block-diagonal as one kernel (k pads and a concat are k + 1 dispatches each way)
      const diag = pairs.every((p) => p) ? blockDiagonal(pairs.map((p) => p!.b as tf.Tensor as tf.Tensor2D)) : null;
      if (diag)
        return {
          a:
            pairs.length === 1
              ? (pairs[0]!.a as tf.Tensor as tf.Tensor2D)
              : tf.concat(
                  pairs.map((p) => p!.a as tf.Tensor as tf.Tensor2D),
                  1,
                ),
          b: diag,
        };
      const as: tf.Tensor2D[] = [],
        bs: tf.Tensor2D[] = [];
      let off = 0;
      pairs.forEach((p, i) => {
        if (p) {
          as.push(p.a as tf.Tensor as tf.Tensor2D);
          bs.push(
            tf.pad(p.b as tf.Tensor as tf.Tensor2D, [
              [0, 0],
              [off, total - off - outDims[i]],
            ]),
          ); // [r, Σout]
        }
        off += outDims[i];
      });
      return { a: as.length === 1 ? as[0] : tf.concat(as, 1), b: bs.length === 1 ? bs[0] : tf.concat(bs, 0) }; // [in, k·r], [k·r, Σout]
    };
  }

  /** The held factors of one fused module, built when missing or when a variable was assigned since. */
  private heldFactors(
    layer: number,
    members: readonly LoraTarget[],
    pairs: (Pair | undefined)[],
    fuse: () => { a: tf.Tensor2D; b: tf.Tensor2D },
  ) {
    const key = `${layer}.${members.join()}`,
      ids = pairs.flatMap((p) => (p ? [p.a.dataId, p.b.dataId] : []));
    let c = this.fusedCache.get(key);
    if (!c || c.ids.some((id, i) => id !== ids[i])) {
      if (c) tf.dispose([c.a, c.b]);
      // clones: a lone member's A is the variable itself, which the cache must not dispose
      // A power-of-two scaling goes into B once: (x·A)·(s·B) has the bits of ((x·A)·s)·B (scaling by
      // 2^k is exact), one product fewer per module and step; any other scaling stays a product.
      const scaled = 2 ** Math.round(Math.log2(this.scaling)) === this.scaling;
      const f = tf.tidy(() => {
        const t = fuse();
        return { a: tf.clone(t.a), b: (scaled ? tf.mul(t.b, this.scaling) : tf.clone(t.b)) as tf.Tensor2D };
      });
      c = { ids, a: tf.keep(f.a), b: tf.keep(f.b), scaled };
      this.fusedCache.set(key, c);
    }
    return c;
  }

  /** Keep each fused module's factors between products without a gradient tape (a decode step
   *  would otherwise rebuild them every step) until the returned function is called; `modules` (with
   *  their members' output sizes) are built at once. Nested holds are no-ops, as nested unpackBase
   *  calls are. */
  holdFactors(modules: readonly (readonly LoraTarget[])[] = [], outDim: (m: LoraTarget) => number = () => 0): () => void {
    if (this.holding) return () => {}; // nested: the first hold's release drops them
    this.holding = true;
    this.heldScaling = tf.keep(tf.scalar(this.scaling));
    // Built now, as unpackBase dequantizes now: the tensors live from hold to release.
    for (let l = 0; l < this.numLayers; l++)
      for (const members of modules) {
        const pairs = members.map((m) => this.pairs.get(`${l}.${m}`));
        if (pairs.some((p) => p)) this.heldFactors(l, members, pairs, this.fuser(pairs, members.map(outDim)));
      }
    return () => {
      this.holding = false;
      this.dropFactors();
      this.heldScaling?.dispose();
      this.heldScaling = null;
    };
  }

  private dropFactors(): void {
    for (const c of this.fusedCache.values()) tf.dispose([c.a, c.b]);
    this.fusedCache.clear();
  }

  /** Module m's factors of layer `layer` (Aᵀ [in, r], Bᵀ [r, out]), or null when it has no adapter. */
  pair(layer: number, m: LoraTarget): { a: tf.Variable; b: tf.Variable } | null {
    return this.pairs.get(`${layer}.${m}`) ?? null;
  }

  variables(): tf.Variable[] {
    return [...this.pairs.values()].flatMap((p) => [p.a, p.b]);
  }

  /** PEFT names → torch-layout tensors (A [r, in], B [out, r]). */
  async toPeft(): Promise<Record<string, HostTensor>> {
    const out: Record<string, HostTensor> = {};
    for (const [key, p] of this.pairs) {
      const [l, m] = key.split(".") as [string, LoraTarget];
      for (const [which, v] of [
        ["A", p.a],
        ["B", p.b],
      ] as const) {
        const t = tf.transpose(v);
        out[peftKey(Number(l), m, which)] = { shape: t.shape, data: (await t.data()) as Float32Array };
        t.dispose();
      }
    }
    return out;
  }

  dispose(): void {
    this.dropFactors();
    for (const p of this.pairs.values()) tf.dispose([p.a, p.b]);
    this.pairs.clear();
  }
}
