/** Threaded wasm in Node: starts tfjs-backend-wasm's threaded-SIMD build with worker_threads standing
 *  in for the browser's Web Workers, for what that build brings: a heap on shared memory, on which
 *  the heap module's helper threads (kernels/wasm/heap.ts) work beside the main thread. tfjs' own
 *  thread pool is kept at one thread: its element-wise kernels are too small to repay a hand-off
 *  (XNNPACK's pool made each Add/Multiply of a decode step 5× slower at 2 threads, and its threads
 *  spinning after a kernel took the core the matrix helpers needed: small config, 2 threads, decode
 *  1,148–1,366 tokens/s with tfjs' pool at 2, 1,557–1,882 at 1; forward the same within noise).
 *  tfjs only enables that build in browsers, so this file supplies what its Emscripten glue expects:
 *  - `globalThis.Worker`: pthread workers are started from a `blob:` URL, which worker_threads rejects;
 *    the package's own worker script is run instead (`eval`), and the `load` message is pointed at the
 *    threaded glue file on disk. The glue assigns `globalThis.Worker` at start-up: the stand-in stays.
 *  - `ref()` is a no-op: Emscripten refs a worker while its pthread runs, and pool threads never end,
 *    so the process could never exit. The threads only wait on atomics; the main thread owns the work.
 *  The glue pre-spawns 8 workers and keeps them: the backend is started once per process
 *  (src/kernels/backend.ts holds that promise). Results are bit-identical to 1 thread (the matrix kernel sums
 *  every output in the same order however it is split). */
import * as tf from "@tensorflow/tfjs";
import { createRequire } from "node:module";
import os from "node:os";
import * as path from "node:path";
import { Worker as NodeWorker } from "node:worker_threads";
import { UsageError } from "../../util/errors.ts";
import { startThreadedBuild } from "./threaded-build.ts";

/** Most threads a run asks for (the matrix kernel splits products into at most this many parts). */
export const MAX_WASM_THREADS = 8;

export type ThreadsSpec = number | "auto";

/** "auto" → the cores this process may use (at most 8); a number is checked. */
export function resolveThreads(spec: ThreadsSpec | string): number {
  if (spec === "auto") return Math.max(1, Math.min(MAX_WASM_THREADS, os.availableParallelism()));
  const n = typeof spec === "number" ? spec : /^\d+$/.test(spec.trim()) ? Number(spec) : NaN;
  if (!(Number.isInteger(n) && n >= 1 && n <= MAX_WASM_THREADS))
    throw new Error(`threads ${JSON.stringify(spec)}: expected auto or a whole number from 1 to ${MAX_WASM_THREADS}`);
  return n;
}

const require = createRequire(import.meta.url);
const wasmOut = path.join(path.dirname(require.resolve("@tensorflow/tfjs-backend-wasm/package.json")), "wasm-out");
const threadedGlue = path.join(wasmOut, "tfjs-backend-wasm-threaded-simd.js");

let installed = false;
/** globalThis.Worker for the Emscripten glue (see the file header). Installed once. */
function installWorkerShim(): void {
  if (installed) return;
  const { wasmWorkerContents } = require(path.join(wasmOut, "tfjs-backend-wasm-threaded-simd.worker.js")) as { wasmWorkerContents: string };
  const workerCode = wasmWorkerContents.replace(/\n/g, "\\n"); // the escaping tfjs applies for its Blob
  class PthreadWorker extends NodeWorker {
    constructor(url: string | URL, opts?: object) {
      if (typeof url === "string" && url.startsWith("blob:")) super(workerCode, { eval: true });
      else super(url, opts);
    }
    override ref(): void {}
    override postMessage(msg: unknown, transfer?: Parameters<NodeWorker["postMessage"]>[1]): void {
      const m = msg as { cmd?: string; urlOrBlob?: unknown } | null;
      if (m && m.cmd === "load" && typeof m.urlOrBlob !== "string") msg = { ...m, urlOrBlob: threadedGlue };
      super.postMessage(msg, transfer);
    }
  }
  Object.defineProperty(globalThis, "Worker", { get: () => PthreadWorker, set: () => {}, configurable: true });
  installed = true;
}

/** Why the threaded build cannot start here, or null: shared wasm memory and worker_threads must
 *  both work (a worker is started and answers once). */
async function preflight(timeoutMs: number): Promise<string | null> {
  if (typeof SharedArrayBuffer !== "function") return "this runtime has no SharedArrayBuffer";
  try {
    const wasm = (globalThis as unknown as { WebAssembly: { Memory: new (d: object) => unknown } }).WebAssembly;
    new wasm.Memory({ initial: 1, maximum: 1, shared: true });
  } catch (err) {
    return `no shared WebAssembly memory (${(err as Error).message})`;
  }
  let w: NodeWorker;
  try {
    w = new NodeWorker("require('node:worker_threads').parentPort.postMessage(1)", { eval: true });
  } catch (err) {
    return `cannot start a worker thread (${(err as Error).message})`;
  }
  const answer = await new Promise<string | null>((resolve) => {
    const timer = setTimeout(() => resolve(`a worker thread did not answer within ${timeoutMs / 1000} s`), timeoutMs);
    w.once("message", () => (clearTimeout(timer), resolve(null)));
    w.once("error", (err) => (clearTimeout(timer), resolve(`a worker thread failed (${err.message})`)));
  });
  await w.terminate();
  return answer;
}

let threads = 1;

/** Start the wasm backend on the threaded build for n ≥ 2 threads. Resolves to null when it runs on a
 *  shared heap, or to the reason it could not start (the caller falls back or reports it). */
export async function startThreadedWasm(n: number, timeoutMs = 60_000): Promise<string | null> {
  const why = await preflight(Math.min(timeoutMs, 20_000));
  if (why) return why;
  installWorkerShim();
  const failed = await startThreadedBuild(timeoutMs);
  if (failed) return failed;
  threads = n;
  return null;
}

/** Set the wasm backend with `spec` threads: the single-threaded SIMD build for 1, the threaded build
 *  otherwise. When the threaded build cannot start, "auto" says so in one line on stderr and falls
 *  back to the single-threaded build; an explicit count is a usage error. False when wasm fails outright. */
export async function startWasm(spec: ThreadsSpec): Promise<boolean> {
  const n = resolveThreads(spec);
  if (n > 1) {
    const why = await startThreadedWasm(n);
    if (!why) return true;
    const msg = `threaded wasm with ${n} threads cannot start: ${why}`;
    if (spec !== "auto") throw new UsageError(`${msg}; --threads 1 uses the single-threaded build`);
    process.stderr.write(`warning: ${msg}; using the single-threaded build\n`);
  }
  return tf.setBackend("wasm").catch(() => false);
}

/** Threads the wasm backend runs: the main thread and the matrix kernel's helpers (1 on the
 *  single-threaded build or another backend). */
export function wasmThreads(): number {
  return tf.getBackend() === "wasm" ? threads : 1;
}
