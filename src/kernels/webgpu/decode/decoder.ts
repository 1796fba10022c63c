/** The compiled decoder: Qwen2 passes as this project's own WGSL programs (layer-programs.ts, vocab-programs.ts; plan.ts) on the
 *  GPUDevice tfjs holds, with the recipe of efficient WebGPU engines:
 *  - pipelines compiled once per shape and capacity; a KV cache of fixed per-layer buffers (slots ×
 *    positions), one scratch buffer for the activations, one small `meta` buffer for a pass's rows;
 *  - bind groups made once per capacity and per set of weight buffers, reused by every pass;
 *  - a pass is one `queue.writeBuffer` of its rows, one command encoder, one compute pass, one submit,
 *    and (when rows sample) one read of 8 bytes a sampling row: the token and its log-prob, drawn on
 *    the device from the host's uniform (sampler.ts' stream and draw: the same tokens as tfjs' webgpu
 *    path up to float rounding of the logits);
 *  - the frozen base is read from the buffers tfjs holds for the model, as it holds them (f32 or
 *    int8/NF4 codes, dequantized inside the products; the embedding's column blocks, if split);
 *    the adapter's factors and the norms and biases (small, and variables in a full fine-tune) are
 *    copied once per prepare() into buffers the decoder owns, so the trainer may assign its
 *    variables freely between generations.
 *  No tfjs op runs in a pass. tfjs' pending commands are submitted before the decoder's (one queue, in
 *  order). A top-k/top-p draw reads each row's K most likely tokens (found on the device) and draws
 *  on the host. Leaves out: f16 math, subgroups, multiple devices. */
import * as tf from "@tensorflow/tfjs";
import { ropeInvFreq, ropeTables } from "../../../model/attention.ts";
import { moduleDims } from "../../../model/lora.ts";
import { FUSED, FUSED_MODULES, hasWeightsOnDevice, type CausalLM, type FusedModule, type LoraTarget } from "../../../model/types.ts";
import type { WeightsOnDevice } from "../../../model/types.ts";
import type { BaseWeight } from "../../../model/weight.ts";
import type { Backend } from "../../kernels.ts";
import { CAND_K, paramsLayout, ROW_INTS, SAMPLE_INTS, scratchLayout, type DecodeShape, type MmKind } from "./layout.ts";
import { PipelineCache, Plan, type DecoderBuffers, type Dispatch } from "./plan.ts";

/** One row of a pass: the token it reads at `pos` of its KV slot; positions below `srcLen` are read
 *  from slot `src` (a prompt prefilled once for its group). */
export interface PassRow {
  token: number;
  slot: number;
  pos: number;
  src?: number;
  srcLen?: number;
}

/** What the decoder has done since it opened (bench and tests read differences around a step). */
export interface DecoderStats {
  passes: number;
  submits: number;
  dispatches: number;
  buffersCreated: number;
  bindGroupsCreated: number;
  pipelinesCreated: number;
  readbackBytes: number;
  /** Host milliseconds writing the rows and encoding the pass, and in queue.submit (which a software
   *  adapter may spend running earlier work). Neither counts the wait for the read. */
  encodeMs: number;
  submitMs: number;
}

export interface PassResult {
  tokens: Int32Array;
  logprobs: Float32Array;
  logits?: Float32Array;
}

/** A pass's draws from its read (per slot: token, log-prob), in the order of the sampling rows' slots. */
export function drawsOf(data: Float32Array, slots: number[]): PassResult {
  const tokens = new Int32Array(slots.length),
    logprobs = new Float32Array(slots.length);
  slots.forEach((slot, k) => {
    tokens[k] = data[2 * slot];
    logprobs[k] = data[2 * slot + 1];
  });
  return { tokens, logprobs };
}

const MM_KIND: Record<FusedModule, MmKind> = { qkv_proj: "qkv", o_proj: "o", gate_up_proj: "gateup", down_proj: "down" };
const STORAGE = () => GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;

