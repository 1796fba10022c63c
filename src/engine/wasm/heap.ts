/** The heap module (heap-code.ts) on tfjs-backend-wasm's own heap: one instance per heap, helper
 *  threads (threaded build) that share it through a control block, and the jobs they split: a
 *  product's columns, rows or batch slices (`heapGemm`, used by gemm.ts), the rows of a row kernel
 *  (`heapSwiglu`, `heapRmsNorm`, `heapRowStats`, `heapBinary`, …, used by the op files) or of strided copies
 *  (`heapBlocks`: Concat, Slice, SplitV), or the packed rows of a quantized matrix (`heapDequantize`,
 *  used by dequant.ts). Work is split only where it repays a
 *  hand-off, and every output is computed the same way whatever the split, so results do not
 *  depend on the thread count. Leaves out: tfjs' own thread pool (kept at one thread, wasm/threads.ts).
 *  Over 400 lines on purpose: the helper threads' source is built from part(), slicesPart() and
 *  rowsPart() in this file (Function.toString), so the job protocol and the jobs it runs must live together. */
import * as tf from "@tensorflow/tfjs";
import v8 from "node:v8";
import { Worker } from "node:worker_threads";
import { MAX_WASM_THREADS, wasmThreads } from "./threads.ts";
import { gemmModuleBytes } from "./heap-code.ts";
import type { Backend } from "../kernels.ts";

/** Rows per register block of the plain SIMD build: 4 rows × 8 columns = 8 accumulators, within x64's
 *  16 vector registers with the two halves of B's row and the broadcast A value (5 rows spill: half
 *  the speed). The relaxed build's fused multiply-add needs no register for the product: see MR_RELAXED. */
const MR = 4;
const NR = 8;
/** Rows per register block of the relaxed-SIMD build: 6 × 8 = 12 accumulators + b0, b1, a where V8
 *  keeps 15 vector registers usable (Node 24: xmm15 is its scratch); Node 20's and 22's V8 spill at 6
 *  rows, so 4 there. One thread, GFLOP/s, 512×1024×1024 / 256×896×4864, 2-core machine shared and
 *  loaded, back to back: Node 24 6 rows 37.5 / 35.4, 4 rows 21.2 / 28.7; Node 20 6 rows 15.7 / 22.1,
 *  4 rows 34.4 / 33.5. 1024³ / 2048×896×4864, medians of 5, two alternating rounds: Node 24 6 rows
 *  43.0 / 42.9 and 30.4 / 39.5, 4 rows 24.7 / 37.3 and 36.8 / 30.6; Node 22 6 rows 26.4 / 24.8 and
 *  22.2 / 25.7, 4 rows 34.4 / 34.2 and 37.4 / 35.2. */
const MR_RELAXED = Number(process.versions.node.split(".")[0]) >= 24 ? 6 : 4;

/** Which build of the heap module runs: "relaxed" (the product's multiply-adds as f32x4.relaxed_madd)
 *  or "simd128" (multiply, then add). */
export type WasmSimd = "relaxed" | "simd128";
/** Picks the build: MINI_AGENTIC_RL_WASM_SIMD=simd128 or =relaxed asks for one (tests, A/B runs). */
export const WASM_SIMD_ENV = "MINI_AGENTIC_RL_WASM_SIMD";

/** A function of no parameters returning f32x4.relaxed_madd(0, 0, 0): validates where the runtime has relaxed SIMD. */
const RELAXED_PROBE = (() => {
  const zero = [0xfd, 0x0c, ...new Array(16).fill(0)];
  const body = [0, ...zero, ...zero, ...zero, 0xfd, 0x85, 0x02, 0x0b];
  return Uint8Array.from([
    0,
    0x61,
    0x73,
    0x6d,
    1,
    0,
    0,
    0,
    1,
    5,
    1,
    0x60,
    0,
    1,
    0x7b,
    3,
    2,
    1,
    0,
    10,
    body.length + 2,
    1,
    body.length,
    ...body,
  ]);
})();

let relaxedOk: boolean | null = null;
/** Whether this runtime validates relaxed SIMD. On Node < 22 (V8 keeps it behind a flag there) the flag
 *  is set first, from inside the process: V8 flags are process-wide, so helper threads see it too.
 *  Node ≥ 22 ships it on (Node 24 no longer knows the flag). */
export function relaxedSimdAvailable(): boolean {
  if (relaxedOk === null) {
    if (Number(process.versions.node.split(".")[0]) < 22) {
      try {
        v8.setFlagsFromString("--experimental-wasm-relaxed-simd");
      } catch {
        // no flag: validate says no
      }
    }
    relaxedOk = WA.validate(RELAXED_PROBE);
  }
  return relaxedOk;
}

let simdChoice: WasmSimd | null = null;
/** The build this process runs: the one asked for by MINI_AGENTIC_RL_WASM_SIMD, else relaxed where
 *  the runtime validates it, else simd128. Asking for relaxed where it does not validate is an error. */
export function wasmSimd(): WasmSimd {
  if (!simdChoice) {
    const asked = process.env[WASM_SIMD_ENV] || undefined; // set but empty: as unset
    if (asked && asked !== "relaxed" && asked !== "simd128") throw new Error(`${WASM_SIMD_ENV}=${asked}: expected relaxed or simd128`);
    if (asked === "relaxed" && !relaxedSimdAvailable()) throw new Error(`${WASM_SIMD_ENV}=relaxed: this runtime has no relaxed SIMD`);
    simdChoice = (asked as WasmSimd | undefined) ?? (relaxedSimdAvailable() ? "relaxed" : "simd128");
  }
  return simdChoice;
}

/** For the kernels' tests and A/B benchmarks: run this build from the next kernel on (the heap
 *  module is rebuilt; an earlier instance's helper threads are left waiting, unreferenced). */
export function setWasmSimd(s: WasmSimd): void {
  if (s === "relaxed" && !relaxedSimdAvailable()) throw new Error("relaxed SIMD: this runtime has none");
  simdChoice = s;
  instance = null;
}

