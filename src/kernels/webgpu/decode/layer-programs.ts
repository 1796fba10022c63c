/** The compiled decoder's layer programs (decoder.ts runs them; the head's draws are vocab-programs.ts): a Qwen2 layer as at most 9
 *  dispatches over buffers the decoder owns, reading the trainer's own weight buffers.
 *  - embed: rows' token embeddings from Eᵀ [H, V] (one dispatch per column block of a split head);
 *  - prep: a row's RMSNorm (written as xn) and its LoRA factors' first products t = s·x·A for every
 *    member of the module it feeds (one workgroup per row);
 *  - mm: a skinny product x·W with W [in, out] as the trainer holds it (f32, or int8/NF4 codes in
 *    quant.ts' slab layout dequantized as they are read), TM rows a workgroup so a weight read serves
 *    them all, and the module's epilogue: bias, LoRA's t·B, RoPE and the KV append (q/k/v),
 *    the residual add in place (o, down), SwiGLU (gate/up), or logits for the rows that sample (head);
 *  - attn: one workgroup per (row, head) over the row's cached keys (grouped-query), softmax online
 *    over chunks of positions; a row whose prompt it shares with another reads those positions from
 *    that row's slot (the group's prefix is prefilled once);
 *  A pass's rows are (token, slot, position) entries in `meta`: a decode step's live rows, a chunk of
 *  prompt tokens, or a mix; a row attends to its slot's positions up to its own, so tokens of one
 *  slot in one pass are causal by construction. Sizes are compiled into the shaders (a model has one
 *  shape; capacity changes recompile). Leaves out: f16 math, subgroups, paged KV. */
import { NF4_BLOCK, NF4_CODE } from "../../../model/quant.ts";
import { f32, rowPrelude } from "../program.ts";
import {
  ATTN_CHUNK,
  ATTN_WG,
  kernel,
  MM_COLS,
  MM_SLICES,
  MM_WG,
  paramsLayout,
  ROW_INTS,
  ROWS,
  SAMPLE_INTS,
  sampleBase,
  scratchLayout,
  TM,
  tWidth,
  type BindingKind,
  type DecodeShape,
  type Kernel,
  type MmKind,
  type PrepKind,
  type WeightFormat,
} from "./layout.ts";

/** Token embeddings of the pass's rows whose ids fall in [off, off + n) of Eᵀ's columns. */
export function embedKernel(s: DecodeShape, off: number, n: number): Kernel {
  const { X, OUT } = scratchLayout(s);
  return kernel(
    `embed_${off}_${n}`,
    64,
    [
      ["s", "storage"],
      ["rin", "read-only-storage"],
      ["w", "read-only-storage"],
    ],
    `fn main(index: i32) {
  let i = i32(workgroupId.y * numWorkgroups.x + workgroupId.x) * 64 + i32(localIndex);
  let m = i / ${s.H};
  let h = i - m * ${s.H};
  if (m >= rin[0]) { return; }
  var id = rin[${ROWS} + m * ${ROW_INTS}];
  // −1: the token the last draw of the row's slot wrote (fed on the device, not read back first)
  if (id < 0) { id = max(i32(s[${OUT} + rin[${ROWS} + m * ${ROW_INTS} + 1] * 2]), 0); }
  let tok = id - ${off};
  if (tok >= 0 && tok < ${n}) { s[${X} + i] = w[h * ${n} + tok]; }
}`,
  );
}

/** The input of each module's product (region, width) and the norm (params offset) a prep applies. */
function prepSpec(s: DecodeShape, kind: PrepKind, L: number) {
  const r = scratchLayout(s),
    p = paramsLayout(s);
  const spec: Record<PrepKind, { src: number; width: number; norm: string | null }> = {
    qkv: { src: r.X, width: s.H, norm: `${p.LAYERS} + layer() * ${p.perLayer} + ${p.inNorm}` },
    o: { src: r.Q, width: s.nH * s.hd, norm: null },
    gateup: { src: r.X, width: s.H, norm: `${p.LAYERS} + layer() * ${p.perLayer} + ${p.postNorm}` },
    down: { src: r.HB, width: s.I, norm: null },
    final: { src: r.X, width: s.H, norm: `${p.final(L)}` },
  };
  return spec[kind];
}

