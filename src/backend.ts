/** Picks the tfjs backend once per process: tfjs-node-gpu → webgpu on a hardware adapter → tfjs-node →
 *  wasm → cpu, or the one asked for. The native bindings are optional packages (not dependencies), so
 *  they are imported by a variable name and a failed import just moves on; webgpu (Dawn) is a
 *  dependency and starts in backend-webgpu.ts. A backend asked for by name that cannot start is a
 *  usage error (one line, exit 2); `auto` moves on to the next. Also fills the one kernel gap training
 *  hits on wasm: UnsortedSegmentSum (the gradient of gather), needed when embeddings train in full mode.
 *  wasm runs on `threads` threads (default: every core this process may use; see wasm-threads.ts).
 *  Leaves out: WebGL (this is a Node trainer). */
import * as tf from "@tensorflow/tfjs";
import "@tensorflow/tfjs-backend-wasm";
import { UsageError } from "./cli.ts";
import { registerWebgpu } from "./backend-webgpu.ts";
import { registerWasmConcat } from "./model/wasm-concat.ts";
import { registerWasmGather } from "./model/wasm-gather.ts";
import { heapKernels, registerWasmGemm } from "./model/wasm-gemm.ts";
import { resolveThreads, startWasm, wasmThreads, type ThreadsSpec } from "./wasm-threads.ts";

export type BackendName = "tensorflow" | "webgpu" | "wasm" | "cpu" | "auto";
export const BACKEND_NAMES: BackendName[] = ["auto", "tensorflow", "webgpu", "wasm", "cpu"];
/** How `auto` chooses, for help texts. */
export const AUTO_ORDER = "tfjs-node-gpu → webgpu (hardware adapter) → tfjs-node → wasm → cpu";

let chosen: Promise<string> | null = null;

export interface BackendOptions {
  /** wasm threads: "auto" (default) = every core this process may use, up to 8; 1 = single-threaded. */
  threads?: ThreadsSpec;
}

/** Idempotent: the first call decides (backend and threads), later calls return the same backend name. */
export function initBackend(name: BackendName | string = "auto", opts: BackendOptions = {}): Promise<string> {
  if (!BACKEND_NAMES.includes(name as BackendName))
    throw new UsageError(`unknown backend "${name}"; accepted: ${BACKEND_NAMES.join(", ")}`);
  const threads = opts.threads ?? "auto";
  resolveThreads(threads); // a bad count fails here, before anything starts
  if (!chosen) chosen = pick(name as BackendName, threads);
  return chosen;
}

async function tryNative(mods: string[]): Promise<boolean> {
  for (const mod of mods) {
    try {
      const m = mod; // a variable keeps TypeScript from needing the optional package's types
      await import(m);
      if (await tf.setBackend("tensorflow")) return true;
    } catch {
      // not installed or no native binary for this platform: try the next one
    }
  }
  return false;
}

/** Register and switch to webgpu; prints the adapter once. hardwareOnly: refuse a software adapter. */
async function tryWebgpu(hardwareOnly: boolean): Promise<{ ok: boolean; reason?: string }> {
  const p = await registerWebgpu(hardwareOnly);
  if (!p.ok) return p;
  if (!(await tf.setBackend("webgpu").catch(() => false))) return { ok: false, reason: "the tfjs webgpu backend failed to initialise" };
  process.stderr.write(`webgpu adapter: ${p.info.description}${p.info.fallback ? " (software adapter: correct but slow)" : ""}\n`);
  return { ok: true };
}

async function pick(name: BackendName, threads: ThreadsSpec): Promise<string> {
  if (name === "tensorflow" || name === "auto") {
    if (await tryNative(["@tensorflow/tfjs-node-gpu"])) return done();
  }
  if (name === "webgpu" || name === "auto") {
    const w = await tryWebgpu(name === "auto");
    if (w.ok) return done();
    if (name === "webgpu") throw new UsageError(`backend webgpu: ${w.reason}`);
  }
  if (name === "tensorflow" || name === "auto") {
    if (await tryNative(["@tensorflow/tfjs-node"])) return done();
    if (name === "tensorflow")
      throw new UsageError("backend tensorflow needs @tensorflow/tfjs-node or @tensorflow/tfjs-node-gpu installed (npm install @tensorflow/tfjs-node)");
  }
  if (name === "wasm" || name === "auto") {
    registerWasmExtras();
    if (await startWasm(threads)) {
      guardWasmMalloc();
      return done();
    }
    if (name === "wasm") throw new Error("backend wasm failed to initialise");
  }
  await tf.setBackend("cpu");
  return done();
}