export interface Kernels {
  tile: (
    a: number,
    b: number,
    c: number,
    M: number,
    N: number,
    K: number,
    ars: number,
    aks: number,
    ldb: number,
    ldc: number,
    ps: number,
    acc: number,
  ) => void;
  tile1: Kernels["tile"];
  tile2: Kernels["tile"];
  tile3: Kernels["tile"];
  tile4: Kernels["tile"];
  tile5: Kernels["tile"];
  tileT: Kernels["tile"];
  tile1T: Kernels["tile"];
  tile2T: Kernels["tile"];
  tile3T: Kernels["tile"];
  tile4T: Kernels["tile"];
  tile5T: Kernels["tile"];
  wide1: Kernels["tile"];
  wide2: Kernels["tile"];
  pack: (b: number, dst: number, K: number, ldb: number, panels: number) => void;
  packT: Kernels["pack"];
  copyRows: (dst: number, dstStride: number, src: number, srcStride: number, rowBytes: number, rows: number) => void;
  swiglu: (gu: number, y: number, rows: number, I: number) => void;
  swigluGrad: (gu: number, dy: number, dgu: number, rows: number, I: number) => void;
  rowStats: (x: number, out: number, rows: number, V: number) => void;
  softmaxRows: (x: number, coef: number, out: number, rows: number, V: number) => void;
  softmaxGrad: (y: number, dy: number, dx: number, rows: number, S: number) => void;
  rmsNorm: (x: number, w: number, y: number, rows: number, H: number, eps: number) => void;
  rmsNormGrad: (x: number, w: number, dy: number, dx: number, dw: number, rows: number, H: number, eps: number) => void;
  binary: (a: number, b: number, out: number, r0: number, r1: number, W: number, rep: number, bs: number, op: number) => void;
  seqHeads: (...args: number[]) => void; // six pointers, n0, n1, T, nH, nKv, hd, scale (heap-code.ts)
  seqHeadsGrad: Kernels["seqHeads"];
  dequantInt8: (...args: number[]) => void; // packed, scales, out, i0, i1, P, n, inDim, block, tab (heap-code.ts)
  dequantNf4: Kernels["dequantInt8"];
  /** The imported heap, exported again (the helpers read job tables from it). */
  memory: WasmMemory;
}

// Node's WebAssembly, typed here (the project compiles without the DOM library).
interface WasmMemory {
  buffer: ArrayBuffer | SharedArrayBuffer;
}
const WA = (
  globalThis as unknown as {
    WebAssembly: {
      Memory: new (d: object) => WasmMemory;
      Module: new (b: Uint8Array) => object;
      Instance: new (m: object, i: object) => { exports: unknown };
      validate: (b: Uint8Array) => boolean;
    };
  }
).WebAssembly;

/** The backend's WebAssembly.Memory: the threaded build keeps it as `wasmMemory`, the single-threaded
 *  one as its module's exported `memory`. */
function heapMemory(b: Backend): WasmMemory {
  const m = b.wasm?.wasmMemory ?? b.wasm?.asm?.memory;
  if (!(m instanceof WA.Memory)) throw new Error("wasm matmul: the tfjs wasm module exposes no WebAssembly.Memory");
  return m;
}

/** The kernels on one heap, and the helper threads that share it (threaded build only). */
export interface HeapModule {
  memory: WasmMemory;
  k: Kernels;
  pool: Pool | null;
  /** The build, and its rows per register block. */
  simd: WasmSimd;
  mr: number;
  malloc: (bytes: number) => number;
  free: (ptr: number) => void;
  scratch: number;
  scratchBytes: number;
}
let instance: HeapModule | null = null; // the one built, on the heap it was built for

/** The heap module on the backend's heap, built on first use (and again after a build switch). */
export function heapModule(backend: Backend): HeapModule {
  const memory = heapMemory(backend);
  if (instance && instance.memory === memory) return instance;
  const shared = typeof SharedArrayBuffer === "function" && memory.buffer instanceof SharedArrayBuffer;
  const simd = wasmSimd(),
    mr = simd === "relaxed" ? MR_RELAXED : MR;
  const bytes = gemmModuleBytes({ mr, relaxed: simd === "relaxed", memory: { shared, initial: 1, maximum: 65536 } });
  const k = new WA.Instance(new WA.Module(bytes), { env: { memory } }).exports as Kernels;
  const threads = wasmThreads();
  const pool = shared && threads > 1 ? startPool(memory, bytes, mr, threads - 1) : null;
  instance = {
    memory,
    k,
    pool,
    simd,
    mr,
    malloc: (n) => backend.wasm._malloc(n),
    free: (p) => backend.wasm._free(p),
    scratch: 0,
    scratchBytes: 0,
  };
  return instance;
}

/** The control block shared with the helpers (Int32 slots). */
const SEQ = 0,
  DONE = 1,
  READY = 2,
  NEXT = 3, // per part, the next of its units of a product to take (part(), slicesPart())
  ARGS = NEXT + MAX_WASM_THREADS; // ARGS: a, b, c, M, K, N, parts, scratch, transposes, job, then a batch's slices, A's and B's slice strides
const CTRL_SLOTS = ARGS + 13;
/** Jobs the helpers run: a product's columns or rows, a batch's slices, or rows of an element-wise kernel. */
const JOB_GEMM = 0,
  JOB_SWIGLU = 1,
  JOB_SWIGLU_GRAD = 2,
  JOB_ROW_STATS = 3,
  JOB_SOFTMAX = 4,
  JOB_RMS_NORM = 5,
  JOB_RMS_NORM_GRAD = 6,
  JOB_SOFTMAX_GRAD = 8,
  JOB_BINARY = 9,
  JOB_COPY_BLOCKS = 10,
  JOB_SEQ_HEADS = 11,
  JOB_SEQ_HEADS_GRAD = 12,
  JOB_GEMM_SLICES = 13,
  JOB_DEQUANT = 14,
  JOB_DRAW = 15;
/** Rows per block of RMSNorm's gradient: each block sums its own part of dw, and the blocks are added
 *  in order afterwards, so dw does not depend on how the blocks were shared among threads. */
const NORM_BLOCK = 64;

/** One part of C = op(A) · op(B), in units: whole 8-column panels, or with t & 4 rows (whole blocks
 *  of mr) over all of N's panels. Each part owns an even share of U units, takes them in order, then
 *  takes what is left of the other parts' (claim(q): the next of part q's units), so a thread slowed
 *  by other work on its core does less while an unloaded run keeps each part on its own rows (those
 *  the row kernels' same split left in its cache). U = 4: a unit of columns passes over all of A
 *  once more, a unit of rows packs B again (U = 2 where B is stored transposed: its packing, one
 *  float at a time, costs more).
 *  Runs on every thread, so it is also the helpers' code (stringified below): only plain JS, no imports.
 *  t: bit 0 = A stored transposed ([K, M]), bit 1 = B stored transposed ([N, K]), bit 2 = split by rows,
 *  bit 3 = C stored transposed ([N, M]: the tile*T kernels; no wide blocks).
 *  scratch ≠ 0: B's panels are first packed, up to 512 KB of them at a time, into this part's slice of
 *  the scratch buffer (packBytes(K) each), so the kernel reads each panel as one run of memory (a
 *  transposed B is always packed); scratch = 0: B is read in place. */
