/** Write a run folder's report.html again from the files the run left (metrics.jsonl, run.json,
 *  trajectories.jsonl, eval.json, samples-*.jsonl), for example while a run is still going or after
 *  the report code changed. The run kind comes from run.json. */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { RUN_CONFIG_FILE } from "./output-dir.ts";
import { UsageError } from "../util/errors.ts";
import { writeReport } from "../report/report.ts";
import { rewriteEvalReport } from "../report/eval-report.ts";

export async function rewriteRunReport(dir: string): Promise<string> {
  const file = path.join(dir, RUN_CONFIG_FILE);
  const text = await fs.readFile(file, "utf8").catch(() => {
    throw new UsageError(`${file} not found: expected a run folder written by train-sft, train-gsm8k-agent or eval`);
  });
  let run: { runKind?: string; config?: { base?: string; modelPath?: string; model_path?: string } };
  try {
    run = JSON.parse(text);
  } catch {
    throw new UsageError(`${file} is not valid JSON`);
  }
  const base = path.basename(run.config?.base ?? run.config?.modelPath ?? run.config?.model_path ?? dir);
  switch (run.runKind) {
    case "sft":
      return writeReport(dir, { title: `SFT ${base}` });
    case "grpo":
      return writeReport(dir, { title: `GRPO ${base}` });
    case "eval":
      return rewriteEvalReport(dir);
    default:
      throw new UsageError(`${file}: run kind ${JSON.stringify(run.runKind)} is not one of sft, grpo, eval`);
  }
}