async function done(): Promise<string> {
  await tf.ready();
  const b = tf.getBackend();
  const n = wasmThreads();
  process.stderr.write(`tfjs backend: ${b}${b === "wasm" ? ` (${n} thread${n > 1 ? "s" : ""})` : ""}\n`);
  return b;
}

/** UnsortedSegmentSum for wasm, computed in JS on the heap views (only the gather gradient of a
 *  trainable embedding uses it, so simplicity beats speed here). */
export function registerWasmExtras(): void {
  registerFastSlice();
  registerSharedIdentity();
  registerWasmGemm();
  registerWasmConcat();
  registerWasmGather();
  if (tf.getKernel("UnsortedSegmentSum", "wasm")) return;
  tf.registerKernel({
    kernelName: "UnsortedSegmentSum",
    backendName: "wasm",
    kernelFunc: ({ inputs, backend, attrs }) => {
      const { x, segmentIds } = inputs as { x: tf.TensorInfo; segmentIds: tf.TensorInfo };
      const numSegments = (attrs as { numSegments: number }).numSegments;
      // eslint-disable-next-line @typescript-eslint/no-explicit-any
      const b = backend as any;
      const xv = b.readSync(x.dataId) as Float32Array | Int32Array;
      const ids = b.readSync(segmentIds.dataId) as Int32Array;
      const inner = x.shape.slice(segmentIds.shape.length).reduce((p, d) => p * d, 1);
      const outShape = [numSegments, ...x.shape.slice(segmentIds.shape.length)];
      const out = b.makeOutput(outShape, x.dtype) as tf.TensorInfo;
      const ov = b.typedArrayFromHeap(out) as Float32Array;
      ov.fill(0);
      for (let i = 0; i < ids.length; i++) {
        const s = ids[i];
        if (s < 0 || s >= numSegments) continue; // tf semantics: out-of-range ids are dropped
        const src = i * inner, dst = s * inner;
        for (let j = 0; j < inner; j++) ov[dst + j] += xv[src + j];
      }
      return out;
    },
  });
}

/** tfjs-backend-wasm does not check malloc's result: when the heap cannot grow (4 GiB), a tensor gets
 *  offset 0 and its kernel writes over the module's static data, malloc's own lock among it, and the
 *  next allocation spins forever. A failed allocation throws here instead, with what to change. */
function guardWasmMalloc(): void {
  type Malloc = ((n: number) => number) & { guarded?: true };
  const wasm = (tf.backend() as unknown as { wasm: { _malloc: Malloc; asm?: { malloc?: Malloc }; HEAPU8: Uint8Array } }).wasm;
  if (wasm._malloc.guarded) return;
  // The module's _malloc starts as a stub that replaces itself with the export on first call.
  const malloc = wasm.asm?.malloc ?? wasm._malloc;
  const guarded = Object.assign((n: number) => {
    const p = malloc(n);
    if (p === 0 && n > 0)
      throw new Error(`wasm heap out of memory: ${(n / 2 ** 20).toFixed(1)} MB more did not fit (heap ${(wasm.HEAPU8.length / 2 ** 30).toFixed(2)} GiB, limit 4 GiB); use a smaller --micro_batch_size, fewer or shorter rollouts, or a GPU backend`);
    return p;
  }, { guarded: true as const });
  wasm._malloc = guarded;
}

let sharedIdentity = false;
/** tfjs-backend-wasm's Identity copies its input. The engine runs it for every tensor a gradient tape
 *  saves (tf.clone), so a small-config training step made 448 copies (45 ms, and the tape's memory
 *  twice over). Data on the heap is never written after its kernel made it, so the clone shares it
 *  with a reference count, as the wasm Reshape and the cpu backend's Identity do. */
function registerSharedIdentity(): void {
  const original = tf.getKernel("Identity", "wasm");
  if (sharedIdentity || !original) return;
  sharedIdentity = true;
  tf.unregisterKernel("Identity", "wasm");
  tf.registerKernel({
    ...original,
    kernelFunc: (args) => {
      const x = (args.inputs as { x: tf.TensorInfo }).x;
      if (x.dtype === "string") return original.kernelFunc(args);
      (args.backend as unknown as { incRef(id: tf.DataId): void }).incRef(x.dataId);
      return { dataId: x.dataId, shape: x.shape, dtype: x.dtype };
    },
  });
}