function part(
  k: Kernels,
  mr: number,
  a: number,
  b: number,
  c: number,
  M: number,
  K: number,
  N: number,
  index: number,
  parts: number,
  scratch: number,
  t: number,
  claim: (q: number) => number = () => 0,
): void {
  if (index >= parts) return; // a helper beyond the parts: no packing buffer of its own
  const ars = t & 1 ? 4 : 4 * K,
    aks = t & 1 ? 4 * M : 4,
    ldc = 4 * N; // B's row stride in place
  // C's bytes per row and per column, and the stride its kernels take (transposed: [N, M])
  const ct = t & 8,
    rs = ct ? 4 : ldc,
    cs = ct ? 4 * M : 4,
    ldk = ct ? 4 * M : ldc,
    T = ct ? "T" : "";
  const panels = (N - (N % 8)) / 8;
  // K in blocks of ≤ 1024, so a packed panel (32 KB) stays in L1 while the row groups pass over it;
  // rows in blocks of ≤ 256 KB of A, which stay in cache while every column panel passes over them
  // (else a tall A, such as a vocab head held [vocab, hidden], is read from memory once per panel).
  const kc = Math.min(K, 1024);
  const mc = Math.max(mr, Math.floor(65536 / kc) - (Math.floor(65536 / kc) % mr));
  const nc = scratch ? Math.max(8, Math.floor(16384 / kc) * 8) : 8 * panels;
  const buf = scratch + index * nc * kc * 4;
  // A row's sum is the same whichever part and block of rows it falls in, and a panel's whichever unit
  // and thread, so every split gives the same bits.
  const byRows = t & 4,
    shared = parts > 1,
    U = shared ? (byRows && t & 2 ? 2 : 4) : 1,
    per = byRows ? Math.ceil(M / (U * parts) / mr) * mr : Math.ceil(panels / (U * parts));
  for (let tried = 0, q = index; tried < parts; tried++, q = (q + 1) % parts)
    for (let u = shared ? claim(q) : 0; u < U; u = shared ? claim(q) : U) {
      const unit = q * U + u,
        r0 = byRows ? Math.min(M, unit * per) : 0,
        r1 = byRows ? Math.min(M, (unit + 1) * per) : M,
        j0 = byRows ? 0 : Math.min(panels, unit * per) * 8,
        j1 = byRows ? panels * 8 : Math.min(panels, (unit + 1) * per) * 8;
      if (r1 <= r0 || j1 <= j0) continue;
      const ar = a + r0 * ars,
        cr = c + r0 * rs,
        Mb = r1 - r0 - ((r1 - r0) % mr),
        rest = r1 - r0 - Mb;
      for (let jc = j0; jc < j1; jc += nc) {
        const n = Math.min(nc, j1 - jc);
        for (let k0 = 0; k0 < K; k0 += kc) {
          const kn = Math.min(kc, K - k0),
            acc = k0 > 0 ? 1 : 0,
            ak = ar + k0 * aks;
          let pb = b + k0 * ldc + 4 * jc,
            ldb = ldc,
            ps = 32;
          if (scratch) {
            if (t & 2) k.packT(b + 4 * K * jc + 4 * k0, buf, kn, 4 * K, n / 8);
            else k.pack(pb, buf, kn, ldc, n / 8);
            ((pb = buf), (ldb = 32), (ps = 32 * kn));
          }
          for (let i0 = 0; i0 < Mb; i0 += mc)
            k[("tile" + T) as "tile"](ak + i0 * ars, pb, cr + i0 * rs + jc * cs, Math.min(mc, Mb - i0), n, kn, ars, aks, ldb, ldk, ps, acc);
          // the rows left after the blocks of mr: one block of as many rows (tile1 … tile5); one or two
          // rows of B in place take wide blocks first (wide1: 32 columns, wide2: 16), as many as fit
          if (rest) {
            const wide = rest <= 2 && !scratch && !ct ? n - (n % (rest === 1 ? 32 : 16)) : 0;
            const aw = ak + Mb * ars,
              cw = cr + Mb * rs + jc * cs;
            if (wide) k[("wide" + rest) as "wide1"](aw, pb, cw, rest, wide, kn, ars, aks, ldb, ldc, ps, acc);
            if (wide < n)
              k[("tile" + rest + T) as "tile1"](aw, pb + 4 * wide, cw + wide * cs, rest, n - wide, kn, ars, aks, ldb, ldk, ps, acc);
          }
        }
      }
    }
}

/** One part of a batch of `batch` products C[s] = op(A[s]) · op(B[s]): whole slices, an even share
 *  owned by each part and the rest taken as part()'s units are, each slice run as one part (part()
 *  with parts = 1) on this part's packing buffer. A's and B's slices are sa and
 *  sb bytes apart (0: one operand for every slice), C's M·N floats. A batch of attention products
 *  ([heads, T, hd] · [heads, hd, T]) is then one hand-off instead of one per slice, and slices too
 *  small to split on their own run in parallel. Each slice is summed as one part's product is, so the
 *  bits are those of the other splits. Plain JS (helpers' code too). */
function slicesPart(
  k: Kernels,
  mr: number,
  a: number,
  b: number,
  c: number,
  M: number,
  K: number,
  N: number,
  index: number,
  parts: number,
  scratch: number,
  t: number,
  batch: number,
  sa: number,
  sb: number,
  claim: (q: number) => number,
): void {
  if (index >= parts) return;
  const buf = scratch ? scratch + index * packBytes(K) : 0,
    S = Math.ceil(batch / parts);
  for (let tried = 0, q = index; tried < parts; tried++, q = (q + 1) % parts)
    for (let u = claim(q), s = q * S + u; u < S && s < batch; u = claim(q), s = q * S + u)
      part(k, mr, a + s * sa, b + s * sb, c + s * M * N * 4, M, K, N, 0, 1, buf, t);
}

