/** The compiled decoder's dispatches: every pipeline compiled once per shape (PipelineCache), and
 *  for one set of buffers and weights the plan of a pass (Plan), each dispatch a pipeline with its
 *  bind group, made once and reused by every pass:
 *  - rows: the embedding (a dispatch per column block of Eᵀ), then per layer: norm + LoRA A (q/k/v),
 *    q/k/v, attention, o's LoRA A (where o has one), o, norm + LoRA A (gate/up), gate/up, down's LoRA A
 *    (where down has one), down;
 *  - head (passes that sample): the final norm and the head's product per column block;
 *  - the draw or the top-k/top-p candidates, made on first use per temperature (and K). */
import type * as tf from "@tensorflow/tfjs";
import type { WeightsOnDevice } from "../../../model/types.ts";
import type { BaseWeight } from "../../../model/weight.ts";
import type { DecoderStats } from "./decoder.ts";
import { attnKernel, embedKernel, mmKernel, prepKernel } from "./layer-programs.ts";
import { MM_COLS, TM, type DecodeShape, type Kernel, type MmKind, type PrepKind, type WeightFormat } from "./layout.ts";
import { candidatesKernel, sampleKernel } from "./vocab-programs.ts";

/** The buffers the decoder owns (decoder.ts allocate). */
export interface DecoderBuffers {
  scratch: GPUBuffer;
  meta: GPUBuffer;
  params: GPUBuffer;
  lora: GPUBuffer;
  logits: GPUBuffer;
  uniforms: GPUBuffer; // one 256-byte slot a layer: its index
  kc: GPUBuffer[];
  vc: GPUBuffer[];
}

export interface Dispatch {
  pipeline: GPUComputePipeline;
  group: GPUBindGroup;
  /** Workgroups (x, y) for a pass of M rows of which S sample. */
  grid: (M: number, S: number) => [number, number];
}

type Binding = GPUBuffer | { buffer: GPUBuffer; offset: number; size: number };

/** Pipelines by kernel and shape: a shape's are compiled once, whatever plans come and go. */
export class PipelineCache {
  private readonly made = new Map<string, { pipeline: GPUComputePipeline; layout: GPUBindGroupLayout }>();
  constructor(
    private readonly device: GPUDevice,
    private readonly stats: DecoderStats,
  ) {}

  get(k: Kernel, shape: DecodeShape): { pipeline: GPUComputePipeline; layout: GPUBindGroupLayout } {
    const key = `${k.key}|${JSON.stringify(shape)}`;
    let p = this.made.get(key);
    if (p) return p;
    const layout = this.device.createBindGroupLayout({
      entries: k.bindings.map(([, kind], i) => ({
        binding: i,
        visibility: GPUShaderStage.COMPUTE,
        buffer: { type: kind as GPUBufferBindingType },
      })),
    });
    const pipeline = this.device.createComputePipeline({
      layout: this.device.createPipelineLayout({ bindGroupLayouts: [layout] }),
      compute: { module: this.device.createShaderModule({ code: k.code }), entryPoint: "entry" },
    });
    this.stats.pipelinesCreated++;
    this.made.set(key, (p = { pipeline, layout }));
    return p;
  }
}

export class Plan {
  readonly rows: Dispatch[] = [];
  readonly head: Dispatch[] = [];
  /** Dispatches of `rows` before the first layer (the embedding's column blocks). */
  readonly embedDispatches: number;
  private readonly vocab = new Map<string, Dispatch>();

