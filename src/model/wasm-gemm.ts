/** The wasm backend's BatchMatMul for the plain product (float32, no transposes): the kernel of
 *  wasm-gemm-code.ts run directly on tfjs' heap, C = A · B over blocks of 4 rows × 8 columns held in
 *  vector registers. Measured at 1 thread on the shapes of the bench's configs it does 1.5–2× the
 *  floating-point work per second of tfjs' XNNPACK product (45–52 against 21–35 GFLOP/s), and it packs
 *  no copy of B, so a weight costs no cached copy on the heap. Batched products (equal batch dims, or
 *  a batch of one on either side) run slice by slice on heap offsets. Transposed products and int32
 *  operands go to tfjs' kernel, which matmul.ts avoids (it materialises transposes).
 *  Each output is summed over k in order, whatever the row and column split, so results do not depend
 *  on the thread count. */
import * as tf from "@tensorflow/tfjs";
import { Worker } from "node:worker_threads";
import { wasmThreads } from "../wasm-threads.ts";
import { gemmModuleBytes } from "./wasm-gemm-code.ts";

/** Rows per register block: 4 rows × 8 columns = 8 accumulators, within x64's 16 vector registers
 *  with the two halves of B's row and the broadcast A value (5 rows spill: half the speed). */
const MR = 4;
const NR = 8;

interface Kernels {
  tile: (a: number, b: number, c: number, M: number, N: number, K: number, lda: number, ldb: number, ldc: number) => void;
  tile1: Kernels["tile"];
  edge: Kernels["tile"];
}

// Node's WebAssembly, typed here (the project compiles without the DOM library).
interface WasmMemory {
  buffer: ArrayBuffer | SharedArrayBuffer;
}
const WA = (globalThis as unknown as { WebAssembly: { Memory: new (d: object) => WasmMemory; Module: new (b: Uint8Array) => object; Instance: new (m: object, i: object) => { exports: unknown } } }).WebAssembly;

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type WasmBackend = any;

/** The backend's WebAssembly.Memory: the threaded build keeps it as `wasmMemory`, the single-threaded
 *  one as its module's exported `memory`. */
function heapMemory(b: WasmBackend): WasmMemory {
  const m = b.wasm?.wasmMemory ?? b.wasm?.asm?.memory;
  if (!(m instanceof WA.Memory)) throw new Error("wasm matmul: the tfjs wasm module exposes no WebAssembly.Memory");
  return m;
}

/** The kernels on one heap, and the helper threads that share it (threaded build only). */
interface Engine {
  memory: WasmMemory;
  k: Kernels;
  pool: Pool | null;
}
let engine: Engine | null = null;

function start(backend: WasmBackend): Engine {
  const memory = heapMemory(backend);
  if (engine && engine.memory === memory) return engine;
  const shared = typeof SharedArrayBuffer === "function" && memory.buffer instanceof SharedArrayBuffer;
  const bytes = gemmModuleBytes({ mr: MR, memory: { shared, initial: 1, maximum: 65536 } });
  const k = new WA.Instance(new WA.Module(bytes), { env: { memory } }).exports as Kernels;
  const threads = wasmThreads();
  engine = { memory, k, pool: shared && threads > 1 ? startPool(memory, bytes, threads - 1) : null };
  return engine;
}

/** The control block shared with the helpers (Int32 slots). */
const SEQ = 0, DONE = 1, READY = 2, ARGS = 3; // ARGS: a, b, c, M, K, N, parts
const CTRL_SLOTS = ARGS + 7;

/** Columns [j0, j1) of one part of C = A · B, parts of whole 8-column panels. Runs on every thread,
 *  so it is also the helpers' code (stringified below): only plain JS, no imports. */
function part(k: Kernels, a: number, b: number, c: number, M: number, K: number, N: number, index: number, parts: number): void {
  const lda = 4 * K, ldb = 4 * N;
  const M4 = M - (M % 4), panels = (N - (N % 8)) / 8;
  const per = Math.ceil(panels / parts), j0 = Math.min(panels, index * per) * 8, j1 = Math.min(panels, (index + 1) * per) * 8;
  if (j1 <= j0) return;
  // Rows in blocks of ≤ 256 KB of A, which stay in cache while every column panel passes over them
  // (else a tall A, such as a vocab head held [vocab, hidden], is read from memory once per panel).
  const mc = Math.max(4, Math.floor(65536 / K) - (Math.floor(65536 / K) % 4));
  for (let i0 = 0; i0 < M4; i0 += mc) k.tile(a + i0 * lda, b + 4 * j0, c + i0 * ldb + 4 * j0, Math.min(mc, M4 - i0), j1 - j0, K, lda, ldb, ldb);
  if (M4 < M) k.tile1(a + M4 * lda, b + 4 * j0, c + M4 * ldb + 4 * j0, M - M4, j1 - j0, K, lda, ldb, ldb);
}