/** Rows [r0, r1) of one part of a row kernel over [rows, I] (a job of the helpers too, so plain JS;
 *  the job numbers are those of JOB_*). SwiGLU: a gu [rows, 2I], b dy [rows, I], c the output;
 *  rowStats: a x [rows, I], c out [rows, 3]; softmaxRows: a x, b coef [rows], c out [rows, I];
 *  softmaxGrad: a y, b dy, c dx, all [rows, I];
 *  RMSNorm: a x, w the weight, c y or dx, b dy, aux dw's blocks [⌈rows / 64⌉, I], eps as float32 bits.
 *  The gradient is shared out by blocks of 64 rows (NORM_BLOCK), the others by rows.
 *  binary: c = a op b, w = rep, aux = bs, bits = op (see heapBinary); with rep 0 the rows·I elements
 *  are shared out as one flat run (aux = 4: b too, aux = 0: b one value).
 *  Seq heads (11) and their gradient (12): a a table of the kernel's six pointers, T, nH, nKv, hd and
 *  the scale's float32 bits; its `rows` rows (B·T) are shared out.
 *  Copy blocks (10): a a table of `rows` blocks of 4 u32 (src, dst, src row stride, row bytes), each
 *  of I rows, b the destination stride; their I·rows rows are shared out in order, a part's range
 *  crossing blocks where it must.
 *  Dequantize (14): a packed [rows, I] int32, b the scales, c the output, w inDim, aux the NF4 table
 *  (heap-code.ts), bits the NF4 block (0: int8); the packed rows are shared out, each with the output
 *  rows it holds.
 *  Draw (15): a logits [rows, I] float32, b float64 [T, u₀, u₁, …], c float64 out [rows, 2]
 *  (token, log-prob); rows are shared out (drawRows). */
function rowsPart(
  k: Kernels,
  job: number,
  a: number,
  b: number,
  c: number,
  rows: number,
  I: number,
  index: number,
  parts: number,
  w: number,
  aux: number,
  bits: number,
): void {
  if (index >= parts) return;
  if (job === 9 && w === 0) {
    const n = rows * I,
      e0 = Math.floor((n * index) / parts),
      e1 = Math.floor((n * (index + 1)) / parts);
    if (e1 > e0) k.binary(a + 4 * e0, aux ? b + 4 * e0 : b, c + 4 * e0, 0, 1, e1 - e0, 1, 0, bits);
    return;
  }
  if (job === 10) {
    const t = new Uint32Array(k.memory.buffer, a, 4 * rows),
      u1 = Math.floor((rows * I * (index + 1)) / parts);
    for (let u = Math.floor((rows * I * index) / parts); u < u1;) {
      const blk = Math.floor(u / I),
        rr = u - blk * I,
        n = Math.min(I - rr, u1 - u);
      const [src, dst, srs, cb] = [t[4 * blk], t[4 * blk + 1], t[4 * blk + 2], t[4 * blk + 3]];
      k.copyRows(dst + rr * b, b, src + rr * srs, srs, cb, n);
      u += n;
    }
    return;
  }
  if (job === 15) {
    const r0 = Math.floor((rows * index) / parts),
      r1 = Math.floor((rows * (index + 1)) / parts);
    if (r1 > r0) drawRows(k.memory.buffer, a, I, b, c, r0, r1);
    return;
  }
  if (job === 14) {
    const i0 = Math.floor((rows * index) / parts),
      i1 = Math.floor((rows * (index + 1)) / parts);
    if (i1 > i0) k[bits ? "dequantNf4" : "dequantInt8"](a, b, c, i0, i1, rows, I, w, bits, aux);
    return;
  }
  if (job === 11 || job === 12) {
    const p = new Uint32Array(k.memory.buffer, a, 11),
      n0 = Math.floor((rows * index) / parts),
      n1 = Math.floor((rows * (index + 1)) / parts);
    const scale = new Float32Array(k.memory.buffer, a + 40, 1)[0];
    if (n1 > n0) k[job === 11 ? "seqHeads" : "seqHeadsGrad"](p[0], p[1], p[2], p[3], p[4], p[5], n0, n1, p[6], p[7], p[8], p[9], scale);
    return;
  }
  const eps = new Float32Array(new Uint32Array([bits]).buffer)[0];
  if (job === 6) {
    const blocks = Math.ceil(rows / 64);
    for (let blk = Math.floor((blocks * index) / parts), end = Math.floor((blocks * (index + 1)) / parts); blk < end; blk++) {
      const r0 = 64 * blk;
      k.rmsNormGrad(a + 4 * I * r0, w, b + 4 * I * r0, c + 4 * I * r0, aux + 4 * I * blk, Math.min(64, rows - r0), I, eps);
    }
    return;
  }
  const r0 = Math.floor((rows * index) / parts),
    r1 = Math.floor((rows * (index + 1)) / parts),
    n = r1 - r0;
  if (n <= 0) return;
  if (job === 9) k.binary(a, b, c, r0, r1, I, w, aux, bits);
  else if (job === 5) k.rmsNorm(a + 4 * I * r0, w, c + 4 * I * r0, n, I, eps);
  else if (job === 1) k.swiglu(a + 8 * I * r0, c + 4 * I * r0, n, I);
  else if (job === 8) k.softmaxGrad(a + 4 * I * r0, b + 4 * I * r0, c + 4 * I * r0, n, I);
  else if (job === 2) k.swigluGrad(a + 8 * I * r0, b + 4 * I * r0, c + 8 * I * r0, n, I);
  else if (job === 3) k.rowStats(a + 4 * I * r0, c + 12 * r0, n, I);
  else k.softmaxRows(a + 4 * I * r0, b + 4 * r0, c + 4 * I * r0, n, I);
}

/** Bytes of one part's packing buffer for depth K (the nc × kc of part(): ≤ 512 KB, at least one panel).
 *  Helpers' code too (slicesPart). */
function packBytes(K: number): number {
  return Math.max(8, Math.floor(16384 / Math.min(K, 1024)) * 8) * Math.min(K, 1024) * 4;
}

/** Milliseconds a thread polls for its next hand-off before it sleeps: a helper for the next job, the
 *  caller for the helpers' answers. Waking a sleeping thread (Atomics.notify, then the OS, on a VM the
 *  hypervisor) takes tens of µs to ms, paid twice per hand-off; a forward pass of the small config
 *  makes ~100 of them, most within a fraction of a millisecond of the last. */
const SPIN_MS = 0.2;

/** The helpers' source: the job functions of this file as the running code sees them
 *  (Function.toString). Where they run through esbuild (tsx, vitest), a named inner function comes
 *  out wrapped as __name(fn, "name"), so the helpers define __name; an imported binding may come out
 *  renamed, so job functions call nothing imported. */
