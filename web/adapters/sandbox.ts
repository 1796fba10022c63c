/** The page's WorkerSandbox (src/agents/sandbox.ts in Node): untrusted input evaluated in a Web
 *  Worker, one request at a time, with the same time limits. A request that overruns terminates the
 *  worker and the next one starts a fresh worker. The worker speaks the same protocol on its global
 *  scope instead of a MessagePort: post `{ ready: true }` once loaded, answer `{ id, input }` with
 *  `{ id, output }` (web/calculator-worker.ts). What a browser does not offer: a heap cap per worker
 *  (resourceLimits are Node's); a runaway allocation is stopped by the time limit instead. */
import type { SandboxOptions, SandboxResult } from "../../src/agents/sandbox.ts";

export type { SandboxOptions, SandboxResult };

export class WorkerSandbox<In, Out> {
  private worker: Worker | null = null;
  private ready: Promise<Worker> | null = null;
  private chain: Promise<unknown> = Promise.resolve();
  private closed = false;
  private nextId = 0;
  /** Workers started so far (1 + restarts after timeouts and crashes). */
  started = 0;

  constructor(
    private readonly script: URL,
    private readonly opts: SandboxOptions,
  ) {}

  /** Always resolves; failures come back as { ok: false }. Requests run in order. */
  run(input: In): Promise<SandboxResult<Out>> {
    const r = this.chain.then(() => this.runOne(input));
    this.chain = r;
    return r;
  }

  async shutdown(): Promise<void> {
    this.closed = true;
    this.discard();
  }

  private async runOne(input: In): Promise<SandboxResult<Out>> {
    if (this.closed) return { ok: false, reason: "shutdown", message: "sandbox is shut down" };
    let w: Worker;
    try {
      w = await this.start();
    } catch (e) {
      return { ok: false, reason: "crashed", message: `worker did not start: ${(e as Error).message}` };
    }
    const id = this.nextId++;
    return new Promise((resolve) => {
      const done = (r: SandboxResult<Out>, discard: boolean) => {
        clearTimeout(timer);
        w.removeEventListener("message", onMessage);
        w.removeEventListener("error", onError);
        if (discard) this.discard();
        resolve(r);
      };
      const onMessage = (e: MessageEvent) => {
        if (e.data?.id === id) done({ ok: true, value: e.data.output as Out }, false);
      };
      const onError = (e: ErrorEvent) =>
        done({ ok: false, reason: "crashed", message: (e.message || "worker failed").slice(0, 120) }, true);
      const timer = setTimeout(
        () => done({ ok: false, reason: "timeout", message: `took longer than ${this.opts.timeoutMs} ms` }, true),
        this.opts.timeoutMs,
      );
      w.addEventListener("message", onMessage);
      w.addEventListener("error", onError);
      w.postMessage({ id, input });
    });
  }

  private start(): Promise<Worker> {
    if (this.ready) return this.ready;
    const w = new Worker(this.script, { type: "module" });
    this.worker = w;
    this.started++;
    this.ready = new Promise<Worker>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.discard();
        reject(new Error(`not ready after ${this.opts.startupTimeoutMs} ms`));
      }, this.opts.startupTimeoutMs);
      w.addEventListener("message", (e) => e.data?.ready && (clearTimeout(timer), resolve(w)), { once: true });
      w.addEventListener("error", (e) => (clearTimeout(timer), this.discard(), reject(new Error(e.message || "worker failed to load"))), {
        once: true,
      });
    });
    this.ready.catch(() => {});
    return this.ready;
  }

  private discard(): void {
    this.worker?.terminate();
    this.worker = null;
    this.ready = null;
  }
}
