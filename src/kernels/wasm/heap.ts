/** The heap module (heap-code.ts) on tfjs-backend-wasm's own heap: one instance per heap, helper
 *  threads (threaded build) that share it through a control block, and the jobs they split: a
 *  product's columns, rows or batch slices (`heapGemm`, used by gemm.ts), and the rows of the row and
 *  copy kernels (`rowsJob`, `splitJob`: heap-ops.ts). Work is split only where it repays a hand-off,
 *  and every output is computed the same way whatever the split, so results do not depend on the
 *  thread count. The helpers' source is built here from heap-jobs.ts' functions (Function.toString),
 *  with the control block's slots and job numbers inlined. Leaves out: tfjs' own thread pool (kept at
 *  one thread, wasm/threads.ts). */
import * as tf from "@tensorflow/tfjs";
import { Worker } from "node:worker_threads";
import { MAX_WASM_THREADS, wasmThreads } from "./threads.ts";
import { gemmModuleBytes } from "./heap-code.ts";
import { rowsPerBlock, WA, wasmSimd, type WasmMemory, type WasmSimd } from "./heap-build.ts";
import type { Backend } from "../kernels.ts";
import {
  ARGS,
  CTRL_SLOTS,
  DONE,
  drawRows,
  JOB_GEMM,
  JOB_GEMM_SLICES,
  JOB_RMS_NORM_GRAD,
  NEXT,
  NORM_BLOCK,
  packBytes,
  part,
  READY,
  rowsPart,
  SEQ,
  slicesPart,
} from "./heap-jobs.ts";

/** Columns per register block of the product kernels (rows per block: heap-build.ts). */
const NR = 8;

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

/** The heap module on the backend's heap, built on first use (and again after a build switch,
 *  heap-build.ts). */
export function heapModule(backend: Backend): HeapModule {
  const memory = heapMemory(backend);
  const simd = wasmSimd();
  if (instance && instance.memory === memory && instance.simd === simd) return instance;
  const shared = typeof SharedArrayBuffer === "function" && memory.buffer instanceof SharedArrayBuffer;
  const mr = rowsPerBlock(simd);
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
    else if (at(9) === ${JOB_GEMM_SLICES})
      slicesPart(k, mr, at(0), at(1), at(2), at(3), at(4), at(5), index, at(6), at(7), at(8), at(10), at(11), at(12), claim);
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
 * [K, M]; B is [K, N] or, with t & 2, [N, K]; C (each slice) is stored [N, M] with t & 8. A batch's slices of
 * A and B are sa and sb bytes apart
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

export const ready = (pool: Pool | null): pool is Pool => pool !== null && Atomics.load(pool.ctrl, READY) === pool.size;

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

export function rowsJob(
  e: HeapModule,
  job: number,
  a: number,
  b: number,
  c: number,
  rows: number,
  I: number,
  w = 0,
  aux = 0,
  eps = 0,
): void {
  const units = job === JOB_RMS_NORM_GRAD ? Math.ceil(rows / NORM_BLOCK) : rows;
  splitJob(e, job, units, rows * I, a, b, c, rows, I, w, aux, new Uint32Array(new Float32Array([eps]).buffer)[0]);
}

/** Runs rowsPart's job over `units` parts of work at most, split over the helpers when `size` (elements) repays it. */
export function splitJob(e: HeapModule, job: number, units: number, size: number, ...[a, b, c, rows, I, w, aux, bits]: number[]): void {
  const parts = ready(e.pool) && size >= PARALLEL_ELEMENTS ? Math.min(e.pool.size + 1, units) : 1;
  if (parts > 1) {
    splitJobs++;
    fanOut(e.pool!, [a, b, c, rows, I, w, parts, aux, bits, job], () => rowsPart(e.k, job, a, b, c, rows, I, 0, parts, w, aux, bits));
  } else rowsPart(e.k, job, a, b, c, rows, I, 0, 1, w, aux, bits);
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