const HELPER = `
const __name = (f) => f;
const { workerData } = require("node:worker_threads");
const { memory, bytes, mr, ctrl, index } = workerData;
const k = new WebAssembly.Instance(new WebAssembly.Module(bytes), { env: { memory } }).exports;
const c = new Int32Array(ctrl), u = new Uint32Array(ctrl);
const claim = (q) => Atomics.add(c, ${NEXT} + q, 1);
const part = ${part.toString()};
const packBytes = ${packBytes.toString()};
const slicesPart = ${slicesPart.toString()};
const rowsPart = ${rowsPart.toString()};
const drawRows = ${drawRows.toString()};
Atomics.add(c, ${READY}, 1);
let seq = 0;
for (;;) {
  for (const until = performance.now() + ${SPIN_MS}; Atomics.load(c, ${SEQ}) === seq && performance.now() < until; );
  Atomics.wait(c, ${SEQ}, seq);
  seq = Atomics.load(c, ${SEQ});
  const at = (i) => Atomics.load(u, ${ARGS} + i);
  try {
    if (at(9) === ${JOB_GEMM}) part(k, mr, at(0), at(1), at(2), at(3), at(4), at(5), index, at(6), at(7), at(8), claim);
    else if (at(9) === ${JOB_GEMM_SLICES}) slicesPart(k, mr, at(0), at(1), at(2), at(3), at(4), at(5), index, at(6), at(7), at(8), at(10), at(11), at(12), claim);
    else rowsPart(k, at(9), at(0), at(1), at(2), at(3), at(4), index, at(6), at(5), at(7), at(8));
  } catch (err) {
    // Marked failed before answering: the caller, blocked in Atomics.wait, never runs the worker's
    // "error" event, so it reads the failure here and throws instead of waiting forever.
    Atomics.sub(c, ${READY}, 1 << 20);
    Atomics.add(c, ${DONE}, 1);
    Atomics.notify(c, ${DONE});
    throw err;
  }
  Atomics.add(c, ${DONE}, 1);
  Atomics.notify(c, ${DONE});
}`;

interface Pool {
  ctrl: Int32Array;
  args: Uint32Array; // the same block, for the pointers (up to 4 GiB)
  size: number;
}

/** Helper threads, each with the kernels on the same shared heap. They wait on the control block and
 *  never keep the process alive. */
function startPool(memory: WasmMemory, bytes: Uint8Array, mr: number, size: number): Pool {
  const ctrl = new Int32Array(new SharedArrayBuffer(4 * CTRL_SLOTS));
  for (let index = 1; index <= size; index++) {
    const w = new Worker(HELPER, { eval: true, workerData: { memory, bytes, mr, ctrl: ctrl.buffer, index } });
    w.unref();
    w.on("error", (err) => {
      Atomics.sub(ctrl, READY, 1 << 20); // a failed helper: no more parallel products
      process.stderr.write(
        `wasm kernels: helper thread ${index} failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`,
      );
    });
  }
  return { ctrl, args: new Uint32Array(ctrl.buffer), size };
}

const splitProducts = { columns: 0, rows: 0, slices: 0 };
let splitJobs = 0;
/** Products split over the helper threads so far in this process, by column panels, by rows and
 *  (batches) by slices (tests check that each split ran). */
export function splitProductCount(): { columns: number; rows: number; slices: number } {
  return { ...splitProducts };
}
/** Row and block jobs (every kernel but the product) split over the helper threads so far. */
export function splitJobCount(): number {
  return splitJobs;
}

/** Multiply-adds below which a product stays on the calling thread (a hand-off costs ~10–50 µs to a
 *  sleeping helper, a few µs to one still polling after the last job, as in a decode step). From
 *  4 M to 1 M, and 256 K for a batch (a decode step's attention: 2 · B · kv heads products of a few
 *  query heads over the cache), a tiny-preset decode step at batch 64 / 32 took 26% / 19% less time
 *  (medians of 16, alternating in one process), batch 8 and a training step the same. */
const PARALLEL_MACS = 1024 * 1024,
  PARALLEL_SLICE_MACS = 256 * 1024;
/** Whether B is packed first: only when its panels are read by enough row groups to repay the copy
 *  (1 thread, GFLOP/s: 32×896×4864 40 packed vs 35 in place, 16×4864×896 35 vs 22, but 16×256×512 38
 *  vs 46, 8×256×1376 30 vs 38). */
let packRows = 32;
const packs = (M: number, K: number) => M >= packRows || (M >= 8 && K >= 2048);
/** For the kernel's tests and A/B benchmarks: pack from this many rows (Infinity: never). */
export function setPackRows(rows: number): void {
  packRows = rows;
}

/** The packing buffer on the backend's heap (grown on demand, never shrunk). */
function scratchFor(e: HeapModule, bytes: number): number {
  if (e.scratchBytes < bytes) {
    if (e.scratch) e.free(e.scratch);
    e.scratch = e.malloc(bytes) >>> 0;
    if (!e.scratch) throw new Error(`wasm matmul: could not allocate ${bytes} bytes of packing buffer`);
    e.scratchBytes = bytes;
  }
  return e.scratch;
}

/** C [batch, M, N] = op(A) · op(B) at byte offsets of the heap, dense; A is [M, K] or, with t & 1,
 *  [K, M]; B is [K, N] or, with t & 2, [N, K]; C (each slice) is stored [N, M] with t & 8. A batch's slices of A and B are sa and sb bytes apart
 *  (0: the same operand for every slice). A batch is split by whole slices over the threads when its
 *  slices share out evenly (or nearly: at least 4 per thread) or are too small to split on their own,
 *  else each slice is split as one product. */
