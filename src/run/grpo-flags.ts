/** The flags of scripts/train-gsm8k-agent.ts, which are the GRPO run's configuration (flags.ts): run.json
 *  holds them under these names, and a resumed run must match every one not marked `free`. */
import { parseChoice, parseFloatArg, parseIntArg } from "./cli.ts";
import {
  IMPORTANCE_SAMPLING_LEVELS,
  LOSS_TYPES,
  POLICY_LOSSES,
  type ImportanceSamplingLevel,
  type LossType,
} from "../trainer/policy-loss.ts";
import { commandOf, flag, optional, parseFlags, toggle, usage, type FlagTable, type OptionsOf } from "./flags.ts";
import { checkTaskRange, defaultTaskRanges, HELD_OUT_START, parseTaskRanges } from "../envs/episodes.ts";
import type { SyntheticOptions } from "../datasets/synthetic.ts";
import type { EnvironmentFactory } from "../envs/types.ts";
import { parseRewardWeights } from "../rollout/rewards.ts";
import { UsageError } from "../util/errors.ts";
import { defaultEpsilonHigh, importanceLevel } from "../trainer/policy-loss.ts";
import { TINY_PROBLEMS } from "../presets/tiny.ts";
import { defaultOutputDir, envFlags, toolFlags, trainingFlags } from "./options.ts";
import { rolloutEngineFlag, withEngineFlags } from "../rollout/engines/index.ts";
import * as path from "node:path";
import { TINY_OUTPUT_DIR } from "../presets/tiny.ts";

