/** What the compiled decoder's programs share: the shape and capacities they are compiled for, the
 *  layout of the decoder's buffers (the scratch's regions, the params, the rows in `meta`), and the
 *  scaffolding of a standalone WGSL module (its bindings, and the builtins named as tfjs' programs
 *  name them, so program.ts' row preludes serve). The programs are layer-programs.ts and
 *  vocab-programs.ts; decoder.ts runs them. */
/** Ints per row in meta, after a 4-int header [M, S, 0, 0]: token, slot, position, prefix slot,
 *  prefix length (positions below it are read from the prefix slot). */
export const ROW_INTS = 5;
/** Ints per sampling row: its pass row (whose output it draws from), the slot whose draw it is (a
 *  group's rows draw from their prompt's one row), and its uniform as two float32 bit patterns. */
export const SAMPLE_INTS = 4;
/** Candidates a top-k/top-p row reads back at most: [below, tied, values, ids] is 520 bytes. */
export const CAND_K = 64;
/** Rows a matmul workgroup computes together (each weight read serves them). */
export const TM = 8;
/** A product's workgroup: MM_COLS adjacent output columns (adjacent threads, adjacent weights) ×
 *  MM_SLICES slices of the input dimension, whose partial sums are added in workgroup memory: a
 *  decode step's narrow products (q/k/v: 1,152 columns for 0.5B) still fill a GPU. */
export const MM_COLS = 32;
export const MM_SLICES = 8;
export const MM_WG = MM_COLS * MM_SLICES;
/** Attention's workgroup, and the positions it scores at a time (workgroup memory). */
export const ATTN_WG = 64;
export const ATTN_CHUNK = 256;

export type WeightFormat = "f32" | "int8" | "nf4";
export type MmKind = "qkv" | "o" | "gateup" | "down" | "head";
export type PrepKind = "qkv" | "o" | "gateup" | "down" | "final";

/** What the shaders are compiled for: the model's shape, the decoder's capacities, the layout of its
 *  buffers (float offsets) and the adapter's members. */
export interface DecodeShape {
  H: number;
  I: number;
  nH: number;
  nKv: number;
  hd: number;
  V: number;
  eps: number;
  /** Rows per pass, sampling rows per pass, positions per slot. */
  rowsCap: number;
  samplesCap: number;
  ctx: number;
  /** LoRA: rank (0: none), scaling, and per fused module the offsets (floats, within a layer's block
   *  of the lora buffer) of each member's A [in, r] and B [r, out], null for a member without one. */
  rank: number;
  scaling: number;
  lora: Record<MmKind, ({ a: number; b: number } | null)[]>;
  loraLayer: number; // floats of one layer's block
}

/** Scratch regions (floats): the residual x, the normed xn, q (then the attention output), the LoRA
 *  t, the MLP activation h, per slot the [token, log-prob] its last draw wrote, and per sampling row
 *  its top-k/top-p candidates. */
export function scratchLayout(s: DecodeShape) {
  const q = s.nH * s.hd;
  const X = 0,
    XN = X + s.rowsCap * s.H,
    Q = XN + s.rowsCap * s.H,
    T = Q + s.rowsCap * q,
    HB = T + s.rowsCap * tWidth(s),
    OUT = HB + s.rowsCap * s.I,
    CAND = OUT + 2 * s.samplesCap,
    size = CAND + s.samplesCap * (2 + 2 * CAND_K);
  return { X, XN, Q, T, HB, OUT, CAND, size };
}
/** LoRA t columns per row: the widest module's members × r (q/k/v: 3). */
export const tWidth = (s: DecodeShape) => 3 * Math.max(1, s.rank);

/** Params (floats): RoPE's cos and signed-sin tables [ctx, hd] (attention.ts ropeTables), each
 *  layer's input norm, post norm and q/k/v bias, then the final norm. */
export function paramsLayout(s: DecodeShape) {
  const kv = s.nKv * s.hd,
    q = s.nH * s.hd;
  const COS = 0,
    SIN = s.ctx * s.hd,
    LAYERS = 2 * s.ctx * s.hd,
    perLayer = 2 * s.H + q + 2 * kv;
  return { COS, SIN, LAYERS, perLayer, inNorm: 0, postNorm: s.H, bias: 2 * s.H, final: (L: number) => LAYERS + L * perLayer };
}

export type BindingKind = "storage" | "read-only-storage" | "uniform";
export interface Kernel {
  key: string;
  code: string;
  /** Binding names in binding order, with their kinds. */
  bindings: [string, BindingKind][];
  wg: number;
}

const decl = (bindings: [string, BindingKind][], types: Record<string, string>) =>
  bindings
    .map(([n, k], i) =>
      k === "uniform"
        ? `@group(0) @binding(${i}) var<uniform> ${n}: Layer;`
        : `@group(0) @binding(${i}) var<storage, ${k === "storage" ? "read_write" : "read"}> ${n}: array<${types[n] ?? "f32"}>;`,
    )
    .join("\n");

/** The module's bindings, builtins as tfjs' programs name them (so program.ts' preludes serve), and
 *  the entry point calling the body's main. */
export function kernel(
  key: string,
  wg: number,
  bindings: [string, BindingKind][],
  body: string,
  types: Record<string, string> = {},
): Kernel {
  const code = `
struct Layer { layer: i32, pad0: i32, pad1: i32, pad2: i32 }
${decl(bindings, { rin: "i32", ...types })}
var<private> localIndex: u32;
var<private> workgroupId: vec3<u32>;
var<private> numWorkgroups: vec3<u32>;
${body}
@compute @workgroup_size(${wg})
fn entry(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) w: vec3<u32>,
         @builtin(num_workgroups) n: vec3<u32>) {
  localIndex = li;
  workgroupId = w;
  numWorkgroups = n;
  main(0);
}`;
  return { key, code, bindings, wg };
}

export const ROWS = 4; // meta's header
export const sampleBase = (s: DecodeShape) => ROWS + s.rowsCap * ROW_INTS;
