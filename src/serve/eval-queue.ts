/** The grading server's evaluations, one at a time in arrival order: a job waits behind the running
 *  one and those already waiting, at most `maxWaiting` of them; past that a 429 with a retry hint
 *  (the mean of the last ten jobs' seconds times the jobs ahead). */
import { HttpError } from "./errors.ts";

export class EvalQueue {
  private tail: Promise<unknown> = Promise.resolve();
  running = 0;
  waiting = 0;
  private seconds: number[] = [];

  constructor(private maxWaiting: number) {}

  run<T>(job: () => Promise<T>): Promise<T> {
    // Jobs ahead of this one: the running one and those waiting; at most maxWaiting may wait.
    if (this.running + this.waiting > this.maxWaiting) {
      const retry = Math.max(1, Math.ceil(this.meanSeconds() * (this.waiting + this.running)));
      return Promise.reject(
        new HttpError(
          429,
          `evaluation queue is full (${this.running} running, ${this.waiting} waiting); retry in about ${retry} s`,
          { retry_after_seconds: retry },
          { "Retry-After": String(retry) },
        ),
      );
    }
    this.waiting++;
    const p = this.tail.then(async () => {
      this.waiting--;
      this.running = 1;
      const t0 = Date.now();
      try {
        return await job();
      } finally {
        this.running = 0;
        this.seconds = [...this.seconds.slice(-9), (Date.now() - t0) / 1000];
      }
    });
    this.tail = p.catch(() => undefined);
    return p;
  }

  private meanSeconds(): number {
    return this.seconds.length ? this.seconds.reduce((a, b) => a + b, 0) / this.seconds.length : 30;
  }
}