const OWN_FLAGS = {
  ...trainingFlags({ quantize: "nf4", lr: 1e-5, scheduler: "constant", warmupRatio: 0 }),
  init_adapter: optional(
    "--init_adapter <dir>",
    "PEFT adapter to continue (default: the adapter at --model_path, if it is one; else a fresh adapter)",
  ),
  dataset: flag(
    "--dataset <name|path>",
    "gsm8k (local HF cache or hub), synthetic, a GSM8K-format .jsonl/.parquet path, or a task .jsonl " +
      "({id, query, answer, scorer?, answer_schema?})",
    undefined,
    "gsm8k",
  ),
  max_samples: optional(
    "--max_samples <n>",
    "use at most this many training questions (default: all; synthetic: 5000)",
    parseIntArg("max_samples", 1),
  ),
  max_steps: flag("--max_steps <n>", "RL steps; each is one rollout → train round", parseIntArg("max_steps", 1), 100, {
    alias: "--total_epochs <n>",
    free: true,
  }),
  prompts_per_step: flag("--prompts_per_step <n>", "questions per step", parseIntArg("prompts_per_step", 1), 4),
  samples_per_prompt: flag("--samples_per_prompt <n>", "G: rollouts per question (the group)", parseIntArg("samples_per_prompt", 2), 8),
  max_new_tokens: flag(
    "--max_new_tokens <n>",
    "token budget per rollout over all turns (sampled + tool responses)",
    parseIntArg("max_new_tokens", 1),
    512,
  ),
  max_turns: flag("--max_turns <n>", "assistant turns per rollout", parseIntArg("max_turns", 1), 8),
  temperature: flag("--temperature <x>", "sampling temperature", parseFloatArg("temperature", 0), 1.0),
  top_p: flag("--top_p <x>", "nucleus sampling mass", parseFloatArg("top_p", 0, 1), 1.0),
  top_k: flag("--top_k <n>", "sample among the k most likely tokens (0: off)", parseIntArg("top_k", 0), 0),
  beta: flag(
    "--beta <x>",
    "weight of the k3 KL to the adapter-free base (0, the default, as TRL: no reference pass)",
    parseFloatArg("beta", 0),
    0,
  ),
  epsilon: flag("--epsilon <x>", "lower clip range of the ratio", parseFloatArg("epsilon", 0), 0.2),
  epsilon_high: optional(
    "--epsilon_high <x>",
    "upper clip range (default: --epsilon; minirl: --epsilon + 0.1, AgentRL's window)",
    parseFloatArg("epsilon_high", 0),
  ),
  num_iterations: flag("--num_iterations <n>", "policy updates per batch of rollouts", parseIntArg("num_iterations", 1), 1),
  loss_type: flag(
    "--loss_type <kind>",
    LOSS_TYPES.map((k) => `${k}: ${POLICY_LOSSES[k].help}`).join("; "),
    parseChoice("loss_type", LOSS_TYPES),
    "grpo" as LossType,
  ),
  importance_sampling_level: flag(
    "--importance_sampling_level <level>",
    "token: one importance ratio per token; sequence: one per rollout, exp(mean log-ratio) (GSPO; --loss_type gspo always)",
    parseChoice("importance_sampling_level", IMPORTANCE_SAMPLING_LEVELS),
    "token" as ImportanceSamplingLevel,
  ),
  mask_truncated_completions: toggle(
    "--mask_truncated_completions",
    "rollouts stopped by --max_new_tokens or --max_turns train nothing (DAPO's overlong filtering)",
    false,
  ),
  scale_rewards: flag(
    "--scale_rewards <kind>",
    "group: divide advantages by the group's std; none: only centre them",
    parseChoice("scale_rewards", ["group", "none"] as const),
    "group" as "group" | "none",
  ),
  reward_weights: flag(
    "--reward_weights <spec>",
    "weights of the reward components, e.g. correctness=1,format=0.1,tool_use=0 (with --env: env=1)",
    undefined,
    "correctness=1,format=0.1",
  ),
  micro_batch_size: flag(
    "--micro_batch_size <n|auto>",
    "rollouts per forward/backward, at most (memory knob; results do not change up to float rounding). On " +
      "wasm, fewer where one layer of the micro-batch would hold over 1 GiB (0.5B: 4 rollouts of ~500 " +
      "tokens). auto: on a GPU as many as fit half its memory beside the weights (estimated from shapes; an " +
      "out-of-memory error in the step's first micro-step halves it), on wasm the 1 GiB rule alone; the " +
      "split it chose is printed at the first update and after an out-of-memory halving, and kept in " +
      "run.json (micro_batch_auto) and metrics.jsonl (micro_batches, micro_batch_rows)",
    (v: string): number | "auto" => {
      if (v.trim() === "auto") return "auto";
      try {
        return parseIntArg("micro_batch_size", 1)(v);
      } catch {
        throw new UsageError(`--micro_batch_size ${JSON.stringify(v)}: expected a whole number ≥ 1 or auto`);
      }
    },
    8,
  ),
  save_steps: flag("--save_steps <n>", "checkpoint every N steps (and always at the end)", parseIntArg("save_steps", 0), 25, {
    free: true,
  }),
  save_total_limit: flag("--save_total_limit <n>", "keep only the newest N checkpoints", parseIntArg("save_total_limit", 1), 2, {
    free: true,
  }),
  eval_samples: flag(
    "--eval_samples <n>",
    "held-out questions evaluated greedily at the end (0: skip)",
    parseIntArg("eval_samples", 0),
    0,
    { free: true },
  ),
  ...toolFlags(),
  ...envFlags(),
  env_tasks: optional(
    "--env_tasks <ranges>",
    "with --env: the data_idx to train on, as ranges like 0-99,200-249 (default: 0 to --max_samples - 1, 100 tasks)",
    parseTaskRanges("env_tasks"),
  ),
  env_eval_tasks: optional(
    "--env_eval_tasks <ranges>",
    `with --env: held-out data_idx; the first --eval_samples of them are evaluated at the end; must not ` +
      `overlap --env_tasks (default: ${HELD_OUT_START} on, the range eval.ts --env uses; on a server with ` +
      `fewer tasks its upper half: TextCraft 272-543; ranges past its size are refused)`,
    parseTaskRanges("env_eval_tasks"),
  ),
  env_max_failed_steps: flag(
    "--env_max_failed_steps <n>",
    "with --env: stop (checkpoint saved, continue with --resume) when every rollout failed on the " +
      "environment in this many steps in a row (0: never)",
    parseIntArg("env_max_failed_steps", 0),
    3,
    { free: true },
  ),
  rollout_engine: rolloutEngineFlag("where rollouts are generated"),
  tis_cap: flag(
    "--tis_cap <c>",
    "with an engine whose log-probs are not the trainer's (llama, openai): each token's policy loss is " +
      "weighted by min(π_trainer / π_engine, c), truncated importance sampling (verl, TRL); 0: off",
    parseFloatArg("tis_cap", 0),
    2,
  ),
  output_dir: optional("--output_dir <dir>", "run folder (default outputs/<model>/grpo)", undefined, { free: true }),
  overwrite: toggle("--overwrite", "replace a run already in --output_dir", false, { free: true }),
  resume: toggle(
    "--resume",
    "continue the run in --output_dir from its latest checkpoint (from step 0 if it stopped before its first)",
    false,
    { free: true },
  ),
} satisfies FlagTable;