  constructor(
    private readonly o: {
      device: GPUDevice;
      pipelines: PipelineCache;
      stats: DecoderStats;
      model: WeightsOnDevice;
      shape: DecodeShape;
      bufs: DecoderBuffers;
      /** A tensor's GPU buffer as tfjs holds it. */
      buffer: (t: tf.Tensor) => GPUBuffer;
    },
  ) {
    const { shape: s, bufs: b, model } = o;
    const w = model.weights,
      L = model.config.numHiddenLayers;
    const common = { s: b.scratch, rin: b.meta, params: b.params, lora: b.lora };
    const layer = (l: number) => ({ buffer: b.uniforms, offset: 256 * l, size: 16 });
    const flat =
      (threads: (M: number) => number) =>
      (M: number): [number, number] => {
        const n = Math.ceil(threads(M) / 64);
        return n <= 65535 ? [n, 1] : [65535, Math.ceil(n / 65535)];
      };
    let off = 0;
    for (const part of blocks(w.embedT)) {
      const n = part.shape[1];
      this.rows.push(
        this.dispatch(
          embedKernel(s, off, n),
          { s: b.scratch, rin: b.meta, w: o.buffer(part) },
          flat((M) => M * s.H),
        ),
      );
      off += n;
    }
    this.embedDispatches = this.rows.length;
    const mm = (kind: MmKind, bw: BaseWeight, l: number, units: number, extra: Record<string, GPUBuffer> = {}) => {
      const lay = bw.layout;
      const fmt = lay.kind as WeightFormat;
      const quant = lay.kind === "int8" || lay.kind === "nf4";
      const PR = quant ? lay.rowsPad / (fmt === "int8" ? 4 : 8) : bw.inDim; // packed rows
      const bufs: Record<string, Binding> = {
        ...common,
        ...extra,
        u: layer(l),
        w: o.buffer(lay.kind === "f32" ? lay.w : (lay as { packed: tf.Tensor }).packed),
      };
      if (quant) bufs.sc = o.buffer(lay.scales);
      return this.dispatch(mmKernel(s, kind, fmt, bw.inDim, bw.outDim, PR), bufs, (M) => [Math.ceil(units / MM_COLS), Math.ceil(M / TM)]);
    };
    const prep = (kind: PrepKind, l: number) => this.dispatch(prepKernel(s, kind, L), { ...common, u: layer(l) }, (M) => [M, 1]);
    const hasLora = (k: MmKind) => s.rank > 0 && s.lora[k].some((x) => x);
    for (let l = 0; l < L; l++) {
      const lw = w.layers[l],
        kv = { kc: b.kc[l], vc: b.vc[l] };
      this.rows.push(prep("qkv", l));
      this.rows.push(mm("qkv", lw.proj.qkv_proj, l, (s.nH + 2 * s.nKv) * (s.hd / 2), kv));
      this.rows.push(this.dispatch(attnKernel(s), { s: b.scratch, rin: b.meta, ...kv }, (M) => [M * s.nH, 1]));
      if (hasLora("o")) this.rows.push(prep("o", l));
      this.rows.push(mm("o", lw.proj.o_proj, l, s.H));
      this.rows.push(prep("gateup", l));
      this.rows.push(mm("gateup", lw.proj.gate_up_proj, l, s.I));
      if (hasLora("down")) this.rows.push(prep("down", l));
      this.rows.push(mm("down", lw.proj.down_proj, l, s.H));
    }
    this.head.push(prep("final", 0));
    off = 0;
    for (const part of blocks(w.lmHeadT ?? w.embedT)) {
      const n = part.shape[1];
      const bufs = { s: b.scratch, rin: b.meta, w: o.buffer(part), logits: b.logits };
      this.head.push(
        this.dispatch(mmKernel(s, "head", "f32", s.H, n, s.H, off), bufs, (_, S) => [Math.ceil(n / MM_COLS), Math.ceil(S / TM)]),
      );
      off += n;
    }
  }

  /** The draw at temperature T (0: greedy). */
  draw(T: number): Dispatch {
    return this.perRow(`draw ${T}`, () => sampleKernel(this.o.shape, T));
  }

  /** The K top-k/top-p candidates at temperature T. */
  candidates(K: number, T: number): Dispatch {
    return this.perRow(`candidates ${K} ${T}`, () => candidatesKernel(this.o.shape, K, T));
  }

  private perRow(key: string, k: () => Kernel): Dispatch {
    let d = this.vocab.get(key);
    if (!d) {
      const b = this.o.bufs;
      this.vocab.set(key, (d = this.dispatch(k(), { drawn: b.scratch, rin: b.meta, logits: b.logits }, (_, S) => [S, 1])));
    }
    return d;
  }

  private dispatch(k: Kernel, buffers: Record<string, Binding>, grid: Dispatch["grid"]): Dispatch {
    const { pipeline, layout } = this.o.pipelines.get(k, this.o.shape);
    const group = this.o.device.createBindGroup({
      layout,
      entries: k.bindings.map(([name], i) => {
        const r = buffers[name];
        if (!r) throw new Error(`decoder: kernel ${k.key} binds ${name}, which was not given`);
        return { binding: i, resource: "offset" in r ? r : { buffer: r } };
      }),
    });
    this.o.stats.bindGroupsCreated++;
    return { pipeline, group, grid };
  }
}

/** Eᵀ (or the untied head) as its column blocks: one, or the blocks a device's bindings need. */
function blocks(bw: BaseWeight): tf.Tensor2D[] {
  const l = bw.layout;
  return l.kind === "f32" ? [l.w] : l.kind === "blocks" ? l.parts : [];
}
