/** The grading logic behind the HTTP routes: one evaluation at a time (a FIFO queue, 429 with a retry
 *  hint when it is full), results cached on disk by the weights' sizes and modification times, the
 *  baseline (the scenario's base model under the same protocol) computed once, improvements paired
 *  over the same questions, /submit history with the best score, and the time budget. The running
 *  evaluation is abandoned at its next batch when the server closes; nothing is written for it.
 *  The queue is eval-queue.ts; the cache, baseline and history rules AutoRL-Bench's clients rely on
 *  stay together here: they are one state machine, and split, each half would need the other's
 *  invariants. */
import { createHash } from "node:crypto";
import { resolveModelDir } from "../model/model-dir.ts";
import { pairedImprovement } from "../report/eval-table.ts";
import { evaluateModel } from "../run/eval-run.ts";
import type { EvalResult } from "../run/evaluate.ts";
import { EvalQueue } from "./eval-queue.ts";
import { HttpError } from "./errors.ts";
import { describeProtocol, localModelDir, type Scenario } from "./scenarios.ts";
import { GradingStore, type BaselineRecord, type RunMeta, type StoredEvaluation, type SubmissionEntry } from "./store.ts";
import { folderFingerprint, inspectModelFolder, resolveInWorkspace, type ModelFolder } from "./workspace.ts";

export interface GraderOptions {
  workspace: string; // real path
  stateDir: string;
  scenarios: Scenario[];
  maxQueue: number; // evaluations waiting behind the running one before 429
  maxModelBytes: number;
  timeBudget: number | null; // seconds from the first start; null: none
  log: (line: string) => void;
}

const SHUTDOWN = () => new HttpError(503, "the server is shutting down: evaluation abandoned; nothing was recorded");

/** The unit of every score, accuracy and rate an evaluation answers, by field path: AutoRL-Bench's
 *  fields (score, baseline, improvement, details.accuracy) are percent, as its evaluators give them;
 *  the fields this server adds beside them are fractions (0-1). */
export const GRADE_UNITS = {
  score: "percent",
  score_ci: "percent",
  baseline_score: "percent",
  baseline: "percent",
  improvement: "percentage points",
  improvement_ci: "percentage points",
  "details.accuracy": "percent",
  accuracy: "fraction",
  "details.lenient_accuracy": "fraction",
  "details.pass_at_k": "fraction",
  "details.format_valid": "fraction",
  "details.tool_error_rate": "fraction",
  "details.truncated_rate": "fraction",
} as const;

export class Grader {
  readonly store: GradingStore;
  private queue: EvalQueue;
  private inflight = new Map<string, Promise<StoredEvaluation>>();
  private baselines = new Map<string, Promise<StoredEvaluation>>();
  private baselineErrors = new Map<string, string>();
  private baselineReady = new Map<string, StoredEvaluation>();
  private unavailable = new Set<string>(); // scenarios listed by default whose model or data are not on this machine
  private historyTail: Promise<unknown> = Promise.resolve();
  private closing = false;
  counters = { evaluations_run: 0, cache_hits: 0 };

  private constructor(readonly o: GraderOptions) {
    this.store = new GradingStore(o.stateDir, o.workspace);
    this.queue = new EvalQueue(o.maxQueue);
  }

  /** Reads the run's clock (AutoRL-Bench's harness writes `<workspace>/run_meta.json` before the
   *  server starts: it is read and kept; only fields it lacks are filled — the start time, and the
   *  budget from --time_budget) and starts each scenario's baseline. */
  static async open(o: GraderOptions): Promise<Grader> {
    const g = new Grader(o);
    const meta = await g.store.readRunMeta();
    const fill: RunMeta = {};
    if (meta === null)
      Object.assign(fill, { start_time: Math.floor(Date.now() / 1000), timeout_s: o.timeBudget, last_submit_time: null, end_time: null });
    else {
      if (!Number.isFinite(meta.start_time)) fill.start_time = Math.floor(Date.now() / 1000);
      if ((meta.timeout_s === undefined || meta.timeout_s === null) && o.timeBudget !== null) fill.timeout_s = o.timeBudget;
      else if (o.timeBudget !== null && meta.timeout_s !== o.timeBudget)
        o.log(`--time_budget ${o.timeBudget} ignored: ${g.store.runMetaPath()} already sets timeout_s ${JSON.stringify(meta.timeout_s)}`);
    }
    if (Object.keys(fill).length > 0) await g.store.updateRunMeta(fill);
    for (const s of o.scenarios) g.baseline(s).catch(() => undefined); // failures are kept and shown
    return g;
  }

  scenario(id: unknown): Scenario {
    if (id === undefined) return this.o.scenarios[0];
    const s = this.o.scenarios.find((x) => x.id === id);
    if (!s)
      throw new HttpError(404, `unknown scenario ${JSON.stringify(id)}; this server has ${this.o.scenarios.map((x) => x.id).join(", ")}`, {
        scenarios: this.o.scenarios.map((x) => x.id),
      });
    return s;
  }

