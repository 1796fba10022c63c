/** A warm worker thread for work on untrusted input, with a hard time limit and a small heap.
 *  Requests are queued and run one at a time (many concurrent callers from a batched rollout are
 *  fine); a request that overruns is not awaited — the worker is terminated and the next request
 *  starts a fresh one. An out-of-memory abort kills only the worker (V8 cannot recover from it
 *  in-process, which is why this runs in a thread at all). The worker never keeps the process
 *  alive while idle. Leaves out pooling: one worker answers in well under a millisecond.
 *
 *  Worker protocol: post `{ ready: true }` once loaded; answer each `{ id, input }` with `{ id, output }`. */
import { Worker, type ResourceLimits } from "node:worker_threads";

export interface SandboxOptions {
  /** Per request, counted from when the worker receives it (queueing and startup not included). */
  timeoutMs: number;
  /** Loading the worker (tsx + its imports) on a busy 2-core machine can take seconds. */
  startupTimeoutMs: number;
  resourceLimits: ResourceLimits;
}

export type SandboxResult<Out> =
  | { ok: true; value: Out }
  | { ok: false; reason: "timeout" | "crashed" | "shutdown"; message: string };

interface Job<In, Out> {
  input: In;
  resolve: (r: SandboxResult<Out>) => void;
}

export class WorkerSandbox<In, Out> {
  private worker: Worker | null = null;
  private ready: Promise<Worker> | null = null;
  private readonly queue: Job<In, Out>[] = [];
  private busy = false;
  private closed = false;
  private nextId = 0;
  /** Workers started so far (1 + restarts after timeouts and crashes). */
  started = 0;

  constructor(
    private readonly script: URL,
    private readonly opts: SandboxOptions,
  ) {}

  /** Always resolves; failures come back as { ok: false }. */
  run(input: In): Promise<SandboxResult<Out>> {
    return new Promise((resolve) => {
      this.queue.push({ input, resolve });
      this.pump();
    });
  }

  /** Stop the worker and fail queued requests. The sandbox cannot be used afterwards. */
  async shutdown(): Promise<void> {
    this.closed = true;
    for (const job of this.queue.splice(0)) job.resolve({ ok: false, reason: "shutdown", message: "sandbox is shut down" });
    const w = this.worker;
    this.worker = null;
    this.ready = null;
    if (w) await w.terminate();
  }

  private pump(): void {
    if (this.busy) return;
    const job = this.queue.shift();
    if (!job) {
      this.worker?.unref(); // idle: let the process exit
      return;
    }
    this.busy = true;
    this.runOne(job.input).then((r) => {
      this.busy = false;
      job.resolve(r);
      this.pump();
    });
  }

  private async runOne(input: In): Promise<SandboxResult<Out>> {
    if (this.closed) return { ok: false, reason: "shutdown", message: "sandbox is shut down" };
    let worker: Worker;
    try {
      worker = await this.start();
    } catch (e) {
      return { ok: false, reason: "crashed", message: `worker did not start: ${(e as Error).message}` };
    }
    worker.ref(); // a caller is waiting on this answer
    const id = this.nextId++;
    return new Promise((resolve) => {
      const done = (r: SandboxResult<Out>) => {
        clearTimeout(timer);
        worker.off("message", onMessage);
        worker.off("error", onError);
        worker.off("exit", onExit);
        resolve(r);
      };
      const onMessage = (m: { id?: number; output?: Out }) => {
        if (m?.id === id) done({ ok: true, value: m.output as Out });
      };
      const onError = (e: Error) => {
        done({ ok: false, reason: "crashed", message: errorText(e) });
        this.discard(worker);
      };
      const onExit = (code: number) => {
        done({ ok: false, reason: "crashed", message: `worker exited with code ${code}` });
        this.discard(worker);
      };
      const timer = setTimeout(() => {
        done({ ok: false, reason: "timeout", message: `took longer than ${this.opts.timeoutMs} ms` });
        this.discard(worker); // a runaway synchronous call is terminated, never awaited
      }, this.opts.timeoutMs);
      worker.on("message", onMessage);
      worker.on("error", onError);
      worker.on("exit", onExit);
      worker.postMessage({ id, input });
    });
  }

  private start(): Promise<Worker> {
    if (this.ready) return this.ready;
    // execArgv: [] so the parent's loader flags (tsx, vitest) are not inherited; the entry loads what it needs.
    const worker = new Worker(this.script, { execArgv: [], resourceLimits: this.opts.resourceLimits });
    this.started++;
    this.worker = worker;
    // Permanent listeners: an 'error' event without a listener would throw in the parent.
    worker.on("error", () => this.discard(worker));
    worker.on("exit", () => this.discard(worker));
    const ready = new Promise<Worker>((resolve, reject) => {
      const cleanup = () => {
        clearTimeout(timer);
        worker.off("message", onMessage);
        worker.off("error", onError);
        worker.off("exit", onExit);
      };
      const onMessage = (m: { ready?: boolean }) => {
        if (m?.ready) {
          cleanup();
          resolve(worker);
        }
      };
      const onError = (e: Error) => {
        cleanup();
        reject(new Error(errorText(e)));
      };
      const onExit = (code: number) => {
        cleanup();
        reject(new Error(`exited with code ${code} while starting`));
      };
      const timer = setTimeout(() => {
        cleanup();
        this.discard(worker);
        reject(new Error(`not ready after ${this.opts.startupTimeoutMs} ms`));
      }, this.opts.startupTimeoutMs);
      worker.on("message", onMessage);
      worker.on("error", onError);
      worker.on("exit", onExit);
    });
    this.ready = ready;
    ready.catch(() => {}); // the caller awaiting it sees the error; no unhandled rejection here
    return ready;
  }

  private discard(worker: Worker): void {
    if (this.worker === worker) {
      this.worker = null;
      this.ready = null;
    }
    worker.terminate().catch(() => {});
  }
}

function errorText(e: Error): string {
  const code = (e as Error & { code?: string }).code;
  if (code === "ERR_WORKER_OUT_OF_MEMORY") return "out of memory";
  return e.message.split("\n")[0].slice(0, 120);
}
