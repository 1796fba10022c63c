/** node:worker_threads for the page: a worker started from source text (`{ eval: true }`, as the wasm
 *  heap module starts its helper threads, src/kernels/wasm/heap.ts) runs as a Web Worker from a blob:
 *  URL. Its `workerData` arrives as the first message (a shared WebAssembly.Memory and
 *  SharedArrayBuffers pass by reference in a cross-origin-isolated page), and
 *  `require("node:worker_threads")` inside it returns that. */
type Listener = (arg: unknown) => void;

export class Worker {
  private readonly web: globalThis.Worker;
  constructor(code: string, opts: { eval?: boolean; workerData?: unknown }) {
    if (!opts?.eval) throw new Error("worker_threads.Worker in the page: only workers from source text ({ eval: true }) are supported");
    const src =
      `self.onmessage = (e) => { self.onmessage = null; const __workerData = e.data;\n` +
      `const require = (n) => { if (n === "node:worker_threads" || n === "worker_threads")` +
      ` return { workerData: __workerData, isMainThread: false };` +
      ` throw new Error("require(" + n + ") in a page worker"); };\n${code}\n};`;
    const url = URL.createObjectURL(new Blob([src], { type: "text/javascript" }));
    this.web = new globalThis.Worker(url);
    URL.revokeObjectURL(url);
    this.web.postMessage(opts.workerData);
  }
  unref(): void {} // a page has no process to keep alive
  ref(): void {}
  on(event: string, f: Listener): this {
    if (event === "error") this.web.addEventListener("error", (e) => f(new Error(e.message || "worker failed")));
    else if (event === "message") this.web.addEventListener("message", (e) => f(e.data));
    else throw new Error(`worker_threads.Worker.on("${event}"): not supported in the page`);
    return this;
  }
  async terminate(): Promise<number> {
    this.web.terminate();
    return 0;
  }
}
export const isMainThread = typeof (globalThis as { document?: unknown }).document !== "undefined";
export const workerData = undefined;
export default { Worker, isMainThread, workerData };