/** Why the decoder cannot run this model on this backend, or null when it can. */
export function decoderUnsupported(model: object): string | null {
  if (tf.getBackend() !== "webgpu") return `the compiled decoder runs on --backend webgpu (this run's backend is ${tf.getBackend()})`;
  const m = model as Partial<WeightsOnDevice>;
  if (!m.weights || !m.config) return "the compiled decoder runs WeightsOnDevice models";
  const heads = [m.weights.embedT, ...(m.weights.lmHeadT ? [m.weights.lmHeadT] : [])];
  for (const w of heads) if (!["f32", "blocks"].includes(w.layout.kind)) return `an embedding held as ${w.layout.kind}`;
  for (const l of m.weights.layers)
    for (const f of FUSED_MODULES) {
      const k = l.proj[f].layout.kind;
      if (k === "left" || k === "blocks") return `a linear matrix held as ${k === "left" ? "[out, in]" : "column blocks"}`;
    }
  if (m.config.headDim % 2 !== 0) return `head_dim ${m.config.headDim} is odd`;
  return null;
}

export class Decoder {
  readonly stats: DecoderStats = {
    passes: 0,
    submits: 0,
    dispatches: 0,
    buffersCreated: 0,
    bindGroupsCreated: 0,
    pipelinesCreated: 0,
    readbackBytes: 0,
    encodeMs: 0,
    submitMs: 0,
  };
  private readonly device: GPUDevice;
  private readonly backend: Backend;
  private shape: DecodeShape | null = null;
  private bufs: DecoderBuffers | null = null;
  private readonly pipelines: PipelineCache;
  /** The passes' dispatches over the bound weights and buffers (plan.ts). */
  private plan: Plan | null = null;
  private boundBuffers: GPUBuffer[] = [];
  private metaHost = new Int32Array(0);
  private slots = 0; // KV slots allocated
  /** Read-back buffers not in use (a pass takes one until its read is done). */
  private staging: GPUBuffer[] = [];

  private readonly model: WeightsOnDevice;

  constructor(model: CausalLM) {
    const reason = decoderUnsupported(model);
    if (reason || !hasWeightsOnDevice(model)) throw new Error(reason ?? "no weights on the device");
    this.model = model;
    this.backend = tf.backend() as unknown as Backend;
    this.device = this.backend.device as GPUDevice;
    this.pipelines = new PipelineCache(this.device, this.stats);
  }

  /** Capacity for `slots` rows of `ctx` positions and passes of `rows` rows, and the adapter's
   *  current factors (none with adapters false): buffers grow (never shrink) and pipelines are
   *  compiled when capacity or the adapter's shape changes; bind groups are made again only then or
   *  when a weight buffer changed. Copies the norms, biases and factors (one submit). */
  prepare(slots: number, ctx: number, rows: number, adapters: boolean): void {
    const c = this.model.config;
    const ad = adapters ? this.model.loraAdapter : null;
    const rank = ad ? ad.config.r : 0;
    const lora = {} as DecodeShape["lora"];
    let loraLayer = 0;
    const loraSrc: { t: tf.Tensor; at: number }[][] = c.numHiddenLayers ? Array.from({ length: c.numHiddenLayers }, () => []) : [];
    for (const f of FUSED_MODULES)
      lora[MM_KIND[f]] = FUSED[f].map((m: LoraTarget) => {
        if (!ad || !ad.pair(0, m)) return null;
        const [inD, outD] = moduleDims(c, m);
        const slot = { a: loraLayer, b: loraLayer + inD * rank };
        loraLayer += (inD + outD) * rank;
        for (let l = 0; l < c.numHiddenLayers; l++) {
          const p = ad.pair(l, m);
          if (!p) throw new Error(`the adapter has ${m} on layer 0 but not on layer ${l}`);
          loraSrc[l].push({ t: p.a, at: slot.a }, { t: p.b, at: slot.b });
        }
        return slot;
      });
    lora.head = [];
    const old = this.shape;
    // capacities grow (rounded up) and never shrink, so later generations reuse what is made
    const grow = (have: number | undefined, want: number, round: number, cap = Infinity) =>
      have !== undefined && have >= want ? have : Math.max(want, Math.min(Math.ceil(want / round) * round, cap));
    const shape: DecodeShape = {
      H: c.hiddenSize,
      I: c.intermediateSize,
      nH: c.numAttentionHeads,
      nKv: c.numKeyValueHeads,
      hd: c.headDim,
      V: c.vocabSize,
      eps: c.rmsNormEps,
      rowsCap: grow(old?.rowsCap, rows, 64),
      samplesCap: grow(old?.samplesCap, slots, 16),
      ctx: grow(old?.ctx, ctx, 256, c.maxPositionEmbeddings),
      rank,
      scaling: ad ? ad.scaling : 1,
      lora,
      loraLayer,
    };
    const sameShape = old !== null && JSON.stringify(old) === JSON.stringify(shape);
    if (!sameShape || slots > this.slots) {
      this.slots = Math.max(this.slots, slots);
      this.allocate(shape, this.slots);
    }
    this.shape = shape;

    this.flushTfjs();
    const enc = this.device.createCommandEncoder();
    const b = this.bufs!;
    const p = paramsLayout(shape);
    const copy = (t: tf.Tensor, dst: GPUBuffer, at: number) => enc.copyBufferToBuffer(this.buffer(t), 0, dst, 4 * at, 4 * t.size);
    this.model.weights.layers.forEach((lw, l) => {
      const base = p.LAYERS + l * p.perLayer;
      copy(lw.inputNorm, b.params, base + p.inNorm);
      copy(lw.postNorm, b.params, base + p.postNorm);
      copy(lw.qkvBias, b.params, base + p.bias);
      for (const { t, at } of loraSrc[l]) copy(t, b.lora, l * loraLayer + at);
    });
    copy(this.model.weights.norm, b.params, p.final(c.numHiddenLayers));
    this.flushTfjs(); // uploads the copies' sources may have queued on tfjs' encoder
    this.device.queue.submit([enc.finish()]);
    this.stats.submits++;

    const weights = this.weightBuffers();
    if (!this.plan || !sameShape || weights.some((w, i) => w !== this.boundBuffers[i])) {
      this.plan = new Plan({
        device: this.device,
        pipelines: this.pipelines,
        stats: this.stats,
        model: this.model,
        shape,
        bufs: this.bufs!,
        buffer: (t) => this.buffer(t),
      });
      this.boundBuffers = weights;
    }
  }

