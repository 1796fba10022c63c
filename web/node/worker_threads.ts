/** node:worker_threads for the page: src/kernels/wasm/heap.ts imports Worker for its helper threads,
 *  which start only on a shared heap with more than one thread; the page runs the wasm kernels on one
 *  (web/adapters/threads.ts says why), so none is ever made. The calculator's worker is a Web Worker
 *  (web/adapters/sandbox.ts). */
export class Worker {
  constructor() {
    throw new Error("worker_threads.Worker: the page runs the wasm kernels on one thread (web/adapters/threads.ts)");
  }
}
export const isMainThread = true;
export const workerData = undefined;
export default { Worker, isMainThread, workerData };