  get scenarios(): Scenario[] {
    return this.o.scenarios;
  }

  queueState() {
    return { running: this.queue.running, waiting: this.queue.waiting, max_waiting: this.o.maxQueue };
  }

  // ------------------------------------------------------------------ evaluations

  private key(s: Scenario, model: unknown): string {
    return createHash("sha256")
      .update(JSON.stringify({ scenario: s.id, protocol: s.protocol, model }))
      .digest("hex")
      .slice(0, 24);
  }

  /** The cached evaluation for `key`, or one run in the queue (shared by concurrent identical requests). */
  private async evaluation(
    s: Scenario,
    key: string,
    model: StoredEvaluation["model"],
    fail: (err: Error) => HttpError,
    stillSame?: () => Promise<boolean>,
  ): Promise<{ ev: StoredEvaluation; cached: boolean }> {
    const hit = await this.store.readEvaluation(key);
    if (hit) {
      this.counters.cache_hits++;
      return { ev: hit, cached: true };
    }
    let p = this.inflight.get(key);
    if (!p) {
      p = this.queue.run(async () => {
        if (this.closing) throw SHUTDOWN();
        const questions = await s.questions().catch((err: Error) => {
          throw new HttpError(503, `scenario ${s.id}: its questions cannot be loaded: ${err.message.split("\n")[0]}`);
        });
        this.o.log(`evaluating ${model.path} on ${s.id} (${questions.length} questions)`);
        let result: EvalResult;
        try {
          result = await evaluateModel({ name: key, modelPath: model.path, quantize: s.protocol.quantize }, questions, s.protocol, () => {
            if (this.closing) throw SHUTDOWN();
          });
        } catch (err) {
          if (err instanceof HttpError) throw err;
          throw fail(err as Error);
        }
        this.counters.evaluations_run++;
        const ev: StoredEvaluation = {
          key,
          scenario_id: s.id,
          model,
          protocol: describeProtocol(s, questions.length),
          computed_at: new Date().toISOString(),
          result,
        };
        // Weights rewritten while they were evaluated: answer, but do not cache under the old key.
        if (!stillSame || (await stillSame())) await this.store.writeEvaluation(ev);
        this.o.log(`${model.path} on ${s.id}: strict ${result.strict.value.toFixed(3)} (n ${result.n}, ${result.seconds.toFixed(1)} s)`);
        return ev;
      });
      this.inflight.set(key, p);
      p.then(
        () => this.inflight.delete(key),
        () => this.inflight.delete(key),
      );
    }
    return { ev: await p, cached: false };
  }

  /** The base model's evaluation; computed once per protocol and weights, then read from disk. */
  baseline(s: Scenario): Promise<StoredEvaluation> {
    let p = this.baselines.get(s.id);
    if (!p) {
      p = (async () => {
        const missing = s.explicit ? null : await s.missing();
        if (missing !== null) {
          this.unavailable.add(s.id);
          throw new HttpError(
            503,
            `scenario ${s.id} is unavailable on this server: ${missing}; start it with --scenarios ${s.id} to fetch what is missing`,
          );
        }
        let dir: string;
        try {
          dir = await resolveModelDir(s.baseModel);
        } catch (err) {
          throw new HttpError(503, `scenario ${s.id}: its base model cannot be opened: ${(err as Error).message.split("\n")[0]}`);
        }
        const key = this.key(s, { baseline: s.baseModel, fingerprint: await folderFingerprint(dir) });
        const fail = (err: Error) =>
          new HttpError(503, `scenario ${s.id}: the baseline evaluation of ${s.baseModel} failed: ${err.message.split("\n")[0]}`);
        const { ev } = await this.evaluation(s, key, { path: s.baseModel, kind: "model", base: null }, fail);
        const old = await this.store.readBaseline(s.id);
        if (old?.computed?.key !== key) {
          await this.store.writeBaseline({
            scenario_id: s.id,
            model: s.baseModel,
            set: old?.set ?? null,
            computed: {
              key,
              score: pct(ev.result.strict.value),
              accuracy: ev.result.strict.value,
              n: ev.result.n,
              k: ev.result.k,
              samples_path: this.store.samplesPath(key),
              protocol: ev.protocol,
              computed_at: ev.computed_at,
            },
          });
        }
        this.baselineErrors.delete(s.id);
        this.baselineReady.set(s.id, ev);
        return ev;
      })();
      this.baselines.set(s.id, p);
      p.catch((err: Error) => {
        if (!this.unavailable.has(s.id)) this.baselines.delete(s.id); // tried again on the next request that needs it
        this.baselineErrors.set(s.id, err.message);
        if (!this.closing) this.o.log(`baseline of ${s.id} ${this.unavailable.has(s.id) ? "unavailable" : "failed"}: ${err.message}`);
      });
    }
    return p;
  }

