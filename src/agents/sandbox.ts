/** A warm worker thread for work on untrusted input, with a hard time limit and a small heap.
 *  Requests are queued and run one at a time (many concurrent callers from a batched rollout are
 *  fine); a request that overruns is not awaited — the worker is terminated and the next request
 *  starts a fresh one. An out-of-memory abort kills only the worker (V8 cannot recover from it
 *  in-process, which is why this runs in a thread at all). The worker never keeps the process
 *  alive while idle. Leaves out pooling: one worker answers in well under a millisecond.
 *
 *  Worker protocol, on the MessagePort passed as `workerData.port`: post `{ ready: true }` once loaded;
 *  answer each `{ id, input }` with `{ id, output }`. A dedicated port (not parentPort) lets the time
 *  limit check for an answer that already arrived: after the main thread was blocked (a long tfjs op),
 *  the timer can run before the queued answer is delivered, and without that check a fast answer would
 *  count as a timeout and cost a worker restart. */
import { MessageChannel, receiveMessageOnPort, Worker, type MessagePort, type ResourceLimits } from "node:worker_threads";

export interface SandboxOptions {
  /** Per request, counted from when the worker receives it (queueing and startup not included). */
  timeoutMs: number;
  /** Loading the worker (tsx + its imports) on a busy 2-core machine can take seconds. */
  startupTimeoutMs: number;
  resourceLimits: ResourceLimits;
}

export type SandboxResult<Out> = { ok: true; value: Out } | { ok: false; reason: "timeout" | "crashed" | "shutdown"; message: string };

interface Instance {
  worker: Worker;
  port: MessagePort; // our end of the channel the worker answers on
}

interface Job<In, Out> {
  input: In;
  resolve: (r: SandboxResult<Out>) => void;
}

export class WorkerSandbox<In, Out> {
  private current: Instance | null = null;
  private ready: Promise<Instance> | null = null;
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
    const cur = this.current;
    this.current = null;
    this.ready = null;
    if (cur) {
      cur.port.close();
      await cur.worker.terminate();
    }
  }

  private pump(): void {
    if (this.busy) return;
    const job = this.queue.shift();
    if (!job) {
      // Idle: let the process exit.
      this.current?.worker.unref();
      this.current?.port.unref();
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
    let inst: Instance;
    try {
      inst = await this.start();
    } catch (e) {
      return { ok: false, reason: "crashed", message: `worker did not start: ${(e as Error).message}` };
    }
    const { worker, port } = inst;
    worker.ref(); // a caller is waiting on this answer
    port.ref();
    const id = this.nextId++;
    return new Promise((resolve) => {
      const done = (r: SandboxResult<Out>) => {
        clearTimeout(timer);
        port.off("message", onMessage);
        worker.off("error", onError);
        worker.off("exit", onExit);
        resolve(r);
      };
      const onMessage = (m: { id?: number; output?: Out }) => {
        if (m?.id === id) done({ ok: true, value: m.output as Out });
      };
      const onError = (e: Error) => {
        done({ ok: false, reason: "crashed", message: errorText(e) });
        this.discard(inst);
      };
      const onExit = (code: number) => {
        done({ ok: false, reason: "crashed", message: `worker exited with code ${code}` });
        this.discard(inst);
      };
      const timer = setTimeout(() => {
        // The answer may be queued but not yet delivered (see the header): take it if it is there.
        for (let m = receiveMessageOnPort(port); m; m = receiveMessageOnPort(port)) {
          if ((m.message as { id?: number })?.id === id) return done({ ok: true, value: (m.message as { output: Out }).output });
        }
        done({ ok: false, reason: "timeout", message: `took longer than ${this.opts.timeoutMs} ms` });
        this.discard(inst); // a runaway synchronous call is terminated, never awaited
      }, this.opts.timeoutMs);
      port.on("message", onMessage);
      worker.on("error", onError);
      worker.on("exit", onExit);
      port.postMessage({ id, input });
    });
  }

  private start(): Promise<Instance> {
    if (this.ready) return this.ready;
    const { port1, port2 } = new MessageChannel();
    // execArgv: [] so the parent's loader flags (tsx, vitest) are not inherited; the entry loads what it needs.
    const worker = new Worker(this.script, {
      execArgv: [],
      resourceLimits: this.opts.resourceLimits,
      workerData: { port: port2 },
      transferList: [port2],
    });
    const inst: Instance = { worker, port: port1 };
    this.started++;
    this.current = inst;
    // Permanent listeners: an 'error' event without a listener would throw in the parent.
    worker.on("error", () => this.discard(inst));
    worker.on("exit", () => this.discard(inst));
    const ready = new Promise<Instance>((resolve, reject) => {
      const cleanup = () => {
        clearTimeout(timer);
        port1.off("message", onMessage);
        worker.off("error", onError);
        worker.off("exit", onExit);
      };
      const onMessage = (m: { ready?: boolean }) => {
        if (m?.ready) {
          cleanup();
          resolve(inst);
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
        this.discard(inst);
        reject(new Error(`not ready after ${this.opts.startupTimeoutMs} ms`));
      }, this.opts.startupTimeoutMs);
      port1.on("message", onMessage);
      worker.on("error", onError);
      worker.on("exit", onExit);
    });
    this.ready = ready;
    ready.catch(() => {}); // the caller awaiting it sees the error; no unhandled rejection here
    return ready;
  }

  private discard(inst: Instance): void {
    if (this.current === inst) {
      this.current = null;
      this.ready = null;
    }
    inst.port.close();
    inst.worker.terminate().catch(() => {});
  }
}

function errorText(e: Error): string {
  const code = (e as Error & { code?: string }).code;
  if (code === "ERR_WORKER_OUT_OF_MEMORY") return "out of memory";
  return e.message.split("\n")[0].slice(0, 120);
}