export function heapGemm(
  e: HeapModule,
  a: number,
  b: number,
  c: number,
  M: number,
  K: number,
  N: number,
  t: number,
  batch = 1,
  sa = 0,
  sb = 0,
): void {
  const pool = e.pool,
    parts = ready(pool) && batch * M * N * K >= (batch > 1 ? PARALLEL_SLICE_MACS : PARALLEL_MACS) ? Math.min(pool.size + 1, batch) : 1;
  if (parts > 1 && (batch % parts === 0 || batch >= 4 * parts || M * N * K < PARALLEL_MACS)) {
    const N8 = N - (N % NR),
      scratch = N8 > 0 && (t & 2 || packs(M, K)) ? scratchFor(e, parts * packBytes(K)) : 0;
    splitProducts.slices++;
    if (N8 > 0)
      fanOut(pool!, [a, b, c, M, K, N, parts, scratch, t, JOB_GEMM_SLICES, batch, sa, sb], () =>
        slicesPart(e.k, e.mr, a, b, c, M, K, N, 0, parts, scratch, t, batch, sa, sb, claimer(pool!)),
      );
    if (N8 < N) for (let s = 0; s < batch; s++) edgeColumns(e, a + s * sa, b + s * sb, c + s * M * N * 4, M, K, N, t);
  } else for (let s = 0; s < batch; s++) gemmSlice(e, a + s * sa, b + s * sb, c + s * M * N * 4, M, K, N, t);
}

/** One product C [M, N] = op(A) · op(B), split by column panels or rows. */
function gemmSlice(e: HeapModule, a: number, b: number, c: number, M: number, K: number, N: number, t: number): void {
  const N8 = N - (N % NR),
    pool = e.pool;
  // Split by column panels, or by rows where A is the larger operand by far (a decode step's
  // [out, in] weights times a few tokens' columns): each thread then reads its share of A from memory
  // instead of all of it, and products with fewer panels than threads are split too.
  const byRows = M >= 4 * N && M >= 2 * e.mr;
  const parts = ready(pool) && M * N * K >= PARALLEL_MACS ? Math.min(pool.size + 1, byRows ? Math.floor(M / e.mr) : N8 / NR) : 1;
  if (byRows) t |= 4;
  const scratch = N8 > 0 && (t & 2 || packs(M, K)) ? scratchFor(e, parts * packBytes(K)) : 0;
  if (parts > 1) {
    splitProducts[byRows ? "rows" : "columns"]++;
    fanOut(pool!, [a, b, c, M, K, N, parts, scratch, t, JOB_GEMM], () =>
      part(e.k, e.mr, a, b, c, M, K, N, 0, parts, scratch, t, claimer(pool!)),
    );
  } else if (N8 > 0) part(e.k, e.mr, a, b, c, M, K, N, 0, 1, scratch, t);
  if (N8 < N) edgeColumns(e, a, b, c, M, K, N, t);
}

/** The calling thread's claim(q) for part() and slicesPart(): the next of part q's units of the job in hand. */
const claimer = (pool: Pool) => (q: number) => Atomics.add(pool.ctrl, NEXT + q, 1);

/** Hands a job (args: the ARGS slots) to every helper, runs part 0 here (own), and waits for all. */
function fanOut(pool: Pool, args: number[], own: () => void): void {
  const { ctrl, args: slots } = pool;
  args.forEach((x, i) => Atomics.store(slots, ARGS + i, x));
  Atomics.store(ctrl, DONE, 0);
  for (let q = 0; q < MAX_WASM_THREADS; q++) Atomics.store(ctrl, NEXT + q, 0);
  Atomics.add(ctrl, SEQ, 1);
  Atomics.notify(ctrl, SEQ);
  own();
  // Every helper answers, including those with no part this time (index ≥ parts).
  for (const until = performance.now() + SPIN_MS; Atomics.load(ctrl, DONE) < pool.size && performance.now() < until;);
  for (let d = Atomics.load(ctrl, DONE); d < pool.size; d = Atomics.load(ctrl, DONE)) {
    if (Atomics.load(ctrl, READY) < 0) break;
    Atomics.wait(ctrl, DONE, d, 1000);
  }
  // A helper that failed (its job threw, or it never started) left its part undone.
  if (Atomics.load(ctrl, READY) < 0) throw new Error("wasm kernels: a helper thread failed");
}

const ready = (pool: Pool | null): pool is Pool => pool !== null && Atomics.load(pool.ctrl, READY) === pool.size;

/** Resolves once the heap module's helper threads (where it has any) take jobs, or after timeoutMs:
 *  they start in the background with the module, and until then every kernel runs on the calling
 *  thread (tests that check a split ran wait for them after a build switch, which starts new ones). */
export async function heapHelpersReady(backend: Backend, timeoutMs = 60_000): Promise<void> {
  const { pool } = heapModule(backend);
  for (const until = Date.now() + timeoutMs; pool && !ready(pool) && Date.now() < until;) await new Promise((r) => setTimeout(r, 10));
}

/** Elements from which an element-wise kernel is split over the helpers (its work then outweighs the
 *  ~10–50 µs hand-off). */
const PARALLEL_ELEMENTS = 64 * 1024;

/** SwiGLU on the heap module, rows split over the helper threads when large: y [rows, I] from gu
 *  [rows, 2I] (grad null), or dgu [rows, 2I] from gu and dy [rows, I]. Byte offsets of the backend's
 *  heap; I a multiple of 4. Each row is computed the same way on any thread. */
export function heapSwiglu(backend: unknown, gu: number, dy: number | null, out: number, rows: number, I: number): void {
  rowsJob(heapModule(backend), dy === null ? JOB_SWIGLU : JOB_SWIGLU_GRAD, gu, dy ?? 0, out, rows, I);
}

function rowsJob(e: HeapModule, job: number, a: number, b: number, c: number, rows: number, I: number, w = 0, aux = 0, eps = 0): void {
  const units = job === JOB_RMS_NORM_GRAD ? Math.ceil(rows / NORM_BLOCK) : rows;
  splitJob(e, job, units, rows * I, a, b, c, rows, I, w, aux, new Uint32Array(new Float32Array([eps]).buffer)[0]);
}

/** Runs rowsPart's job over `units` parts of work at most, split over the helpers when `size` (elements) repays it. */
function splitJob(e: HeapModule, job: number, units: number, size: number, ...[a, b, c, rows, I, w, aux, bits]: number[]): void {
  const parts = ready(e.pool) && size >= PARALLEL_ELEMENTS ? Math.min(e.pool.size + 1, units) : 1;
  if (parts > 1) {
    splitJobs++;
    fanOut(e.pool!, [a, b, c, rows, I, w, parts, aux, bits, job], () => rowsPart(e.k, job, a, b, c, rows, I, 0, parts, w, aux, bits));
  } else rowsPart(e.k, job, a, b, c, rows, I, 0, 1, w, aux, bits);
}

