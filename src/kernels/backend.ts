/** Picks the tfjs backend once per process: tfjs-node-gpu → webgpu on a hardware adapter → tfjs-node →
 *  wasm → cpu, or the one asked for. The native bindings are optional packages (not dependencies), so
 *  they are imported by a variable name and a failed import just moves on; webgpu (Dawn) is a
 *  dependency and starts in kernels/webgpu/device.ts. A backend asked for by name that cannot start is a
 *  usage error (one line, exit 2); `auto` moves on to the next. On wasm it puts the project's own
 *  kernels in place (registerWasmExtras) and runs on `threads` threads (default: every core this
 *  process may use; see wasm/threads.ts). The run layer calls initBackend; model code never does.
 *
 *  kernels/ is the floor of the project: it imports nothing above util/, except webgpu/decode/ (the
 *  compiled decoder reads the model's weights and draws with rollout/'s sampler). Its files:
 *  - backends: backend.ts, profile.ts (what model code may assume of the current one), wasm/threads.ts,
 *    webgpu/device.ts (Dawn; the WebGPU families register themselves in webgpu/families.ts);
 *  - kernels.ts: how a kernel is registered, and how a heap kernel is added;
 *  - the op files, one family each with its gradient: rmsnorm.ts, rope-swiglu.ts, heads.ts, softmax.ts,
 *    logprob.ts, draw.ts, dequant.ts, gather-rows.ts, lora-linear.ts, block-diag.ts, slot-write.ts,
 *    adamw.ts; matmul.ts (products, transposes as flags) and checkpoint.ts (activation checkpointing);
 *  - wasm/: tfjs-backend-wasm's kernels replaced (gemm.ts, concat.ts, gather.ts, slices.ts,
 *    elementwise.ts, draw.ts) and the heap module they run on (heap.ts: the module on tfjs' heap, its
 *    helper threads running heap-jobs.ts; heap-build.ts: which SIMD build; heap-ops.ts: the op files' kernels; heap-code.ts assembles
 *    the module from the heap-*-code.ts files through asm.ts);
 *  - webgpu/: the WGSL programs of each family (rows.ts, heads.ts, shared-heads.ts, vocab.ts, lora.ts,
 *    adamw.ts, gather-rows.ts, dequant.ts) on program.ts' scaffolding, uniforms.ts (a submit's uniforms
 *    in one buffer), and decode/ (the compiled decoder's programs).
 *  Leaves out: WebGL (this is a Node trainer). */
import * as tf from "@tensorflow/tfjs";
import "@tensorflow/tfjs-backend-wasm";
import { UsageError } from "../util/errors.ts";
import { registerWebgpu, takeWebgpuLimitNote } from "./webgpu/device.ts";
import { registerWasmConcat } from "./wasm/concat.ts";
import { useHeapDequantize } from "./dequant.ts";
import { registerWasmDraw } from "./wasm/draw.ts";
import { heapDequantize } from "./wasm/heap-ops.ts";
import { registerWasmElementwise } from "./wasm/elementwise.ts";
import { registerWasmGather } from "./wasm/gather.ts";
import { registerWasmGemm } from "./wasm/gemm.ts";
import { registerFastSlice, registerSegmentSum, registerSharedIdentity } from "./wasm/slices.ts";
import { resolveThreads, startWasm, wasmThreads, type ThreadsSpec } from "./wasm/threads.ts";

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
      throw new UsageError(
        "backend tensorflow needs @tensorflow/tfjs-node or @tensorflow/tfjs-node-gpu installed (npm install @tensorflow/tfjs-node)",
      );
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
  const note = b === "webgpu" ? takeWebgpuLimitNote() : null;
  if (note) process.stderr.write(note + "\n");
  return b;
}

/** The project's kernels in place of (or beside) tfjs-backend-wasm's own. */
export function registerWasmExtras(): void {
  registerFastSlice();
  registerSharedIdentity();
  registerWasmGemm();
  registerWasmConcat();
  registerWasmElementwise();
  registerWasmGather();
  registerSegmentSum();
  registerWasmDraw();
  useHeapDequantize(heapDequantize);
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
  const guarded = Object.assign(
    (n: number) => {
      const p = malloc(n);
      if (p === 0 && n > 0)
        throw new Error(
          `wasm heap out of memory: ${(n / 2 ** 20).toFixed(1)} MB more did not fit (heap ` +
            `${(wasm.HEAPU8.length / 2 ** 30).toFixed(2)} GiB, limit 4 GiB); use a smaller --micro_batch_size, ` +
            `fewer or shorter rollouts, or a GPU backend`,
        );
      return p;
    },
    { guarded: true as const },
  );
  wasm._malloc = guarded;
}