/** A row's norm (xn = x/rms(x)·w) and its LoRA t = scaling·v·A for each member (v: xn, or the
 *  module's input). One workgroup per row. */
export function prepKernel(s: DecodeShape, kind: PrepKind, L: number): Kernel {
  const { XN, T } = scratchLayout(s);
  const { src, width, norm } = prepSpec(s, kind, L);
  const members = kind === "final" ? [] : s.lora[kind];
  const wg = 256,
    SL = wg / 32; // a rank's 32 outputs a round, each over SL slices of the input added in workgroup memory
  const value = (i: string) =>
    norm ? `s[${src} + m * ${width} + ${i}] * inv * params[${norm} + ${i}]` : `s[${src} + m * ${width} + ${i}]`;
  let t = "";
  members.forEach((mb, c) => {
    if (!mb) return;
    t += `
  for (var g0 = 0; g0 < ${s.rank}; g0 += 32) {
    let k = g0 + lane;
    var acc = 0.0;
    if (k < ${s.rank}) {
      for (var i = slc; i < ${width}; i += ${SL}) { acc += ${value("i")} * lora[lb + ${mb.a} + i * ${s.rank} + k]; }
    }
    lred[slc * 32 + lane] = acc;
    workgroupBarrier();
    if (slc == 0 && k < ${s.rank}) {
      var sum = 0.0;
      for (var q = 0; q < ${SL}; q++) { sum += lred[q * 32 + lane]; }
      s[${T} + m * ${tWidth(s)} + ${c * s.rank} + k] = sum * ${f32(s.scaling)};
    }
    workgroupBarrier();
  }`;
  });
  const bindings: [string, BindingKind][] = [
    ["s", "storage"],
    ["params", "read-only-storage"],
    ["lora", "read-only-storage"],
    ["u", "uniform"],
  ];
  return kernel(
    `prep_${kind}`,
    wg,
    bindings,
    `${rowPrelude(wg, 1 << 30)}
var<workgroup> lred: array<f32, ${wg}>;
fn layer() -> i32 { return u.layer; }
fn main(index: i32) {
  let m = row();
  let lane = i32(localIndex) % 32;
  let slc = i32(localIndex) / 32;
  let lb = layer() * ${s.loraLayer};
  var inv = 1.0;
  ${
    norm
      ? `var ss = 0.0;
  for (var j = i32(localIndex); j < ${width}; j += ${wg}) { let v = s[${src} + m * ${width} + j]; ss += v * v; }
  ss = reduceSum(ss);
  inv = 1.0 / sqrt(ss / ${f32(width)} + ${f32(s.eps)});
  for (var j = i32(localIndex); j < ${width}; j += ${wg}) { s[${XN} + m * ${width} + j] = ${value("j")}; }`
      : ""
  }
  ${t}
}`,
  );
}

/** The product's weight reads for one packed row i of column j into accumulator acc (per format). */
function weightLoop(fmt: WeightFormat, N: number, PR: number, acc: string, j: string, kc: number): string {
  const per = fmt === "f32" ? 1 : fmt === "int8" ? 4 : 8;
  const xs = (k: number) => `xs[(r * ${per} + ${k}) * ${kc} + ii]`;
  if (fmt === "f32")
    return `{ let wv = w[i * ${N} + ${j}];
      for (var r = 0; r < ${TM}; r++) { ${acc}[r] += ${xs(0)} * wv; } }`;
  const bits = 32 / per,
    field = (1 << bits) - 1;
  let out = `{ let word = w[i * ${N} + ${j}];`;
  for (let k = 0; k < per; k++) {
    const code = `((word >> ${bits * k}u) & ${field}u)`;
    const val = fmt === "int8" ? `(f32(${code}) - 128.0)` : `NF4[${code}] * sc[((${k * PR} + i) / ${NF4_BLOCK}) * ${N} + ${j}]`;
    out += `
      { let wv = ${val}; for (var r = 0; r < ${TM}; r++) { ${acc}[r] += ${xs(k)} * wv; } }`;
  }
  return out + " }";
}

