/** Which questions a run uses: GSM8K (by name, JSONL or parquet path) or the seeded synthetic
 *  generator. Synthetic streams are disjoint per purpose (SFT, RL, evaluation), so held-out means
 *  held out. */
import { promises as fs } from "node:fs";
import { UsageError } from "../cli.ts";
import { loadGsm8k, type Gsm8kExample } from "../datasets/gsm8k.ts";
import { generateSynthetic, type SyntheticOptions } from "../datasets/synthetic.ts";
import { TINY_SEEDS } from "../presets/tiny.ts";

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
  if (!(await fs.stat(dataset).then(() => true, () => false)))
    throw new UsageError(`--dataset ${dataset}: no such file or folder; expected gsm8k, synthetic, or a GSM8K .jsonl/.parquet path`);
}

/** Held-out questions come from the test split (GSM8K) or the evaluation stream (synthetic). */
export async function loadExamples(spec: DataSpec): Promise<Gsm8kExample[]> {
  if (spec.dataset === "synthetic") {
    const n = spec.maxSamples ?? (spec.purpose === "eval" ? 500 : 5000);
    return generateSynthetic({ n, seed: SEED[spec.purpose], ...spec.synthetic });
  }
  const split = spec.purpose === "eval" ? "test" : "train";
  await checkDataset(spec.dataset);
  try {
    return await loadGsm8k(spec.dataset, { split, maxSamples: spec.maxSamples, skipMalformed: spec.skipMalformed });
  } catch (err) {
    // Everything loadGsm8k rejects is the user's data (a bad row, a huge line, a missing split).
    throw new UsageError((err as Error).message.split("\n")[0]);
  }
}
