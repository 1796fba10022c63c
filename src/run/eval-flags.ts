/** The flags of scripts/eval.ts, which are the evaluation's configuration (flags.ts): eval.json and
 *  report.html hold them under these names, next to the model list they settle. */
import { parseChoice, parseFloatArg, parseIntArg } from "./cli.ts";
import { UsageError } from "../util/errors.ts";
import type { Quantize } from "../model/types.ts";
import { commandOf, flag, optional, toggle, type FlagTable, type OptionsOf } from "./flags.ts";
import { HELD_OUT_START, parseTaskRanges } from "../envs/episodes.ts";
import { envFlags, modelFlags, QUANTIZE_CHOICES, toolFlags } from "./options.ts";
import { rolloutEngineFlag, withEngineFlags } from "../rollout/engines/index.ts";

const OWN_FLAGS = {
  ...modelFlags({ modelPath: "Qwen/Qwen2.5-0.5B", quantize: "none" }),
  ...toolFlags(),
  adapter: optional("--adapter <dir>", "PEFT adapter folder to attach to --model_path"),
  baseline: optional(
    "--baseline <path>",
    "also evaluate this model or adapter folder on the same questions and print the paired improvement",
  ),
  quantize_for: optional(
    "--quantize_for <name=kind,...>",
    "per-model quantization overriding --quantize, e.g. rl=int8 (names as in the table)",
    parseQuantizeFor,
  ),
  dataset: flag(
    "--dataset <name>",
    "gsm8k, synthetic, a GSM8K .jsonl/.parquet path or folder, or a task .jsonl ({id, query, answer, scorer?, answer_schema?})",
    undefined,
    "gsm8k",
  ),
  split: flag(
    "--split <name>",
    "test (held out) or train (synthetic: the RL stream)",
    parseChoice("split", ["test", "train"] as const),
    "test" as "test" | "train",
  ),
  max_samples: optional(
    "--max_samples <n>",
    "questions to evaluate (default: all of GSM8K's split, 500 synthetic)",
    parseIntArg("max_samples", 1),
  ),
  samples_per_prompt: flag(
    "--samples_per_prompt <k>",
    "samples per question: pass@1 is estimated from all k, and pass@k is reported",
    parseIntArg("samples_per_prompt", 1),
    1,
  ),
  temperature: flag("--temperature <t>", "sampling temperature; 0 = greedy (then k must be 1)", parseFloatArg("temperature", 0, 10), 0),
  batch_size: flag("--batch_size <n>", "questions per decode batch (each with k rows)", parseIntArg("batch_size", 1), 8),
  max_new_tokens: flag(
    "--max_new_tokens <n>",
    "token budget per rollout over all turns, tool responses included",
    parseIntArg("max_new_tokens", 1),
    512,
  ),
  max_turns: flag("--max_turns <n>", "assistant turns per rollout", parseIntArg("max_turns", 1), 8),
  ...envFlags(
    "evaluate on an AgentGym HTTP environment server instead of a dataset: its tasks are --env_tasks, each assistant turn an action " +
      '(its last "Action:" line); a sample succeeds when the episode\'s reward reaches 1',
  ),
  env_tasks: optional(
    "--env_tasks <ranges>",
    `with --env: the data_idx to evaluate, as ranges like 0-99,200-249 (default: ${HELD_OUT_START} to ` +
      `${HELD_OUT_START} + --max_samples - 1, held out from GRPO's default training tasks 0 to ` +
      `--max_samples - 1; on a server with fewer tasks, from the start of its upper half: TextCraft 272; ` +
      `ranges past its size are refused)`,
    parseTaskRanges("env_tasks"),
  ),
  output_dir: optional(
    "--output_dir <dir>",
    "where eval.json, samples-*.jsonl and report.html go (default outputs/<model name>/eval; tiny: outputs/tiny/eval)",
  ),
  overwrite: toggle("--overwrite", "replace an earlier evaluation in --output_dir", false),
  rollout_engine: rolloutEngineFlag("what generates the rollouts"),
} satisfies FlagTable;

/** The script's own flags, then every rollout engine's (rollout/engines/: each engine declares its own). */
export const EVAL_FLAGS = withEngineFlags(OWN_FLAGS, { training: false });

export type EvalFlags = OptionsOf<typeof EVAL_FLAGS>;

/** What `--preset tiny` sets (explicit flags still win). */
export const TINY_EVAL_PRESET = {
  dataset: "synthetic",
  max_samples: 200,
  max_new_tokens: 160,
  max_turns: 5,
  tools_in_prompt: false,
  // 64 questions per decode batch, as the trainers' closing evaluation: a decode step's fixed cost
  // (kernel dispatch over 4 layers) is shared by 4× the rows. Greedy rows do not depend on their
  // batch company (test/rollout/rollout-model.test.ts), so the table is the same as with 16.
  batch_size: 64,
} satisfies Partial<EvalFlags>;

/** The script's command (its --help). */
export const evalCommand = () =>
  commandOf(
    "eval",
    "Accuracy of one or more checkpoints on held-out GSM8K-format questions or a task file, with the --tools tools",
    EVAL_FLAGS,
  );

function parseQuantizeFor(value: string): Record<string, Quantize> {
  const out: Record<string, Quantize> = {};
  for (const item of value.split(",")) {
    const m = /^\s*([\w.-]+)\s*=\s*(\w+)\s*$/.exec(item);
    if (!m || !(QUANTIZE_CHOICES as readonly string[]).includes(m[2]))
      throw new UsageError(
        `--quantize_for ${JSON.stringify(value)}: expected name=kind pairs separated by commas, kind one of ${QUANTIZE_CHOICES.join(", ")}`,
      );
    out[m[1]] = m[2] as Quantize;
  }
  return out;
}