/** x·W over the pass's rows (head: the sampling rows) with the module's epilogue (see the header).
 *  W [inDim, N] as the trainer holds it; PR: its packed rows (inDim for f32); headOff: the column
 *  block's first id (head). */
export function mmKernel(s: DecodeShape, kind: MmKind, fmt: WeightFormat, inDim: number, N: number, PR: number, headOff = 0): Kernel {
  const r = scratchLayout(s),
    p = paramsLayout(s);
  const q = s.nH * s.hd,
    kv = s.nKv * s.hd,
    half = s.hd / 2;
  const per = fmt === "f32" ? 1 : fmt === "int8" ? 4 : 8;
  const KC = 256 / per;
  const src = { qkv: r.XN, o: r.Q, gateup: r.XN, down: r.HB, head: r.XN }[kind];
  const pair = kind === "qkv" || kind === "gateup";
  const units = kind === "qkv" ? (s.nH + 2 * s.nKv) * half : kind === "gateup" ? s.I : N;
  const rows = kind === "head" ? "rin[1]" : "rin[0]";
  // the pass row whose input a product row reads: the sampling row's pass row for the head
  const srcRow = kind === "head" ? `rin[${sampleBase(s)} + (rr) * ${SAMPLE_INTS}]` : "(rr)";
  const members = kind === "head" ? [] : s.lora[kind];
  const loraTerm = (c: number, col: string, width: number) => {
    const mb = members[c];
    if (!mb) return "0.0";
    return `loraB(m, ${c * s.rank}, ${mb.b}, ${width}, ${col})`;
  };
  let epilogue: string;
  if (kind === "qkv") {
    epilogue = `
      let hh = unit / ${half};
      let d = unit - hh * ${half};
      let pos = rin[rb + 2];
      let slot = rin[rb + 1];
      let bias = ${p.LAYERS} + layer() * ${p.perLayer} + ${p.bias};
      var ya = a0[r] + params[bias + ja];
      var yb = a1[r] + params[bias + jb];
      if (hh < ${s.nH}) { ya += ${loraTerm(0, "ja", q)}; yb += ${loraTerm(0, "jb", q)}; }
      else if (hh < ${s.nH + s.nKv}) { ya += ${loraTerm(1, `ja - ${q}`, kv)}; yb += ${loraTerm(1, `jb - ${q}`, kv)}; }
      else { ya += ${loraTerm(2, `ja - ${q + kv}`, kv)}; yb += ${loraTerm(2, `jb - ${q + kv}`, kv)}; }
      if (hh < ${s.nH + s.nKv}) {
        let t = ${p.COS} + pos * ${s.hd};
        let u2 = ${p.SIN} + pos * ${s.hd};
        let ra = ya * params[t + d] + yb * params[u2 + d];
        let rb2 = yb * params[t + ${half} + d] + ya * params[u2 + ${half} + d];
        ya = ra;
        yb = rb2;
      }
      if (hh < ${s.nH}) {
        s[${r.Q} + m * ${q} + ja] = ya;
        s[${r.Q} + m * ${q} + jb] = yb;
      } else {
        let kh = (hh - ${s.nH}) % ${s.nKv};
        let at = ((slot * ${s.ctx} + pos) * ${s.nKv} + kh) * ${s.hd} + d;
        if (hh < ${s.nH + s.nKv}) { kc[at] = ya; kc[at + ${half}] = yb; } else { vc[at] = ya; vc[at + ${half}] = yb; }
      }`;
  } else if (kind === "gateup") {
    epilogue = `
      let g = a0[r] + ${loraTerm(0, "ja", s.I)};
      let up = a1[r] + ${loraTerm(1, "ja", s.I)};
      s[${r.HB} + m * ${s.I} + ja] = g / (1.0 + exp(-g)) * up;`;
  } else if (kind === "head") {
    epilogue = `
      logits[rr * ${s.V} + ${headOff} + ja] = a0[r];`;
  } else {
    epilogue = `
      s[${r.X} + m * ${s.H} + ja] += a0[r] + ${loraTerm(0, "ja", s.H)};`;
  }
  const columns =
    kind === "qkv"
      ? `let ja = (unit / ${half}) * ${s.hd} + unit % ${half};
  let jb = ja + ${half};`
      : kind === "gateup"
        ? `let ja = unit;
  let jb = unit + ${s.I};`
        : `let ja = unit;
  let jb = unit;`;
  const bindings: [string, BindingKind][] = [
    ["s", "storage"],
    ["rin", "read-only-storage"],
    ["w", "read-only-storage"],
  ];
  if (fmt === "nf4" || fmt === "int8") bindings.push(["sc", "read-only-storage"]);
  if (kind !== "head") bindings.push(["params", "read-only-storage"], ["lora", "read-only-storage"], ["u", "uniform"]);
  if (kind === "qkv") bindings.push(["kc", "storage"], ["vc", "storage"]);
  if (kind === "head") bindings.push(["logits", "storage"]);
  const body = `
const NF4 = array<f32, 16>(${Array.from(NF4_CODE, f32).join(", ")});
var<workgroup> xs: array<f32, ${TM * 256}>;
${kind !== "head" ? "fn layer() -> i32 { return u.layer; }" : ""}
fn loraB(m: i32, toff: i32, boff: i32, width: i32, col: i32) -> f32 {
  ${
    kind === "head" || s.rank === 0
      ? "return 0.0;"
      : `let lb = layer() * ${s.loraLayer} + boff;
  var acc = 0.0;
  for (var k = 0; k < ${s.rank}; k++) { acc += s[${r.T} + m * ${tWidth(s)} + toff + k] * lora[lb + k * width + col]; }
  return acc;`
  }
}
fn main(index: i32) {
  let lane = i32(localIndex) % ${MM_COLS};
  let slice = i32(localIndex) / ${MM_COLS};
  let unit0 = i32(workgroupId.x) * ${MM_COLS} + lane;
  let r0 = i32(workgroupId.y) * ${TM};
  let nrows = ${rows};
  let unit = min(unit0, ${units - 1});
  ${columns}
  var a0: array<f32, ${TM}>;
  var a1: array<f32, ${TM}>;
  for (var c0 = 0; c0 < ${PR}; c0 += ${KC}) {
    for (var e = i32(localIndex); e < ${TM * 256}; e += ${MM_WG}) {
      let r = e / 256;
      let rem = e - r * 256;
      let k = rem / ${KC};
      let ii = rem - k * ${KC};
      let row = k * ${PR} + c0 + ii;
      var v = 0.0;
      let rr = r0 + r;
      if (rr < nrows && c0 + ii < ${PR} && row < ${inDim}) { v = s[${src} + ${srcRow} * ${inDim} + row]; }
      xs[e] = v;
    }
    workgroupBarrier();
    let cn = min(${KC}, ${PR} - c0);
    for (var ii = slice; ii < cn; ii += ${MM_SLICES}) {
      let i = c0 + ii;
      ${weightLoop(fmt, N, PR, "a0", "ja", KC)}
      ${pair ? weightLoop(fmt, N, PR, "a1", "jb", KC) : ""}
    }
    workgroupBarrier();
  }
  // the slices' partial sums added (xs reused), into slice 0's accumulators
  ${["a0", ...(pair ? ["a1"] : [])]
    .map(
      (a) => `for (var r = 0; r < ${TM}; r++) { xs[(r * ${MM_SLICES} + slice) * ${MM_COLS} + lane] = ${a}[r]; }
  workgroupBarrier();
  if (slice == 0) {
    for (var r = 0; r < ${TM}; r++) {
      var t = 0.0;
      for (var q = 0; q < ${MM_SLICES}; q++) { t += xs[(r * ${MM_SLICES} + q) * ${MM_COLS} + lane]; }
      ${a}[r] = t;
    }
  }
  workgroupBarrier();`,
    )
    .join("\n  ")}
  if (slice != 0 || unit0 >= ${units}) { return; }
  for (var r = 0; r < ${TM}; r++) {
    let rr = r0 + r;
    if (rr < nrows) {
      ${fmt === "int8" ? `a0[r] *= sc[ja];${pair ? " a1[r] *= sc[jb];" : ""}` : ""}
      let m = ${srcRow};
      let rb = ${ROWS} + m * ${ROW_INTS};
      ${epilogue}
    }
  }
}`;
  return kernel(`mm_${kind}_${fmt}_${inDim}_${N}_${headOff}`, MM_WG, bindings, body, { w: fmt === "f32" ? "f32" : "u32" });
}