  /** One pass over `rows` (at most the prepared rows): the layer stack, then, for `samples` (pass row
   *  indices), the final norm, the head and a draw with uniform `us[k]` at temperature T (0: greedy).
   *  Returns per sampling row the token and its log-prob (sampler.ts' meanings; −1: no finite
   *  largest logit), or, with `logits` true, the sampling rows' logits [samples, V] instead. */
  async pass(rows: PassRow[], samples: number[] = [], us: number[] = [], T = 0, logits = false): Promise<PassResult> {
    const slots = samples.map((m) => rows[m].slot);
    const read = this.submit(rows, samples, us, T, logits, slots);
    if (!read) return { tokens: new Int32Array(0), logprobs: new Float32Array(0) };
    const data = await read;
    if (logits) return { tokens: new Int32Array(0), logprobs: new Float32Array(0), logits: data };
    return drawsOf(data, slots);
  }

  /** pass()'s encoding and submit; the read of what the pass drew (per slot below `readSlots`, or the
   *  logits) starts at once and is returned, null when nothing samples. `slots`: the slot each draw
   *  is written to (default: its pass row's). Synchronous up to the read, so
   *  a caller may submit the next pass before awaiting this one's (the GPU never waits for the host):
   *  a row of the next pass with token −1 reads its slot's draw on the device. */
  submit(
    rows: PassRow[],
    samples: number[] = [],
    us: number[] = [],
    T = 0,
    logits = false,
    slots = samples.map((m) => rows[m].slot),
    readSlots = this.slots,
    candidates = 0,
  ): Promise<Float32Array> | null {
    const s = this.shape!,
      b = this.bufs!,
      plan = this.plan!;
    const M = rows.length,
      S = samples.length;
    if (M === 0 || M > s.rowsCap) throw new Error(`a pass of ${M} rows; the decoder was prepared for 1..${s.rowsCap}`);
    if (S > s.samplesCap) throw new Error(`${S} sampling rows; the decoder was prepared for ${s.samplesCap}`);
    const t0 = performance.now();
    const meta = this.metaHost;
    meta[0] = M;
    meta[1] = S;
    rows.forEach((r, m) => {
      const o = 4 + m * ROW_INTS;
      if (!(r.pos >= 0 && r.pos < s.ctx)) throw new Error(`position ${r.pos} is outside the decoder's ${s.ctx} positions`);
      if (!(r.slot >= 0 && r.slot < this.slots)) throw new Error(`slot ${r.slot} is outside the decoder's ${this.slots} slots`);
      meta[o] = r.token;
      meta[o + 1] = r.slot;
      meta[o + 2] = r.pos;
      meta[o + 3] = r.src ?? r.slot;
      meta[o + 4] = r.srcLen ?? 0;
    });
    const sb = 4 + s.rowsCap * ROW_INTS;
    const f = new Float32Array(1),
      bits = new Int32Array(f.buffer);
    samples.forEach((row, k) => {
      const u = us[k] ?? 0; // as float32 hi + lo
      meta[sb + k * SAMPLE_INTS] = row;
      meta[sb + k * SAMPLE_INTS + 1] = slots[k];
      f[0] = u;
      meta[sb + k * SAMPLE_INTS + 2] = bits[0];
      f[0] = u - f[0];
      meta[sb + k * SAMPLE_INTS + 3] = bits[0];
    });
    this.flushTfjs();
    this.device.queue.writeBuffer(b.meta, 0, meta.buffer, 0, 4 * (S > 0 ? sb + S * SAMPLE_INTS : 4 + M * ROW_INTS));
    const enc = this.device.createCommandEncoder();
    const cp = enc.beginComputePass();
    const run = (d: Dispatch) => {
      const [x, y] = d.grid(M, S);
      cp.setPipeline(d.pipeline);
      cp.setBindGroup(0, d.group);
      cp.dispatchWorkgroups(x, y);
      this.stats.dispatches++;
    };
    for (const d of plan.rows) run(d);
    let staging: GPUBuffer | null = null;
    const W = 2 + 2 * CAND_K;
    const bytes = logits ? 4 * S * s.V : candidates > 0 ? 4 * S * W : 8 * readSlots;
    if (S > 0) {
      for (const d of plan.head) run(d);
      if (candidates > 0) run(plan.candidates(candidates, T));
      else if (!logits) run(plan.draw(T));
      staging = this.stagingFor(bytes);
    }
    cp.end();
    const from = logits ? 0 : 4 * (candidates > 0 ? scratchLayout(s).CAND : scratchLayout(s).OUT);
    if (staging) enc.copyBufferToBuffer(logits ? b.logits : b.scratch, from, staging, 0, bytes);
    const commands = enc.finish();
    const t1 = performance.now();
    this.device.queue.submit([commands]);
    this.stats.submits++;
    this.stats.passes++;
    this.stats.encodeMs += t1 - t0;
    this.stats.submitMs += performance.now() - t1;
    if (!staging) return null;
    const buf = staging;
    return buf.mapAsync(GPUMapMode.READ, 0, bytes).then(() => {
      const data = new Float32Array(buf.getMappedRange(0, bytes).slice(0));
      buf.unmap();
      if (this.bufs)
        this.staging.push(buf); // free again
      else buf.destroy(); // disposed meanwhile
      this.stats.readbackBytes += bytes;
      return data;
    });
  }