  /** What GET /scenarios/{id} shows of the baseline (percent), without waiting for it. */
  async baselineInfo(s: Scenario): Promise<{
    score: number | null;
    status: "ready" | "computing" | "failed" | "unavailable";
    record: BaselineRecord | null;
    error?: string;
  }> {
    const record = await this.store.readBaseline(s.id);
    const ready = this.baselineReady.get(s.id);
    const error = ready ? undefined : this.baselineErrors.get(s.id);
    const status = ready ? "ready" : this.unavailable.has(s.id) ? "unavailable" : error ? "failed" : "computing";
    return { score: record?.set?.score ?? (ready ? pct(ready.result.strict.value) : null), status, record, ...(error ? { error } : {}) };
  }

  async setBaseline(s: Scenario, score: number): Promise<BaselineRecord> {
    const old = await this.store.readBaseline(s.id);
    const rec: BaselineRecord = {
      scenario_id: s.id,
      model: s.baseModel,
      computed: old?.computed ?? null,
      set: { score, set_at: new Date().toISOString() },
    };
    await this.store.writeBaseline(rec);
    return rec;
  }

  // ------------------------------------------------------------------ submissions

  /** run_meta.json as /time shows it (the real server's fields), with `now` and `remaining`. */
  async time(): Promise<Record<string, unknown>> {
    const meta = (await this.store.readRunMeta()) ?? {};
    const now = Math.floor(Date.now() / 1000);
    const { start_time: start, timeout_s: budget } = meta;
    const remaining =
      typeof start === "number" && typeof budget === "number" && Number.isFinite(start + budget)
        ? Math.max(0, budget - (now - start))
        : null;
    return { ...meta, now, remaining };
  }

  private async checkBudget(): Promise<void> {
    const t = await this.time();
    if (t.remaining === 0) throw new HttpError(403, `the time budget of ${t.timeout_s} s is spent; no more evaluations are accepted`);
  }

  private async inspect(s: Scenario, modelPath: string): Promise<ModelFolder> {
    const dir = await resolveInWorkspace(this.o.workspace, modelPath);
    return inspectModelFolder(dir, {
      workspace: this.o.workspace,
      scenarioBase: s.baseModel,
      scenarioBaseDir: await localModelDir(s.baseModel),
      maxBytes: this.o.maxModelBytes,
    });
  }

  /** Evaluate a submitted folder and score it against the baseline (both dialects' fields). Scores
   *  are percent, as AutoRL-Bench's evaluators give them; `accuracy` keeps the fraction; `units`
   *  names the unit of each (GRADE_UNITS). With no
   *  baseline (none set, and the base model's evaluation failed or is unavailable) `baseline_score`
   *  and `improvement` are null, as on the real server before /set_baseline. */
  async grade(s: Scenario, modelPath: string): Promise<{ fields: Record<string, unknown>; key: string }> {
    await this.checkBudget();
    const missing = s.explicit ? null : await s.missing();
    if (missing !== null) throw new HttpError(503, `scenario ${s.id} is unavailable on this server: ${missing}`);
    const t0 = Date.now();
    const folder = await this.inspect(s, modelPath);
    const key = this.key(s, { fingerprint: folder.fingerprint });
    const fail = (err: Error) =>
      new HttpError(422, `model_path ${JSON.stringify(modelPath)} could not be loaded or evaluated: ${err.message.split("\n")[0]}`);
    const stillSame = async () =>
      (await this.inspect(s, modelPath).then(
        (f) => f.fingerprint,
        () => null,
      )) === folder.fingerprint;
    const [{ ev, cached }, base] = await Promise.all([
      this.evaluation(s, key, { path: folder.dir, kind: folder.kind, base: folder.base }, fail, stillSame),
      this.baseline(s).catch(() => null),
    ]);
    const r = ev.result;
    const set = (await this.store.readBaseline(s.id))?.set ?? null;
    const score = pct(r.strict.value);
    const baselineScore = set ? set.score : base ? pct(base.result.strict.value) : null;
    const improvement = baselineScore === null ? null : round6(score - baselineScore);
    const paired = set || !base ? null : pairedImprovement(r, base.result);
    const fields = {
      scenario_id: s.id,
      model_path: modelPath,
      resolved_model_path: folder.dir,
      model_kind: folder.kind,
      ...(folder.base ? { adapter_base: folder.base } : {}),
      score,
      score_ci: { lo: pct(r.strict.lo), hi: pct(r.strict.hi), level: 0.95 },
      score_unit: "percent",
      units: GRADE_UNITS,
      accuracy: r.strict.value,
      metric: "accuracy", // strict: the \boxed{} answer (the protocol's answer_schema and scorer)
      n: r.n,
      k: r.k,
      baseline_score: baselineScore,
      baseline: baselineScore,
      baseline_source: set ? "set" : base ? "computed" : null,
      improvement,
      improvement_ci: paired ? { lo: pct(paired.lo), hi: pct(paired.hi), level: 0.95, paired_over: paired.n } : null,
      improvement_pct:
        baselineScore !== null && improvement !== null && baselineScore > 0
          ? `${improvement >= 0 ? "+" : ""}${((improvement / baselineScore) * 100).toFixed(1)}%`
          : "N/A",
      details: {
        accuracy: score,
        correct: r.strict.correct,
        total: r.strict.total,
        lenient_accuracy: r.lenient.value,
        pass_at_k: r.passAtK,
        format_valid: r.formatValid,
        tool_calls_per_rollout: r.toolCallsPerRollout,
        tool_error_rate: r.toolErrorRate,
        truncated_rate: r.truncatedRate,
        eval_seconds: r.seconds,
      },
      samples_path: this.store.samplesPath(key),
      cached,
      elapsed_seconds: (Date.now() - t0) / 1000,
    };
    return { fields, key };
  }