let fastSlice = false;
/** tfjs-backend-wasm's Slice (and SplitV, which calls it) reads its input with readSync, which copies
 *  the whole input out of the heap on every call: slicing 16 pieces off an 8 MB tensor copied 128 MB
 *  (~140 ms). These kernels read the input through a heap view instead (taken after the output is
 *  allocated, since allocation can move the heap). String tensors still go to the original kernels. */
function registerFastSlice(): void {
  if (fastSlice) return;
  const slice = tf.getKernel("Slice", "wasm"), split = tf.getKernel("SplitV", "wasm");
  if (!slice || !split) return;
  fastSlice = true;
  tf.unregisterKernel("Slice", "wasm");
  tf.registerKernel({
    ...slice,
    kernelFunc: (args) => {
      const x = (args.inputs as { x: tf.TensorInfo }).x;
      if (x.dtype === "string") return slice.kernelFunc(args);
      const { begin, size } = args.attrs as { begin: number | number[]; size: number | number[] };
      const [b0, s0] = tf.slice_util.parseSliceParams(x as tf.Tensor, begin, size);
      return sliceView(args.backend, x, b0, s0);
    },
  });
  tf.unregisterKernel("SplitV", "wasm");
  tf.registerKernel({
    ...split,
    kernelFunc: (args) => {
      const x = (args.inputs as { x: tf.TensorInfo }).x;
      if (x.dtype === "string") return split.kernelFunc(args);
      const { numOrSizeSplits, axis } = args.attrs as { numOrSizeSplits: number | number[]; axis: number };
      const ax = tf.util.parseAxisParam(axis, x.shape)[0];
      const sizes = tf.backend_util.prepareSplitSize(x as tf.Tensor, numOrSizeSplits, ax);
      const begin = new Array(x.shape.length).fill(0);
      return sizes.map((n) => {
        const size = x.shape.slice();
        size[ax] = n;
        const out = sliceView(args.backend, x, begin.slice(), size);
        begin[ax] += n;
        return out;
      });
    },
  });
}

function sliceView(backend: unknown, x: tf.TensorInfo, b0: number[], s0: number[]): tf.TensorInfo {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const be = backend as any;
  const out = be.makeOutput(s0, x.dtype) as tf.TensorInfo;
  const rank = x.shape.length;
  if (s0.reduce((p, d) => p * d, 1) === 0) return out;
  if (rank === 0) {
    (be.typedArrayFromHeap(out) as Float32Array).set(be.typedArrayFromHeap(x) as Float32Array);
    return out;
  }
  const xv = be.typedArrayFromHeap(x) as Float32Array;
  const ov = be.typedArrayFromHeap(out) as Float32Array;
  const strides = [...tf.util.computeStrides(x.shape), 1];
  if (tf.slice_util.isSliceContinous(x.shape, b0, s0)) {
    // one block (e.g. rows off the leading axis): a single copy
    const off = tf.slice_util.computeFlatOffset(b0, strides);
    ov.set(xv.subarray(off, off + ov.length));
    return out;
  }
  // Axes after the last partial one (a) are whole, so each run over axes a.. is contiguous.
  let a = rank - 1;
  while (a > 0 && s0[a] === x.shape[a]) a--;
  const run = s0.slice(a).reduce((p, d) => p * d, 1);
  if (a > 0 && x.dtype !== "complex64" && s0.slice(0, a).every((d, i) => d === x.shape[i])) {
    // whole leading axes (a split's pieces, RoPE's halves): rows of `run` at one stride, one strided
    // memory.copy in the heap module instead of a typed-array view and a set() per row
    const e = tf.util.bytesPerElement(x.dtype), offset = (t: tf.TensorInfo) => be.dataIdMap.get(t.dataId).memoryOffset as number;
    heapKernels(be).copyRows(offset(out), e * run, offset(x) + e * b0[a] * strides[a], e * strides[a - 1], e * run, ov.length / run);
    return out;
  }
  // runs over axes a.., looping over the leading indices
  const lead = s0.slice(0, a), idx = new Array(a).fill(0);
  const rows = lead.reduce((p, d) => p * d, 1);
  for (let r = 0, o = 0; r < rows; r++, o += run) {
    let off = b0[a] * strides[a];
    for (let d = 0; d < a; d++) off += (b0[d] + idx[d]) * strides[d];
    ov.set(xv.subarray(off, off + run), o);
    for (let d = a - 1; d >= 0; d--) {
      if (++idx[d] < lead[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}