/** out = a op b for float32 at heap offsets (op: BINARY_OPS of heap-elementwise-code.ts), rows split
 *  over the helper threads from 64 K elements. a and out are [rows, W]; b's row for row r is at b +
 *  ⌊r / rep⌋·bs (bs in bytes), or with op + 3 b holds one value there. rep 0: a flat run of rows·W
 *  elements, b the same shape (bs = 4) or one value (bs = 0, op + 3). */
export function heapBinary(
  backend: unknown,
  op: number,
  a: number,
  b: number,
  out: number,
  rows: number,
  W: number,
  rep: number,
  bs: number,
): void {
  splitJob(heapModule(backend), JOB_BINARY, rep === 0 ? rows * W : rows, rows * W, a, b, out, rows, W, rep, bs, op);
}

/** Bytes from which a copy is split over the helpers: copies are bound by memory, and a decode
 *  step's key/value appends (~600 KB) ran slower split than on one thread. */
const PARALLEL_COPY_BYTES = 1 << 20;

/** Blocks of strided rows copied on the heap, each block [src, dst, srs, rowBytes] (byte offsets and
 *  the source row stride) of R rows, the destination rows `stride` apart. The rows are split over the
 *  helper threads when `bytes` in all reach 1 MB (the table of blocks then goes on the heap). */
export function heapBlocks(backend: unknown, blocks: number[][], R: number, stride: number, bytes: number): void {
  const e = heapModule(backend),
    units = blocks.length * R;
  if (!(ready(e.pool) && bytes >= PARALLEL_COPY_BYTES && units > 1)) {
    for (const [src, dst, srs, cb] of blocks) e.k.copyRows(dst, stride, src, srs, cb, R);
    return;
  }
  const table = e.malloc(16 * blocks.length) >>> 0;
  try {
    new Uint32Array(e.memory.buffer, table, 4 * blocks.length).set(blocks.flat());
    splitJob(e, JOB_COPY_BLOCKS, units, bytes / 4, table, stride, 0, blocks.length, R, 0, 0, 0);
  } finally {
    e.free(table);
  }
}

/** The heads of the fused projection (heads.ts) on the heap module: forward (grad false) with p =
 *  [qkv, cos, sin, q, kT, v], or the gradient with p = [dq, dkT, dv, cos, sin, dqkv], byte offsets of
 *  the backend's heap; rows = B·T, hd a multiple of 8. Rows split over the helper threads when large
 *  (each row is computed the same way on any thread). */
export function heapSeqHeads(
  backend: unknown,
  grad: boolean,
  p: number[],
  rows: number,
  T: number,
  nH: number,
  nKv: number,
  hd: number,
  scale: number,
): void {
  const e = heapModule(backend),
    table = e.malloc(44) >>> 0;
  try {
    new Uint32Array(e.memory.buffer, table, 11).set([...p, T, nH, nKv, hd, new Uint32Array(new Float32Array([scale]).buffer)[0]]);
    splitJob(e, grad ? JOB_SEQ_HEADS_GRAD : JOB_SEQ_HEADS, rows, rows * (nH + 2 * nKv) * hd, table, 0, 0, rows, 0, 0, 0, 0);
  } finally {
    e.free(table);
  }
}

/** The frozen base's codes to float32 (dequant.ts' MarlDequantize on wasm): out [inDim, n] from packed
 *  int32 [P, n] and scales (int8 [1, n], NF4 [P·8 / block, n]), byte offsets of the backend's heap.
 *  The packed rows are split over the helper threads when the output reaches 64 K elements; each
 *  output is one float32 product whichever thread makes it. table: NF4's 16 values (unused for int8). */
export function heapDequantize(
  backend: unknown,
  kind: "int8" | "nf4",
  packed: number,
  scales: number,
  out: number,
  P: number,
  n: number,
  inDim: number,
  table: ArrayLike<number>,
  block: number,
): void {
  if (kind === "nf4" && !(table.length === 16 && block > 0))
    throw new Error(`heap dequantize nf4: expected a 16-value table and a block > 0, got ${table.length} values, block ${block}`);
  const e = heapModule(backend),
    tab = e.malloc(64) >>> 0;
  try {
    if (kind === "nf4") new Float32Array(e.memory.buffer, tab, 16).set(table);
    splitJob(e, JOB_DEQUANT, P, inDim * n, packed, scales, out, P, n, inDim, tab, kind === "nf4" ? block : 0);
  } finally {
    e.free(tab);
  }
}

/** Rows [r0, r1) of a draw from whole rows of logits [rows, V] at byte offset x: per row, the token
 *  of an inverse-CDF draw in id order over softmax(logits / T) with the row's uniform, and its
 *  log-probability, into out (float64 [rows, 2]); at T = 0 the argmax (lowest id among equal
 *  largest logits) and log-prob 0, as sampleRow's greedy; p holds float64 T, then one uniform per row. The
 *  arithmetic of rollout/sample-row.ts sampleRow's whole-vocabulary id walk, step for step (float64
 *  weights from Math.exp, negligible below −40, summed in id order), so the same tokens and
 *  log-probs; a row without a finite largest logit gets token −1 (the caller reports it). A job of
 *  the helpers too (plain JS, no imports). */
function drawRows(buf: ArrayBufferLike, x: number, V: number, p: number, out: number, r0: number, r1: number): void {
  const f = new Float64Array(buf, p, 1 + r1),
    o = new Float64Array(buf, out, 2 * r1),
    T = f[0],
    e = new Float64Array(V);
  for (let r = r0; r < r1; r++) {
    const row = new Float32Array(buf, x + 4 * r * V, V);
    let max = -Infinity,
      argmax = 0;
    for (let j = 0; j < V; j++)
      if (row[j] > max) {
        max = row[j];
        argmax = j;
      }
    if (!(max > -Infinity && max < Infinity)) {
      o[2 * r] = -1;
      o[2 * r + 1] = NaN;
      continue;
    }
    if (T === 0) {
      o[2 * r] = argmax; // greedy: the first (lowest) id of the largest logit, a certain choice
      o[2 * r + 1] = 0;
      continue;
    }
    let sum = 0;
    for (let j = 0; j < V; j++) {
      const z = (row[j] - max) / T;
      sum += e[j] = z > -40 ? Math.exp(z) : 0;
    }
    const logZ = Math.log(sum),
      target = f[1 + r] * sum;
    let acc = 0,
      tok = argmax;
    for (let j = 0; j < V; j++) {
      if (e[j] === 0) continue;
      acc += e[j];
      tok = j;
      if (target < acc) break;
    }
    o[2 * r] = tok;
    o[2 * r + 1] = (row[tok] - max) / T - logZ;
  }
}