  /** /submit: grade, then record in the history (a resubmission of unchanged weights returns the
   *  earlier entry instead of a new one, as AutoRL-Bench does). A model that does not load or
   *  evaluate is answered and recorded as AutoRL-Bench records it: score 0 with an `error`, not
   *  cached, so it may be submitted again. */
  async submit(s: Scenario, modelPath: string): Promise<Record<string, unknown>> {
    const t0 = Date.now();
    let graded: { fields: Record<string, unknown>; key: string };
    try {
      graded = await this.grade(s, modelPath);
    } catch (err) {
      if (!(err instanceof HttpError) || err.status !== 422) throw err;
      const baselineScore = (await this.baselineInfo(s)).score; // set, else computed, else null
      return this.record(s, null, {
        scenario_id: s.id,
        model_path: modelPath,
        score: 0,
        baseline_score: baselineScore,
        improvement: baselineScore === null ? null : round6(0 - baselineScore),
        elapsed_seconds: (Date.now() - t0) / 1000,
        error: err.message,
      });
    }
    return this.record(s, graded.key, graded.fields);
  }

  private record(s: Scenario, key: string | null, fields: Record<string, unknown>): Promise<Record<string, unknown>> {
    return this.withHistory(s, async (history) => {
      const earlier = key === null ? undefined : history.find((e) => e.key === key && e.error === undefined);
      // The entry as recorded, but scored against the baseline in force now (as /evaluate answers).
      if (earlier)
        return { ...earlier, ...pick(fields, AGAINST_BASELINE), cached: true, best: bestOf(history), total_submissions: history.length };
      const { cached, ...rest } = fields;
      const entry: SubmissionEntry = {
        submission_id: history.length + 1,
        timestamp: new Date().toISOString(),
        ...(key ? { key } : {}),
        ...rest,
        model_path: fields.model_path as string,
        score: fields.score as number,
      };
      history.push(entry);
      await this.store.writeHistory(s.id, history);
      if (s === this.o.scenarios[0]) await this.store.writeWorkspaceScores(history);
      await this.store.updateRunMeta({ last_submit_time: Math.floor(Date.now() / 1000) });
      return { ...entry, ...(cached === undefined ? {} : { cached }), best: bestOf(history), total_submissions: history.length };
    });
  }

  /** Read-modify-write of a history, one at a time. */
  withHistory<T>(s: Scenario, fn: (history: SubmissionEntry[]) => Promise<T>): Promise<T> {
    const p = this.historyTail.then(async () => fn(await this.store.readHistory(s.id)));
    this.historyTail = p.catch(() => undefined);
    return p;
  }

  /** Stop starting evaluations; the running one stops at its next batch. */
  close(): void {
    this.closing = true;
  }
}

/** The fields of an answer that depend on the baseline: an earlier /submit entry reports them anew. */
const AGAINST_BASELINE = ["baseline_score", "baseline", "baseline_source", "improvement", "improvement_ci", "improvement_pct"];
const pick = (o: Record<string, unknown>, keys: string[]) => Object.fromEntries(keys.filter((k) => k in o).map((k) => [k, o[k]]));

/** A fraction as percent, rounded to 4 decimals (0.345 -> 34.5, not 34.49999999999999). */
export const pct = (x: number): number => Math.round(x * 100 * 1e4) / 1e4;
const round6 = (x: number): number => Math.round(x * 1e6) / 1e6;

export function bestOf(history: SubmissionEntry[]): SubmissionEntry | null {
  return history.reduce<SubmissionEntry | null>((b, e) => (b === null || e.score > b.score ? e : b), null);
}