/** Attention of one (row, head) over its slot's positions up to its own (and its prefix slot's below
 *  the prefix length), written over the row's q. */
export function attnKernel(s: DecodeShape): Kernel {
  const { Q } = scratchLayout(s);
  const q = s.nH * s.hd,
    g = s.nH / s.nKv,
    E = Math.ceil(s.hd / ATTN_WG);
  const wg = ATTN_WG;
  return kernel(
    "attn",
    wg,
    [
      ["s", "storage"],
      ["rin", "read-only-storage"],
      ["kc", "read-only-storage"],
      ["vc", "read-only-storage"],
    ],
    `${rowPrelude(wg, 1 << 30)}
var<workgroup> qs: array<f32, ${s.hd}>;
var<workgroup> sc: array<f32, ${ATTN_CHUNK}>;
var<workgroup> keys: i32;
fn kvAt(slot: i32, src: i32, srcLen: i32, j: i32, kh: i32) -> i32 {
  let sl = select(slot, src, j < srcLen);
  return ((sl * ${s.ctx} + j) * ${s.nKv} + kh) * ${s.hd};
}
fn main(index: i32) {
  let wi = row();
  let m = wi / ${s.nH};
  let h = wi - m * ${s.nH};
  let kh = h / ${g};
  let rb = ${ROWS} + m * ${ROW_INTS};
  let slot = rin[rb + 1];
  // the keys the workgroup walks, as a uniform value (its loop holds barriers)
  if (localIndex == 0u) { keys = rin[rb + 2] + 1; }
  let n = workgroupUniformLoad(&keys);
  let src = rin[rb + 3];
  let srcLen = rin[rb + 4];
  let qo = ${Q} + m * ${q} + h * ${s.hd};
  for (var d = i32(localIndex); d < ${s.hd}; d += ${wg}) { qs[d] = s[qo + d]; }
  workgroupBarrier();
  var runMax = -3.4028234663852886e38;
  var runSum = 0.0;
  var acc: array<f32, ${E}>;
  for (var c0 = 0; c0 < n; c0 += ${ATTN_CHUNK}) {
    let cn = min(${ATTN_CHUNK}, n - c0);
    var lmax = -3.4028234663852886e38;
    for (var j = i32(localIndex); j < cn; j += ${wg}) {
      let ko = kvAt(slot, src, srcLen, c0 + j, kh);
      var dot = 0.0;
      for (var d = 0; d < ${s.hd}; d++) { dot += qs[d] * kc[ko + d]; }
      let v = dot * ${f32(1 / Math.sqrt(s.hd))};
      sc[j] = v;
      lmax = max(lmax, v);
    }
    let cmax = reduceMax(lmax);
    let newMax = max(runMax, cmax);
    let corr = exp(runMax - newMax);
    var lsum = 0.0;
    for (var j = i32(localIndex); j < cn; j += ${wg}) { let p = exp(sc[j] - newMax); sc[j] = p; lsum += p; }
    let csum = reduceSum(lsum);
    runSum = runSum * corr + csum;
    for (var e = 0; e < ${E}; e++) {
      let d = i32(localIndex) + e * ${wg};
      if (d < ${s.hd}) {
        var a = acc[e] * corr;
        for (var j = 0; j < cn; j++) { a += sc[j] * vc[kvAt(slot, src, srcLen, c0 + j, kh) + d]; }
        acc[e] = a;
      }
    }
    runMax = newMax;
    workgroupBarrier();
  }
  for (var e = 0; e < ${E}; e++) {
    let d = i32(localIndex) + e * ${wg};
    if (d < ${s.hd}) { s[qo + d] = acc[e] / runSum; }
  }
}`,
  );
}