/** Draws one token per row of logits [rows, V] (float32 at heap offset x) at temperature T with one
 *  uniform per row, rows split over the helper threads: drawRows, into out (float64 [rows, 2]: the
 *  token, −1 where the row has no finite largest logit, and its log-prob; 8-byte aligned). */
export function heapDrawRows(backend: unknown, x: number, rows: number, V: number, T: number, us: number[], out: number): void {
  if (out % 8) throw new Error(`heap draw: the output at byte ${out} is not 8-byte aligned for float64`);
  const e = heapModule(backend),
    p = e.malloc(8 * (1 + rows)) >>> 0;
  if (!p) throw new Error(`heap draw: could not allocate ${8 * (1 + rows)} bytes`);
  try {
    new Float64Array(e.memory.buffer, p, 1 + rows).set([T, ...us]);
    splitJob(e, JOB_DRAW, rows, rows * V, x, p, out, rows, V);
  } finally {
    e.free(p);
  }
}

/** Softmax's backward dx = y · (dy − Σ y·dy) per row of [rows, S] at heap offsets (S a multiple of 4). */
export function heapSoftmaxGrad(backend: unknown, y: number, dy: number, dx: number, rows: number, S: number): void {
  rowsJob(heapModule(backend), JOB_SOFTMAX_GRAD, y, dy, dx, rows, S);
}

/** RMSNorm of x [rows, H] with weight w [H] into y, at heap offsets (H a multiple of 4); rows split
 *  over the helper threads when large. */
export function heapRmsNorm(backend: unknown, x: number, w: number, y: number, rows: number, H: number, eps: number): void {
  rowsJob(heapModule(backend), JOB_RMS_NORM, x, 0, y, rows, H, w, 0, eps);
}

/** RMSNorm's gradient: dx [rows, H] into its heap offset, dw [H] returned (the blocks of 64 rows
 *  summed in order, in float64). */
export function heapRmsNormGrad(
  backend: unknown,
  x: number,
  w: number,
  dy: number,
  dx: number,
  rows: number,
  H: number,
  eps: number,
): Float32Array {
  const e = heapModule(backend),
    blocks = Math.ceil(rows / NORM_BLOCK),
    part = e.malloc(4 * H * blocks) >>> 0;
  try {
    rowsJob(e, JOB_RMS_NORM_GRAD, x, dy, dx, rows, H, w, part, eps);
    const p = new Float32Array(e.memory.buffer, part, H * blocks),
      dw = new Float64Array(H);
    for (let b = 0; b < blocks; b++) for (let j = 0; j < H; j++) dw[j] += p[b * H + j];
    return Float32Array.from(dw);
  } finally {
    e.free(part);
  }
}

/** Per row of x [rows, V] at heap offset x (V a multiple of 4): [m, s, t] with m = max, s = Σ exp(x −
 *  m), t = Σ exp(x − m)·x, from the heap module's kernel (rows split over the helper threads). */
export function heapRowStats(backend: unknown, x: number, rows: number, V: number): Float32Array {
  const e = heapModule(backend),
    out = e.malloc(12 * rows) >>> 0;
  try {
    rowsJob(e, JOB_ROW_STATS, x, 0, out, rows, V);
    return new Float32Array(e.memory.buffer, out, 3 * rows).slice();
  } finally {
    e.free(out);
  }
}

/** out [rows, V] = softmax(x) · coef[r] per row, at heap offsets (V a multiple of 4). */
export function heapSoftmaxRows(backend: unknown, x: number, coef: Float32Array, out: number, rows: number, V: number): void {
  const e = heapModule(backend),
    c = e.malloc(4 * rows) >>> 0;
  try {
    new Float32Array(e.memory.buffer, c, rows).set(coef);
    rowsJob(e, JOB_SOFTMAX, x, c, out, rows, V);
  } finally {
    e.free(c);
  }
}

/** The last N mod 8 columns (after every part is done, so the scratch buffer is free): B's columns
 *  packed into one zero-padded panel, the vector kernel run on it into a [rows, 8] block of scratch,
 *  and the valid columns copied out. Lanes past N add zeros to nothing, so each output is summed as
 *  the panels' are (a one-output-at-a-time loop here ran at ~1 GFLOP/s: a 27-row vocab-head chunk
 *  spent 3 of its 27 columns' worth of work in it, most of its time). With t & 8 the valid columns
 *  go to C's transposed rows. */
function edgeColumns(e: HeapModule, a: number, b: number, c: number, M: number, K: number, N: number, t: number): void {
  const N8 = N - (N % NR),
    n = N - N8,
    ldc = 4 * N;
  const ars = t & 1 ? 4 : 4 * K,
    aks = t & 1 ? 4 * M : 4;
  const mr = e.mr,
    mc = Math.max(mr, Math.floor(65536 / K) - (Math.floor(65536 / K) % mr));
  const buf = scratchFor(e, 32 * (K + mc)),
    cbuf = buf + 32 * K;
  // B[k, j] is float b/4 + k·ldb + j·cs
  const [ldb, cs] = t & 2 ? [1, K] : [N, 1];
  const heap = new Float32Array(e.memory.buffer),
    p = buf / 4,
    q = b / 4 + N8 * cs;
  for (let k = 0; k < K; k++) for (let j = 0; j < 8; j++) heap[p + 8 * k + j] = j < n ? heap[q + k * ldb + j * cs] : 0;
  for (let i0 = 0; i0 < M; i0 += mc) {
    const rows = Math.min(mc, M - i0),
      rb = rows - (rows % mr);
    if (rb) e.k.tile(a + i0 * ars, buf, cbuf, rb, 8, K, ars, aks, 32, 32, 32 * K, 0);
    if (rb < rows)
      e.k[("tile" + (rows - rb)) as "tile1"](a + (i0 + rb) * ars, buf, cbuf + 32 * rb, rows - rb, 8, K, ars, aks, 32, 32, 32 * K, 0);
    if (!(t & 8)) e.k.copyRows(c + i0 * ldc + 4 * N8, ldc, cbuf, 32, 4 * n, rows);
    else for (let j = 0; j < n; j++) for (let i = 0; i < rows; i++) heap[c / 4 + (N8 + j) * M + i0 + i] = heap[cbuf / 4 + 8 * i + j];
  }
}

/** The module's kernels on the backend's heap (started on first use), for the other heap kernels. */
export function heapKernels(backend: unknown): Kernels {
  return heapModule(backend).k;
}
