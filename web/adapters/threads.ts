/** The page's wasm start (src/kernels/wasm/threads.ts in Node): tfjs-backend-wasm's builds as a
 *  browser runs them. For 2 or more threads, the threaded SIMD build on a shared heap, on which the
 *  heap module's helper threads (src/kernels/wasm/heap.ts, started through web/node/worker_threads.ts)
 *  work beside the caller; tfjs' own pool is kept at one thread, as in Node. That needs a
 *  cross-origin-isolated page (SharedArrayBuffer) and a caller that may block on Atomics.wait: a
 *  worker (web/worker.ts), not a page's main thread. Elsewhere: one thread. Results are the same at
 *  any thread count (the matrix kernel sums every output in the same order however it is split). */
import * as tf from "@tensorflow/tfjs";
import * as wasmBackend from "@tensorflow/tfjs-backend-wasm";
import { startThreadedBuild } from "../../src/kernels/wasm/threaded-build.ts";

export const MAX_WASM_THREADS = 8;
export type ThreadsSpec = number | "auto";

/** "auto" → the cores the browser reports (at most 8); a number is checked. */
export function resolveThreads(spec: ThreadsSpec | string): number {
  if (spec === "auto") return Math.max(1, Math.min(MAX_WASM_THREADS, navigator.hardwareConcurrency || 1));
  const n = typeof spec === "number" ? spec : /^\d+$/.test(spec.trim()) ? Number(spec) : NaN;
  if (!(Number.isInteger(n) && n >= 1 && n <= MAX_WASM_THREADS))
    throw new Error(`threads ${JSON.stringify(spec)}: expected auto or a whole number from 1 to ${MAX_WASM_THREADS}`);
  return n;
}

/** Why the threaded build cannot run here, or null. */
function threadedBlocker(): string | null {
  if (!(globalThis as { crossOriginIsolated?: boolean }).crossOriginIsolated)
    return "the page is not cross-origin isolated (no SharedArrayBuffer)";
  if (typeof (globalThis as { document?: unknown }).document !== "undefined")
    return "a page's main thread may not block on Atomics.wait (the kernels run in a worker for that)";
  return null;
}

let threads = 1;

/** Start the threaded build for n ≥ 2 threads; null when it runs on a shared heap, else why not. */
export async function startThreadedWasm(n: number): Promise<string | null> {
  const why = threadedBlocker();
  if (why) return why;
  const failed = await startThreadedBuild(60_000);
  if (failed) return failed;
  threads = n;
  return null;
}

/** Set the wasm backend with `spec` threads. Where the threaded build cannot start, "auto" says so in
 *  the log and runs one thread; an explicit count is an error. False when wasm fails outright. */
export async function startWasm(spec: ThreadsSpec): Promise<boolean> {
  const n = resolveThreads(spec);
  if (n > 1) {
    const why = await startThreadedWasm(n);
    if (!why) return true;
    if (spec !== "auto") throw new Error(`threaded wasm with ${n} threads cannot start: ${why}; threads=1 runs one`);
    console.log(`note: threaded wasm cannot start (${why}); using one thread`);
  }
  tf.env().set("WASM_HAS_MULTITHREAD_SUPPORT", false);
  wasmBackend.setThreadsCount(1);
  return tf.setBackend("wasm").catch(() => false);
}

/** Threads the wasm backend runs (1 on another backend). */
export function wasmThreads(): number {
  return tf.getBackend() === "wasm" ? threads : 1;
}
