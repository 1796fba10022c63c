/** Which questions a run uses: GSM8K (by name, JSONL or parquet path), a task file (AgentRL JSONL
 *  with its own scorers, datasets/tasks.ts; the same file serves every purpose) or the seeded synthetic
 *  generator. Synthetic streams are disjoint per purpose (SFT, RL, evaluation), so held-out means
 *  held out. */
import { promises as fs, statSync } from "node:fs";
import { UsageError } from "../util/errors.ts";
import { loadGsm8k } from "../datasets/gsm8k.ts";
import { generateSynthetic, type SyntheticOptions } from "../datasets/synthetic.ts";
import { isTaskFile, loadTasks, type Task } from "../datasets/tasks.ts";
import { TINY_SEEDS } from "../presets/tiny.ts";
import { environmentTasks, expandRanges, formatRanges } from "../envs/episodes.ts";
import { Rng } from "../util/rng.ts";

export type Purpose = "sft" | "rl" | "eval";
const SEED: Record<Purpose, number> = { sft: TINY_SEEDS.sft, rl: TINY_SEEDS.rl, eval: TINY_SEEDS.eval };

export interface DataSpec {
  dataset: string; // "gsm8k", "openai/gsm8k", "synthetic", or a .jsonl/.parquet path or folder
  purpose: Purpose;
  maxSamples?: number;
  synthetic?: Omit<SyntheticOptions, "n" | "seed">; // difficulty knobs
  skipMalformed?: boolean;
}

const isNamed = (dataset: string) => dataset === "gsm8k" || dataset === "openai/gsm8k";

/** A usage error unless --dataset names GSM8K, the synthetic generator, or a path that exists. */
export async function checkDataset(dataset: string): Promise<void> {
  if (dataset === "synthetic" || isNamed(dataset)) return;
  if (
    !(await fs.stat(dataset).then(
      () => true,
      () => false,
    ))
  )
    throw new UsageError(
      `--dataset ${dataset}: no such file or folder; expected gsm8k, synthetic, a GSM8K .jsonl/.parquet ` +
        `path, or a task .jsonl ({"id", "query", "answer"} per line)`,
    );
}

/** Held-out questions come from the test split (GSM8K) or the evaluation stream (synthetic). */
export async function loadExamples(spec: DataSpec): Promise<Task[]> {
  if (spec.dataset === "synthetic") {
    const n = spec.maxSamples ?? (spec.purpose === "eval" ? 500 : 5000);
    return generateSynthetic({ n, seed: SEED[spec.purpose], ...spec.synthetic });
  }
  const split = spec.purpose === "eval" ? "test" : "train";
  await checkDataset(spec.dataset);
  if (await isTaskFile(spec.dataset)) {
    try {
      return await loadTasks(spec.dataset, { maxSamples: spec.maxSamples });
    } catch (err) {
      throw new UsageError(`--dataset ${(err as Error).message}`);
    }
  }
  try {
    return await loadGsm8k(spec.dataset, { split, maxSamples: spec.maxSamples, skipMalformed: spec.skipMalformed });
  } catch (err) {
    // Everything loadGsm8k rejects is the user's data (a bad row, a huge line, a missing split).
    throw new UsageError((err as Error).message.split("\n")[0]);
  }
}

export interface TrainingData {
  train: Task[];
  heldOut: Task[];
  /** Where each part came from, for the log and run.json. */
  split: string;
}

/** Whether `--eval_samples` decides which rows train: held-out rows are cut from the end of a single
 *  data file, so changing it on --resume would silently train on other rows. A folder, GSM8K and the
 *  synthetic generator hold out from their own test stream instead. */
export function heldOutCutsTraining(dataset: string): boolean {
  if (dataset === "synthetic" || isNamed(dataset)) return false;
  try {
    return statSync(dataset).isFile();
  } catch {
    return false;
  }
}

/** Training questions and `heldOutN` held-out ones that never overlap. GSM8K by name or a folder has
 *  its own test split, the synthetic generator its own stream; a single file has neither, so its
 *  last `heldOutN` rows are held out and training reads only the rows before them. Held-out rows
 *  whose question also appears among the training rows are dropped. */
export async function loadTrainingData(
  spec: Omit<DataSpec, "purpose"> & { purpose: "sft" | "rl" },
  heldOutN: number,
): Promise<TrainingData> {
  const isFile =
    spec.dataset !== "synthetic" &&
    !isNamed(spec.dataset) &&
    (await fs.stat(spec.dataset).then(
      (s) => s.isFile(),
      () => false,
    ));
  if (!isFile || heldOutN === 0) {
    const train = await loadExamples(spec);
    const held = heldOutN > 0 ? await loadExamples({ ...spec, purpose: "eval", maxSamples: heldOutN }) : [];
    const seen = new Set(train.map((e) => e.question));
    const heldOut = held.filter((e) => !seen.has(e.question));
    const from = spec.dataset === "synthetic" ? "the synthetic generator's evaluation stream" : `the test split of ${spec.dataset}`;
    return {
      train,
      heldOut,
      split:
        heldOutN > 0
          ? `${train.length} training questions; ${heldOut.length} held out from ${from}`
          : `${train.length} training questions; none held out`,
    };
  }
  const rows = await loadExamples({ ...spec, maxSamples: undefined });
  if (heldOutN >= rows.length)
    throw new UsageError(
      `--eval_samples ${heldOutN}: ${spec.dataset} has ${rows.length} rows, and held-out rows are taken ` +
        `from its end; lower --eval_samples or pass a folder with a test split`,
    );
  const cut = rows.length - heldOutN;
  const train = rows.slice(0, spec.maxSamples === undefined ? cut : Math.min(cut, spec.maxSamples));
  const seen = new Set(rows.slice(0, cut).map((e) => e.question));
  const heldOut = rows.slice(cut).filter((e) => !seen.has(e.question));
  return {
    train,
    heldOut,
    split:
      `${spec.dataset}: rows 1-${cut} for training (${train.length} used), ` +
      `the last ${heldOutN} held out (${heldOut.length} after dropping questions also in training)`,
  };
}

/** --env's training and held-out tasks: the held-out ones are the first --eval_samples of
 *  --env_eval_tasks, and the two range lists may not share a data_idx. */
export function environmentSplit(env: string, trainSpec: string, heldOutSpec: string, evalSamples: number) {
  const train = expandRanges(trainSpec);
  const heldOut = expandRanges(heldOutSpec);
  const trainSet = new Set(train);
  const shared = heldOut.filter((i) => trainSet.has(i));
  if (shared.length > 0)
    throw new UsageError(
      `--env_tasks ${trainSpec} and --env_eval_tasks ${heldOutSpec} share data_idx ` +
        `${formatRanges(shared)}; held-out tasks must not be trained on`,
    );
  const evaluated = heldOut.slice(0, evalSamples);
  return {
    train: environmentTasks(train),
    heldOut: environmentTasks(evaluated),
    split:
      `environment ${env}: train data_idx ${trainSpec}; ` +
      (evaluated.length > 0 ? `held out data_idx ${formatRanges(evaluated)}` : "none held out (--eval_samples 0)"),
  };
}

/** The i-th question of an endless stream: the data in a fresh seeded order every pass. */
export function dataStream(examples: Task[], seed: number) {
  const orders = new Map<number, number[]>();
  return (i: number): Task => {
    const pass = Math.floor(i / examples.length);
    if (!orders.has(pass)) orders.set(pass, new Rng(seed * 7919 + pass).shuffle(examples.map((_, k) => k)));
    return examples[orders.get(pass)![i % examples.length]];
  };
}
