/** The flags of scripts/train-sft.ts, which are the SFT run's configuration (flags.ts): run.json holds
 *  them under these names. */
import { parseFloatArg, parseIntArg, parseList } from "./cli.ts";
import { INLINE_OPS } from "../agents/sft.ts";
import { commandOf, flag, optional, parseFlags, toggle, type FlagTable, type OptionsOf } from "./flags.ts";
import { trainingFlags } from "./options.ts";
import * as path from "node:path";
import { TINY_BASE_DIR, TINY_OUTPUT_DIR } from "../presets/tiny.ts";

export const SFT_FLAGS = {
  ...trainingFlags({ quantize: "none", lr: 2e-4, scheduler: "cosine", warmupRatio: 0.05 }),
  dataset: flag(
    "--dataset <name|path>",
    "gsm8k (local HF cache or hub), synthetic, or a GSM8K-format .jsonl/.parquet path",
    undefined,
    "gsm8k",
  ),
  max_samples: optional(
    "--max_samples <n>",
    "use at most this many training examples (default: all; synthetic: 5000)",
    parseIntArg("max_samples", 1),
  ),
  num_epochs: flag("--num_epochs <n>", "passes over the training conversations", parseIntArg("num_epochs", 1), 1),
  batch_size: flag(
    "--batch_size <n>",
    "conversations per micro-batch (on wasm, fewer where one layer of it would hold over 1 GiB; results do not change)",
    parseIntArg("batch_size", 1),
    8,
  ),
  gradient_accumulation_steps: flag(
    "--gradient_accumulation_steps <n>",
    "micro-batches per optimizer step",
    parseIntArg("gradient_accumulation_steps", 1),
    1,
  ),
  max_length: flag(
    "--max_length <n>",
    "drop conversations longer than this many tokens (counted in the log)",
    parseIntArg("max_length", 8),
    1024,
  ),
  inline_share: flag(
    "--inline_share <p>",
    "share of calculator steps written as plain text with the result inline (as GSM8K's text reads) instead of a tool call",
    parseFloatArg("inline_share", 0, 1),
    0,
  ),
  inline_ops: optional(
    "--inline_ops <ops>",
    "with --inline_share: only steps whose operators are all in this list, e.g. +,-",
    parseList("inline_ops", INLINE_OPS),
  ),
  full: toggle("--full", "train every weight instead of a LoRA adapter (f32 base only; for small models)", false),
  eval_samples: flag("--eval_samples <n>", "held-out questions for the final evaluation (0: skip)", parseIntArg("eval_samples", 0), 100, {
    free: true,
  }),
  eval_max_new_tokens: flag(
    "--eval_max_new_tokens <n>",
    "token budget per evaluation rollout",
    parseIntArg("eval_max_new_tokens", 1),
    512,
    { free: true },
  ),
  max_turns: flag("--max_turns <n>", "assistant turns per evaluation rollout", parseIntArg("max_turns", 1), 8),
  save_steps: flag("--save_steps <n>", "checkpoint every N steps (0: final model only)", parseIntArg("save_steps", 0), 0, { free: true }),
  output_dir: optional("--output_dir <dir>", "run folder (default outputs/<model>/sft)", undefined, { free: true }),
  overwrite: toggle("--overwrite", "replace a run already in --output_dir", false, { free: true }),
  resume: toggle(
    "--resume",
    "continue (or finish) the run in --output_dir from its latest checkpoint (from step 0 if it stopped before its first)",
    false,
    { free: true },
  ),
} satisfies FlagTable;

export type SftFlags = OptionsOf<typeof SFT_FLAGS>;

/** The script's command (its --help). */
export const sftCommand = () =>
  commandOf("train-sft", "Supervised warmup: teach the tool-calling format from GSM8K's calculator annotations", SFT_FLAGS);

/** train-sft --preset tiny: a short full fine-tune of the pretrained base on tool-calling
 *  conversations. In 70% of the additions and subtractions the demonstrations work the result out in
 *  the text instead of calling the calculator, as people do with easy steps; the model imitates that
 *  habit, but its three-digit mental arithmetic is nearly always wrong. GRPO then learns from the
 *  reward alone to call the calculator for those steps too. */
export const TINY_SFT: Partial<SftFlags> = {
  model_path: TINY_BASE_DIR,
  dataset: "synthetic",
  max_samples: 640,
  inline_share: 0.7,
  inline_ops: ["+", "-"],
  num_epochs: 1,
  batch_size: 16,
  learning_rate: 1e-3,
  lr_scheduler: "cosine",
  warmup_ratio: 0.05,
  full: true,
  quantize: "none",
  tools_in_prompt: false,
  max_length: 512,
  eval_samples: 200,
  eval_max_new_tokens: 160,
  max_turns: 5,
  output_dir: path.join(TINY_OUTPUT_DIR, "sft"),
};

/** argv → the SFT run's config, with `--preset tiny`'s table under the explicit flags. */
export const parseSftArgs = (argv: string[]): SftFlags => parseFlags(sftCommand(), SFT_FLAGS, argv, { tiny: TINY_SFT }).o;
