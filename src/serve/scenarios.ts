/** What the grading server grades: a scenario is a base model, training data an agent may read, and
 *  a fixed evaluation protocol (held-out questions, sampling, answer schema, scorer) that the base
 *  model and every submission are scored with. `tiny` is the offline preset (synthetic problems, the
 *  shipped 0.8 M-parameter base, the protocol of `eval.ts --preset tiny`); `gsm8k` is GSM8K's test
 *  split with Qwen2.5-0.5B. Leaves out: online scenarios (no environment to interact with). */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import type { Gsm8kExample } from "../datasets/gsm8k.ts";
import { loadGsm8kWithReport } from "../datasets/gsm8k.ts";
import { generateSynthetic } from "../datasets/synthetic.ts";
import { resolveGsm8kSplit } from "../datasets/gsm8k-hub.ts";
import { cachedSnapshot, resolveModelDir } from "../model/model-dir.ts";
import type { Quantize } from "../model/types.ts";
import { TINY_BASE_DIR, TINY_PROBLEMS, TINY_SEEDS } from "../presets/tiny.ts";
import { loadExamples } from "../run/data.ts";
import { TINY_EVAL_PRESET } from "../run/eval-flags.ts";
import type { EvalProtocol } from "../run/eval-run.ts";
import { writeFileAtomic, exists } from "../util/fs.ts";
import { hubCacheDirs, isHubId } from "../util/hub.ts";

export const SCENARIO_IDS = ["tiny", "gsm8k"] as const;
export type ScenarioId = (typeof SCENARIO_IDS)[number];

/** The evaluation every model of a scenario gets. Strict accuracy (the answer in the schema SFT
 *  teaches) is the score; lenient accuracy and the rest are reported beside it. */
export interface ScenarioProtocol extends EvalProtocol {
  dataset: string; // as run/data.ts reads it: "synthetic", "gsm8k", or a GSM8K-format path
  split: "test";
  max_samples?: number; // n; undefined: the whole split
  quantize: Quantize; // how the base weights of every model are held while it is evaluated
  answer_schema: "boxed";
  scorer: "math";
}

export interface Scenario {
  id: ScenarioId;
  name: string;
  description: string;
  type: "offline";
  baseModel: string; // hub id or folder, as configured
  protocol: ScenarioProtocol;
  /** The held-out questions, the same every time. */
  questions(): Promise<Gsm8kExample[]>;
  /** A GSM8K-format file a trainer can read (written on first use where it has to be made). */
  trainData(): Promise<string>;
  /** Named with --scenarios: its model and data may be downloaded. Listed by default only: it is
   *  served when they are on this machine, and shown as unavailable otherwise. */
  explicit: boolean;
  /** Why the scenario cannot be served from what is on this machine (no download tried), or null. */
  missing(): Promise<string | null>;
}

export interface ScenarioOptions {
  stateDir: string; // where generated training data goes (<state>/<scenario>/train.jsonl), never the
  // workspace's data/ (in AutoRL-Bench's layout a symlink to a folder shared by every run)
  explicit: boolean;
  gsm8kModel: string;
  gsm8kData: string; // "gsm8k" (the Hugging Face cache) or a GSM8K .jsonl/.parquet path or folder
  /** Protocol fields to override in every scenario (the flags of scripts/serve.ts). */
  overrides: Partial<ScenarioProtocol>;
}

/** Synthetic training problems the tiny scenario writes for agents: the SFT stream of the preset
 *  (its first 640 are exactly what `train-sft --preset tiny` trains on). */
export const TINY_TRAIN_SIZE = 5000;

const defined = <T extends object>(o: T): Partial<T> =>
  Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;