/** The script's own flags, then every rollout engine's (rollout/engines/: each engine declares its own). */
export const GRPO_FLAGS = withEngineFlags(OWN_FLAGS, { training: true });

export type GrpoFlags = OptionsOf<typeof GRPO_FLAGS>;

/** The script's command (its --help). */
export const grpoCommand = () => commandOf("train-gsm8k-agent", "GRPO: teach the calculator agent from its own rollouts", GRPO_FLAGS);

/** train-gsm8k-agent --preset tiny: GRPO from the tiny SFT model, LoRA on its NF4-quantized weights. */
export const TINY_GRPO: Partial<GrpoFlags> = {
  model_path: path.join(TINY_OUTPUT_DIR, "sft", "final"),
  dataset: "synthetic",
  quantize: "nf4",
  tools_in_prompt: false,
  max_steps: 24,
  prompts_per_step: 8,
  samples_per_prompt: 8,
  max_new_tokens: 160,
  max_turns: 5,
  temperature: 0.7, // T = 1 on a 0.8M-parameter model mostly samples digit typos
  beta: 0.0,
  learning_rate: 5e-4,
  lora_r: 16,
  lora_alpha: 32,
  micro_batch_size: 16,
  loss_type: "dr_grpo",
  save_steps: 10,
  eval_samples: 0,
  output_dir: path.join(TINY_OUTPUT_DIR, "grpo"),
};

/** argv → the GRPO run's config, with `--preset tiny`'s table under the explicit flags. */
export const parseGrpoArgs = (argv: string[]): GrpoFlags => parseFlags(grpoCommand(), GRPO_FLAGS, argv, { tiny: TINY_GRPO }).o;

/** The run's configuration: the script's flags as parsed (grpo-flags.ts), plus what only a program
 *  passes. run.json holds it; a resumed run must match its `runIdentity`. */
export type GrpoRunConfig = GrpoFlags & {
  synthetic?: Omit<SyntheticOptions, "n" | "seed">; // default: the tiny preset's problems with --preset tiny
  quiet?: boolean;
};

/** The values the flags leave open, settled once (what run.json and the resume check see), checked,
 *  and the reward's weights: with an environment and the default weights, the environment's reward. */
export function settleGrpoConfig(options: GrpoRunConfig, env: Pick<EnvironmentFactory, "family"> | null) {
  const ranges = env ? defaultTaskRanges(env.family, options.max_samples ?? 100) : null;
  const cfg: GrpoRunConfig & { output_dir: string; epsilon_high: number } = {
    ...options,
    output_dir: options.output_dir ?? defaultOutputDir(options.model_path, "grpo"),
    epsilon_high: options.epsilon_high ?? defaultEpsilonHigh(options.loss_type, options.epsilon),
    importance_sampling_level: importanceLevel({ lossType: options.loss_type, importanceSamplingLevel: options.importance_sampling_level }),
    synthetic: options.synthetic ?? (options.preset === "tiny" ? TINY_PROBLEMS : undefined),
    // With --env, the task ranges as run.json records them (and the resume check compares).
    ...(ranges ? { env_tasks: options.env_tasks ?? ranges.train, env_eval_tasks: options.env_eval_tasks ?? ranges.heldOut } : {}),
  };
  if (env) {
    checkTaskRange(env.family, "--env_tasks", cfg.env_tasks!);
    checkTaskRange(env.family, "--env_eval_tasks", cfg.env_eval_tasks!);
  }
  if (!(cfg.top_p > 0 && cfg.top_p <= 1)) throw new UsageError(`--top_p ${cfg.top_p}: expected a number above 0 and at most 1`);
  if (!(cfg.epsilon >= 0 && cfg.epsilon < 1))
    throw new UsageError(
      `--epsilon ${cfg.epsilon}: expected a number >= 0 and below 1 (the ratio is clipped to [1 - epsilon, 1 + epsilon_high])`,
    );
  const weightSpec = cfg.env && cfg.reward_weights === GRPO_FLAGS.reward_weights.default ? "env=1" : cfg.reward_weights;
  const rewardWeights = usage("--reward_weights", () => parseRewardWeights(weightSpec));
  return { cfg, rewardWeights };
}