const HELPER = `
const { workerData } = require("node:worker_threads");
const { memory, bytes, ctrl, index } = workerData;
const k = new WebAssembly.Instance(new WebAssembly.Module(bytes), { env: { memory } }).exports;
const c = new Int32Array(ctrl), u = new Uint32Array(ctrl);
const part = ${part.toString()};
Atomics.add(c, ${READY}, 1);
let seq = 0;
for (;;) {
  Atomics.wait(c, ${SEQ}, seq);
  seq = Atomics.load(c, ${SEQ});
  const at = (i) => Atomics.load(u, ${ARGS} + i);
  part(k, at(0), at(1), at(2), at(3), at(4), at(5), index, at(6));
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
function startPool(memory: WasmMemory, bytes: Uint8Array, size: number): Pool {
  const ctrl = new Int32Array(new SharedArrayBuffer(4 * CTRL_SLOTS));
  for (let index = 1; index <= size; index++) {
    const w = new Worker(HELPER, { eval: true, workerData: { memory, bytes, ctrl: ctrl.buffer, index } });
    w.unref();
    w.on("error", () => Atomics.sub(ctrl, READY, 1 << 20)); // a failed helper: no more parallel products
  }
  return { ctrl, args: new Uint32Array(ctrl.buffer), size };
}

/** Multiply-adds below which a product stays on the calling thread (a hand-off costs ~10–50 µs). */
const PARALLEL_MACS = 4 * 1024 * 1024;

/** C [M, N] = A [M, K] · B [K, N] at byte offsets of the heap (row-major, dense). */
function gemm(e: Engine, a: number, b: number, c: number, M: number, K: number, N: number): void {
  const N8 = N - (N % NR), pool = e.pool;
  const parts = pool && M * N * K >= PARALLEL_MACS && Atomics.load(pool.ctrl, READY) === pool.size ? Math.min(pool.size + 1, N8 / NR) : 1;
  if (parts > 1) {
    const { ctrl, args } = pool!;
    [a, b, c, M, K, N, parts].forEach((x, i) => Atomics.store(args, ARGS + i, x));
    Atomics.store(ctrl, DONE, 0);
    Atomics.add(ctrl, SEQ, 1);
    Atomics.notify(ctrl, SEQ);
    part(e.k, a, b, c, M, K, N, 0, parts);
    // Every helper answers, including those with no columns this time (index ≥ parts).
    for (let d = Atomics.load(ctrl, DONE); d < pool!.size; d = Atomics.load(ctrl, DONE)) {
      if (Atomics.load(ctrl, READY) < 0) throw new Error("wasm matmul: a helper thread failed");
      Atomics.wait(ctrl, DONE, d, 1000);
    }
  } else if (N8 > 0) part(e.k, a, b, c, M, K, N, 0, 1);
  if (N8 < N) e.k.edge(a, b + 4 * N8, c + 4 * N8, M, N - N8, K, 4 * K, 4 * N, 4 * N);
}

let original: tf.KernelConfig | undefined;
let enabled = true;

/** Turn the kernel off (tfjs' own product) or on again: for tests and A/B benchmarks. */
export function useWasmGemm(on: boolean): void {
  enabled = on;
}

/** Replace the wasm BatchMatMul with one that takes the plain products (idempotent). */
export function registerWasmGemm(): void {
  if (original) return;
  original = tf.getKernel("BatchMatMul", "wasm");
  if (!original) return;
  const fallback = original.kernelFunc;
  tf.unregisterKernel("BatchMatMul", "wasm");
  tf.registerKernel({
    ...original,
    kernelFunc: (args) => {
      const { a, b } = args.inputs as { a: tf.TensorInfo; b: tf.TensorInfo };
      const { transposeA, transposeB } = args.attrs as { transposeA: boolean; transposeB: boolean };
      const ra = a.shape.length, rb = b.shape.length;
      const batchA = a.shape.slice(0, -2).reduce((p, d) => p * d, 1), batchB = b.shape.slice(0, -2).reduce((p, d) => p * d, 1);
      const sameBatch = ra === rb && a.shape.slice(0, -2).every((d, i) => d === b.shape[i]);
      if (!enabled || transposeA || transposeB || a.dtype !== "float32" || b.dtype !== "float32" || !(sameBatch || batchA === 1 || batchB === 1) || ra < 2 || rb < 2)
        return fallback(args);
      const M = a.shape[ra - 2], K = a.shape[ra - 1], N = b.shape[rb - 1];
      if (b.shape[rb - 2] !== K) return fallback(args); // tfjs' kernel reports the mismatch
      const backend = args.backend as WasmBackend;
      const batch = Math.max(batchA, batchB);
      const outShape = [...(batchA >= batchB ? a.shape : b.shape).slice(0, -2), M, N];
      const out = backend.makeOutput(outShape, "float32") as tf.TensorInfo;
      if (M * N === 0) return out;
      const e = start(backend);
      const pa = backend.dataIdMap.get(a.dataId).memoryOffset as number;
      const pb = backend.dataIdMap.get(b.dataId).memoryOffset as number;
      const pc = backend.dataIdMap.get(out.dataId).memoryOffset as number;
      if (K === 0) {
        backend.typedArrayFromHeap(out).fill(0);
        return out;
      }
      for (let s = 0; s < batch; s++)
        gemm(e, pa + (batchA === 1 ? 0 : s * M * K * 4), pb + (batchB === 1 ? 0 : s * K * N * 4), pc + s * M * N * 4, M, K, N);
      return out;
    },
  });
}
