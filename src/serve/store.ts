/** The grading server's state on disk, every file written to a temp name and renamed into place:
 *    <state>/evaluations/<key>/result.json, samples.jsonl   one evaluation (the cache: key = scenario,
 *                                                            protocol and the weights' sizes and mtimes)
 *    <state>/<scenario>/baseline.json                        the base model's evaluation, or a set score
 *    <state>/<scenario>/scores.json                          the /submit history of each scenario
 *    <state>/<scenario>/train.jsonl                          training data the server makes (tiny)
 *    <workspace>/scores.json                                 the default scenario's history, where
 *                                                            AutoRL-Bench's harness reads it
 *    <workspace>/run_meta.json                               the harness's clock: read, never rewritten
 *                                                            but for last_submit_time (and fields missing)
 *  A restart reads them back: history, best score, baseline and cached results survive. */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import type { EvalResult } from "../run/evaluate.ts";
import { samplesJsonl } from "../run/eval-run.ts";
import { writeDirAtomic, writeFileAtomic } from "../util/fs.ts";

export interface StoredEvaluation {
  key: string;
  scenario_id: string;
  model: { path: string; kind: "model" | "adapter"; base: string | null };
  protocol: Record<string, unknown>;
  computed_at: string;
  result: EvalResult;
}

/** The baseline of a scenario: the base model's evaluation, and a score set through /set_baseline,
 *  which then takes its place in improvements (without a paired interval: there are no samples). */
export interface BaselineRecord {
  scenario_id: string;
  model: string;
  computed: {
    key: string;
    score: number;
    accuracy?: number;
    n: number;
    k: number;
    samples_path: string;
    protocol: Record<string, unknown>;
    computed_at: string;
  } | null;
  set: { score: number; set_at: string } | null; // percent
}

export interface SubmissionEntry {
  submission_id: number;
  timestamp: string;
  model_path: string; // as submitted
  key?: string; // evaluation key: a resubmission of unchanged weights returns this entry (none for a failed one)
  score: number; // percent
  error?: string; // the evaluation failed: score 0
  [field: string]: unknown;
}

/** `<workspace>/run_meta.json` as AutoRL-Bench's harness writes it (`init_run_meta`): start_time,
 *  timeout_s, last_submit_time, end_time, and whatever else it holds, kept as it is. */
export type RunMeta = Record<string, unknown> & { start_time?: unknown; timeout_s?: unknown };

async function readJson<T>(file: string): Promise<T | null> {
  let text: string;
  try {
    text = await fs.readFile(file, "utf8");
  } catch {
    return null;
  }
  try {
    return JSON.parse(text) as T;
  } catch (err) {
    throw new Error(`${file} is not valid JSON (${(err as Error).message}); fix or remove it`);
  }
}

const json = (v: unknown) => JSON.stringify(v, null, 2) + "\n";

export class GradingStore {
  constructor(
    readonly stateDir: string,
    readonly workspace: string,
  ) {}

  evaluationDir(key: string): string {
    return path.join(this.stateDir, "evaluations", key);
  }

  samplesPath(key: string): string {
    return path.join(this.evaluationDir(key), "samples.jsonl");
  }

  async readEvaluation(key: string): Promise<StoredEvaluation | null> {
    return readJson<StoredEvaluation>(path.join(this.evaluationDir(key), "result.json"));
  }

  /** The folder appears whole or not at all. */
  async writeEvaluation(e: StoredEvaluation): Promise<void> {
    await writeDirAtomic(this.evaluationDir(e.key), async (tmp) => {
      await fs.writeFile(path.join(tmp, "samples.jsonl"), samplesJsonl(e.result));
      await fs.writeFile(path.join(tmp, "result.json"), JSON.stringify(e) + "\n");
    });
  }

  private scenarioFile(scenario: string, name: string): string {
    return path.join(this.stateDir, scenario, name);
  }

  readBaseline(scenario: string): Promise<BaselineRecord | null> {
    return readJson<BaselineRecord>(this.scenarioFile(scenario, "baseline.json"));
  }

  writeBaseline(b: BaselineRecord): Promise<void> {
    return writeFileAtomic(this.scenarioFile(b.scenario_id, "baseline.json"), json(b));
  }

  trainDataPath(scenario: string): string {
    return this.scenarioFile(scenario, "train.jsonl");
  }

  async readHistory(scenario: string): Promise<SubmissionEntry[]> {
    const h = await readJson<SubmissionEntry[]>(this.scenarioFile(scenario, "scores.json"));
    if (h !== null && !Array.isArray(h))
      throw new Error(`${this.scenarioFile(scenario, "scores.json")}: expected a JSON list of submissions`);
    return h ?? [];
  }

  writeHistory(scenario: string, h: SubmissionEntry[]): Promise<void> {
    return writeFileAtomic(this.scenarioFile(scenario, "scores.json"), json(h));
  }

  runMetaPath(): string {
    return path.join(this.workspace, "run_meta.json");
  }

  async readRunMeta(): Promise<RunMeta | null> {
    const m = await readJson<RunMeta>(this.runMetaPath());
    if (m !== null && (typeof m !== "object" || Array.isArray(m))) throw new Error(`${this.runMetaPath()}: expected a JSON object`);
    return m;
  }

  /** Set some fields of run_meta.json and keep the rest, as AutoRL-Bench's `update_run_meta` does. */
  async updateRunMeta(fields: RunMeta): Promise<RunMeta> {
    const meta = { ...((await this.readRunMeta()) ?? {}), ...fields };
    await writeFileAtomic(this.runMetaPath(), json(meta));
    return meta;
  }

  /** The history where AutoRL-Bench's harness reads it at the end of a run (`<workspace>/scores.json`). */
  writeWorkspaceScores(h: SubmissionEntry[]): Promise<void> {
    return writeFileAtomic(path.join(this.workspace, "scores.json"), json(h));
  }
}