  get vocabSize(): number {
    return this.model.config.vocabSize;
  }

  /** Rows a pass takes at most (as prepared). */
  get rowsCapacity(): number {
    return this.shape!.rowsCap;
  }

  /** Dispatches per layer of a sampling pass's layer stack (bench and tests). */
  get dispatchesPerLayer(): number {
    return (this.plan!.rows.length - this.plan!.embedDispatches) / this.model.config.numHiddenLayers;
  }

  /** Device bytes the decoder owns (KV cache, scratch, params, factors, logits, staging). */
  get bytes(): number {
    const b = this.bufs;
    if (!b) return 0;
    return [b.scratch, b.meta, b.params, b.lora, b.logits, b.uniforms, ...b.kc, ...b.vc, ...this.staging].reduce((n, x) => n + x.size, 0);
  }

  dispose(): void {
    this.release();
    this.plan = null;
    this.shape = null;
  }

  private release(): void {
    const b = this.bufs;
    if (b) for (const x of [b.scratch, b.meta, b.params, b.lora, b.logits, b.uniforms, ...b.kc, ...b.vc]) x.destroy();
    for (const x of this.staging) x.destroy();
    this.staging = [];
    this.bufs = null;
  }

  private allocate(s: DecodeShape, slots: number): void {
    this.release();
    this.plan = null;
    const c = this.model.config;
    const L = c.numHiddenLayers;
    const make = (floats: number, usage = STORAGE()) => {
      this.stats.buffersCreated++;
      return this.device.createBuffer({ size: Math.max(16, Math.ceil((4 * floats) / 16) * 16), usage });
    };
    const kv = slots * s.ctx * s.nKv * s.hd;
    const p = paramsLayout(s);
    this.bufs = {
      scratch: make(scratchLayout(s).size),
      meta: make(4 + s.rowsCap * ROW_INTS + s.samplesCap * SAMPLE_INTS),
      params: make(p.final(L) + s.H),
      lora: make(Math.max(1, L * s.loraLayer)),
      logits: make(s.samplesCap * s.V),
      uniforms: make(64 * L, GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST), // one 256-byte slot a layer
      kc: Array.from({ length: L }, () => make(kv)),
      vc: Array.from({ length: L }, () => make(kv)),
    };
    this.metaHost = new Int32Array(4 + s.rowsCap * ROW_INTS + s.samplesCap * SAMPLE_INTS);
    // RoPE tables for every position (float64 trigonometry, as the tfjs forward's), and each layer's index
    const { cos, sin } = ropeTables(
      Array.from({ length: s.ctx }, (_, i) => i),
      ropeInvFreq(c.ropeTheta, c.headDim),
    );
    this.device.queue.writeBuffer(this.bufs.params, 4 * p.COS, cos);
    this.device.queue.writeBuffer(this.bufs.params, 4 * p.SIN, sin);
    const layers = new Int32Array(64 * L);
    for (let l = 0; l < L; l++) layers[64 * l] = l;
    this.device.queue.writeBuffer(this.bufs.uniforms, 0, layers);
  }

