/** The grading server's state on disk, every file written to a temp name and renamed into place:
 *    <state>/evaluations/<key>/result.json, samples.jsonl   one evaluation (the cache: key = scenario,
 *                                                            protocol and the weights' sizes and mtimes)
 *    <state>/<scenario>/baseline.json                        the base model's evaluation, or a set score
 *    <state>/<scenario>/scores.json                          the /submit history, as AutoRL-Bench keeps it
 *    <workspace>/run_meta.json                               start time and time budget (AutoRL-Bench's)
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
  computed: { key: string; score: number; n: number; k: number; samples_path: string; protocol: Record<string, unknown>; computed_at: string } | null;
  set: { score: number; set_at: string } | null;
}

export interface SubmissionEntry {
  submission_id: number;
  timestamp: string;
  model_path: string; // as submitted
  key: string; // evaluation key: a resubmission of unchanged weights returns this entry
  score: number;
  [field: string]: unknown;
}

export interface RunMeta {
  start_time: number;
  timeout_s: number | null;
  last_submit_time: number | null;
  end_time: number | null;
}

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
  constructor(readonly stateDir: string, readonly workspace: string) {}

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

  async readHistory(scenario: string): Promise<SubmissionEntry[]> {
    const h = await readJson<SubmissionEntry[]>(this.scenarioFile(scenario, "scores.json"));
    if (h !== null && !Array.isArray(h)) throw new Error(`${this.scenarioFile(scenario, "scores.json")}: expected a JSON list of submissions`);
    return h ?? [];
  }

  writeHistory(scenario: string, h: SubmissionEntry[]): Promise<void> {
    return writeFileAtomic(this.scenarioFile(scenario, "scores.json"), json(h));
  }

  runMetaPath(): string {
    return path.join(this.workspace, "run_meta.json");
  }

  readRunMeta(): Promise<RunMeta | null> {
    return readJson<RunMeta>(this.runMetaPath());
  }

  writeRunMeta(m: RunMeta): Promise<void> {
    return writeFileAtomic(this.runMetaPath(), json(m));
  }
}
