/** The page's wasm start (src/kernels/wasm/threads.ts in Node): tfjs-backend-wasm's own builds as a
 *  browser runs them. tfjs' thread pool is kept at one thread, as in Node; the heap module's helper
 *  threads (src/kernels/wasm/heap.ts) need a shared heap (the threaded build, so a cross-origin-isolated
 *  page) and a caller that may block on Atomics.wait, which a page's main thread may not: the page
 *  runs the wasm kernels on one thread. Results are bit-identical to any thread count in Node (the
 *  matrix kernel sums every output in the same order however it is split). */
import * as tf from "@tensorflow/tfjs";
import * as wasmBackend from "@tensorflow/tfjs-backend-wasm";

export const MAX_WASM_THREADS = 8;
export type ThreadsSpec = number | "auto";

/** The page runs one thread whatever is asked ("auto" included); a bad count is still an error. */
export function resolveThreads(spec: ThreadsSpec | string): number {
  if (spec === "auto") return 1;
  const n = typeof spec === "number" ? spec : /^\d+$/.test(spec.trim()) ? Number(spec) : NaN;
  if (!(Number.isInteger(n) && n >= 1 && n <= MAX_WASM_THREADS))
    throw new Error(`threads ${JSON.stringify(spec)}: expected auto or a whole number from 1 to ${MAX_WASM_THREADS}`);
  return 1;
}

export async function startThreadedWasm(): Promise<string | null> {
  return "the page runs the wasm kernels on its main thread, which may not block on Atomics.wait";
}

export async function startWasm(spec: ThreadsSpec): Promise<boolean> {
  resolveThreads(spec);
  tf.env().set("WASM_HAS_MULTITHREAD_SUPPORT", false);
  wasmBackend.setThreadsCount(1);
  return tf.setBackend("wasm").catch(() => false);
}

export function wasmThreads(): number {
  return 1;
}