  /** A free read-back buffer of at least `bytes` (made when none is: a warm decoder makes none). */
  private stagingFor(bytes: number): GPUBuffer {
    const i = this.staging.findIndex((x) => x.size >= bytes);
    if (i >= 0) return this.staging.splice(i, 1)[0];
    this.stats.buffersCreated++;
    return this.device.createBuffer({ size: Math.ceil(bytes / 16) * 16, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  }

  /** A tensor's GPU buffer as tfjs holds it (uploaded first if it is still on the host). */
  private buffer(t: tf.Tensor): GPUBuffer {
    this.backend.uploadToGPU(t.dataId);
    return this.backend.tensorMap.get(t.dataId).resource as GPUBuffer;
  }

  /** Submit what tfjs has recorded and not submitted: the decoder's work reads what it wrote. */
  private flushTfjs(): void {
    const b = this.backend as Backend & { commandEncoder: GPUCommandEncoder | null };
    if (b.commandEncoder) {
      b.endComputePassEncoder();
      b.submitQueue();
    }
  }

  /** The base's buffers as bound (their identity decides whether bind groups are made again). */
  private weightBuffers(): GPUBuffer[] {
    const w = this.model.weights;
    const out: GPUBuffer[] = [];
    const add = (bw: BaseWeight) => {
      const l = bw.layout;
      if (l.kind === "f32") out.push(this.buffer(l.w));
      else if (l.kind === "blocks") out.push(...l.parts.map((p) => this.buffer(p)));
      else if (l.kind === "int8" || l.kind === "nf4") out.push(this.buffer(l.packed), this.buffer(l.scales));
    };
    add(w.embedT);
    if (w.lmHeadT) add(w.lmHeadT);
    for (const lw of w.layers) for (const f of FUSED_MODULES) add(lw.proj[f]);
    this.flushTfjs();
    return out;
  }

  /** The logits of the last pass's sampling rows `ks` (their index among its samples), [ks × V]. */
  readLogits(ks: number[]): Promise<Float32Array> {
    const V = this.shape!.V,
      bytes = 4 * V * ks.length;
    const staging = this.stagingFor(bytes);
    const enc = this.device.createCommandEncoder();
    ks.forEach((k, i) => enc.copyBufferToBuffer(this.bufs!.logits, 4 * V * k, staging, 4 * V * i, 4 * V));
    this.device.queue.submit([enc.finish()]);
    this.stats.submits++;
    return staging.mapAsync(GPUMapMode.READ, 0, bytes).then(() => {
      const data = new Float32Array(staging.getMappedRange(0, bytes).slice(0));
      staging.unmap();
      if (this.bufs) this.staging.push(staging);
      else staging.destroy();
      this.stats.readbackBytes += bytes;
      return data;
    });
  }
}