export function makeScenario(id: ScenarioId, o: ScenarioOptions): Scenario {
  const common = {
    samples_per_prompt: 1,
    temperature: 0,
    seed: 0,
    backend: "auto" as const,
    split: "test" as const,
    quantize: "none" as Quantize,
    answer_schema: "boxed" as const,
    scorer: "math" as const,
  };
  if (id === "tiny") {
    const protocol: ScenarioProtocol = {
      ...common,
      dataset: "synthetic",
      max_samples: TINY_EVAL_PRESET.max_samples,
      batch_size: TINY_EVAL_PRESET.batch_size,
      max_new_tokens: TINY_EVAL_PRESET.max_new_tokens,
      max_turns: TINY_EVAL_PRESET.max_turns,
      tools_in_prompt: TINY_EVAL_PRESET.tools_in_prompt,
      ...defined(o.overrides),
    };
    const trainFile = path.join(o.stateDir, "tiny", "train.jsonl");
    return {
      id,
      type: "offline",
      protocol,
      explicit: o.explicit,
      missing: async () => null,
      name: "Tiny synthetic arithmetic (offline preset)",
      description:
        "GSM8K-format word problems with 1-2 steps on numbers up to 999, solved with a calculator tool; " +
        "the final answer goes in \\boxed{}. The base is the tiny preset's 0.8 M-parameter Qwen2-architecture model. " +
        "Scored exactly like `scripts/eval.ts --preset tiny --model_path MODEL`.",
      baseModel: TINY_BASE_DIR,
      questions: () => loadExamples({ dataset: "synthetic", purpose: "eval", maxSamples: protocol.max_samples, synthetic: TINY_PROBLEMS }),
      trainData: async () => {
        if (!(await exists(trainFile))) {
          const rows = generateSynthetic({ n: TINY_TRAIN_SIZE, seed: TINY_SEEDS.sft, ...TINY_PROBLEMS });
          await writeFileAtomic(trainFile, rows.map((r) => JSON.stringify({ question: r.question, answer: r.answer })).join("\n") + "\n");
        }
        return trainFile;
      },
    };
  }
  const protocol: ScenarioProtocol = {
    ...common,
    dataset: o.gsm8kData,
    max_samples: undefined,
    batch_size: 8,
    max_new_tokens: 512,
    max_turns: 8,
    tools_in_prompt: true,
    ...defined(o.overrides),
  };
  let train: Promise<string> | undefined;
  // Resolved with downloads off: what is on this machine.
  const offline = { ...process.env, HF_HUB_OFFLINE: "1" };
  const missing = async (): Promise<string | null> => {
    const why: string[] = [];
    await resolveModelDir(o.gsm8kModel, offline).catch(() => why.push(`base model ${o.gsm8kModel} is not on this machine`));
    if (isHubId(protocol.dataset) || protocol.dataset === "gsm8k")
      await resolveGsm8kSplit(protocol.dataset, "test", offline).catch(() =>
        why.push(`GSM8K (${protocol.dataset}) is not in the Hugging Face cache`),
      );
    else if (!(await exists(protocol.dataset))) why.push(`${protocol.dataset} does not exist`);
    return why.length ? why.join("; ") : null;
  };
  const ifPresent = async <T>(f: () => Promise<T>): Promise<T> => {
    const why = o.explicit ? null : await missing();
    if (why !== null) throw new Error(`unavailable: ${why}`);
    return f();
  };
  return {
    id,
    type: "offline",
    protocol,
    explicit: o.explicit,
    missing,
    name: "GSM8K with a calculator",
    description:
      "Grade-school math word problems (GSM8K test split), solved with a calculator tool; the final answer goes in \\boxed{}. " +
      "Scored like `scripts/eval.ts --model_path MODEL --dataset gsm8k` (greedy, tool schema in the system prompt).",
    baseModel: o.gsm8kModel,
    questions: () => ifPresent(() => loadExamples({ dataset: protocol.dataset, purpose: "eval", maxSamples: protocol.max_samples })),
    // The file the train split resolves to (a cached parquet file for the dataset name).
    trainData: () =>
      (train ??= ifPresent(() => loadGsm8kWithReport(protocol.dataset, { split: "train", maxSamples: 1 })).then(
        (r) => path.resolve(r.file),
        (err) => {
          train = undefined;
          throw err;
        },
      )),
  };
}

/** The base model's folder if it is on this machine (a folder, or a hub id in the local cache), else
 *  null. Never downloads: that happens when the baseline is computed. */
export async function localModelDir(model: string): Promise<string | null> {
  if (await exists(model)) return path.resolve(model);
  if (!isHubId(model)) return null;
  for (const cache of hubCacheDirs()) {
    const snap = await cachedSnapshot(model, cache);
    if (snap) return snap;
  }
  return null;
}

/** The protocol as the API shows it (snake_case, what a person or agent needs to reproduce it). */
export function describeProtocol(s: Scenario, n: number | null): Record<string, unknown> {
  const p = s.protocol;
  return {
    split: p.split,
    dataset: p.dataset,
    n,
    samples_per_prompt: p.samples_per_prompt,
    greedy: p.temperature === 0,
    temperature: p.temperature,
    max_new_tokens: p.max_new_tokens,
    max_turns: p.max_turns,
    tools: ["calculator"],
    tools_in_prompt: p.tools_in_prompt,
    answer_schema: p.answer_schema,
    scorer: p.scorer,
    quantize: p.quantize,
    seed: p.seed,
    metric: "strict_accuracy",
  };
}
