/** tfjs-backend-wasm's threaded SIMD build started, where its workers can start (Node: threads.ts'
 *  worker shim; the page: the browser's Web Workers), with tfjs' own thread pool kept at one thread:
 *  the heap module's helper threads do the splitting (heap.ts). Shared by threads.ts and the page's
 *  adapter (web/adapters/threads.ts). */
import * as tf from "@tensorflow/tfjs";
import * as wasmBackend from "@tensorflow/tfjs-backend-wasm";

/** Start the threaded build as the wasm backend; null when it runs on a shared heap, else why not. */
export async function startThreadedBuild(timeoutMs: number): Promise<string | null> {
  tf.env().set("WASM_HAS_MULTITHREAD_SUPPORT", true);
  wasmBackend.setThreadsCount(1); // tfjs' own kernels on the calling thread
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    const ok = await Promise.race([
      tf.setBackend("wasm"),
      new Promise<"timeout">((resolve) => (timer = setTimeout(() => resolve("timeout"), timeoutMs))),
    ]);
    if (ok === "timeout") return `the threaded build did not start within ${timeoutMs / 1000} s`;
    if (!ok) return "the threaded build failed to initialise";
  } catch (err) {
    return `the threaded build failed to initialise (${(err as Error).message})`;
  } finally {
    clearTimeout(timer);
    tf.env().set("WASM_HAS_MULTITHREAD_SUPPORT", false); // a later wasm start (the fallback) is single-threaded
  }
  const wasm = (tf.backend() as unknown as { wasm?: { wasmMemory?: { buffer: unknown } } }).wasm;
  if (!(wasm?.wasmMemory?.buffer instanceof SharedArrayBuffer)) return "the threaded build started without a shared heap";
  return null;
}
