/** Flags shared by the scripts, as flag tables (flags.ts): model flags (all four scripts; each rollout
 *  engine's flags are its own, rollout/engines/), LoRA and optimizer flags (the two training scripts),
 *  and `--preset`, which fills in every flag the user did not give on the command line, so explicit
 *  flags always win. */
import { BUILTIN_TOOLS, DEFAULT_TOOLS } from "../agents/builtin.ts";
import { Option, type Command } from "commander";
import { AUTO_ORDER, BACKEND_NAMES } from "../kernels/backend.ts";
import { parseChoice, parseFloatArg, parseIntArg, parseList } from "./cli.ts";
import { UsageError } from "../util/errors.ts";
import { splitToolSpecs } from "../agents/toolset.ts";
import { DIALECTS, type Dialect } from "../envs/families.ts";
import { expandRanges, openEnvironmentServer } from "../envs/episodes.ts";
import type { EnvironmentFactory } from "../envs/types.ts";
import { LORA_TARGETS, type LoraTarget, type Quantize } from "../model/types.ts";
import { SCHEDULES, type ScheduleType } from "../trainer/schedule.ts";
import { MAX_WASM_THREADS, resolveThreads, type ThreadsSpec } from "../kernels/wasm/threads.ts";
import { addFlags, flag, optional, parseFlags, toggle, type FlagTable } from "./flags.ts";

export const PRESETS = ["tiny"] as const;
export type PresetName = (typeof PRESETS)[number];
export const QUANTIZE_CHOICES: readonly Quantize[] = ["none", "int8", "nf4"];
export const BACKENDS = BACKEND_NAMES;

/** Model, backend and seed flags of every script. */
export function modelFlags(d: { modelPath: string; quantize: Quantize }) {
  return {
    preset: optional(
      "--preset <name>",
      `fill every flag not given with a preset's values (${PRESETS.join(", ")})`,
      parseChoice("preset", PRESETS),
    ),
    model_path: flag(
      "--model_path <id|dir>",
      "hub id, Hugging Face folder, full-weights output, or a PEFT adapter folder (its base is read from adapter_config.json)",
      undefined,
      d.modelPath,
    ),
    quantize: flag(
      "--quantize <kind>",
      `frozen base weights: ${QUANTIZE_CHOICES.join(", ")}`,
      parseChoice("quantize", QUANTIZE_CHOICES),
      d.quantize,
    ),
    backend: flag(
      "--backend <name>",
      `tfjs backend: ${BACKENDS.join(", ")} (auto: ${AUTO_ORDER})`,
      parseChoice("backend", BACKENDS),
      "auto" as (typeof BACKENDS)[number],
      { free: true },
    ),
    threads: flag("--threads <n>", THREADS_HELP, parseThreads, "auto" as ThreadsSpec, { free: true }),
    seed: flag("--seed <n>", "random seed (weights of a fresh adapter, data order, sampling)", parseIntArg("seed", 0), 0),
    tools_in_prompt: toggle(
      "--no-tools_in_prompt",
      "do not render the tool schemas into the system prompt (the model learned the format in SFT)",
    ),
    unpack_base: toggle(
      "--no-unpack_base",
      "keep an int8/nf4 base packed while generating: less memory, slower decoding (default: unpacked to f32 for as long as it generates)",
      undefined,
      { free: true },
    ),
  } satisfies FlagTable;
}

const THREADS_HELP =
  `wasm threads: auto (every core this process may use, up to ${MAX_WASM_THREADS}) or a count; ` + "1 = the single-threaded build";

/** `--threads`: auto or 1–8 (every script and bench takes it). */
export function threadsOption(): Option {
  return new Option("--threads <n>", THREADS_HELP).argParser(parseThreads).default("auto");
}

export function parseThreads(value: string): ThreadsSpec {
  if (value === "auto") return "auto";
  try {
    return resolveThreads(value);
  } catch {
    throw new UsageError(`--threads ${JSON.stringify(value)}: expected auto or a whole number from 1 to ${MAX_WASM_THREADS}`);
  }
}

export function addModelOptions(cmd: Command, defaults: { modelPath: string; quantize: Quantize }): Command {
  return addFlags(cmd, modelFlags(defaults));
}

/** The run's tools (agents/toolset.ts): --tools, --tool_timeout, --tool_max_chars (GRPO, eval, chat). */
export function toolFlags() {
  return {
    tools: flag(
      "--tools <list>",
      `tools the agent may call, comma-separated: a built-in name (${BUILTIN_TOOLS.list()
        .map((t) => t.name)
        .join(", ")}), mcp:<command line> (an MCP server over stdio) or mcp:<http(s) URL> (Streamable HTTP)`,
      undefined,
      DEFAULT_TOOLS.join(","),
    ),
    tool_timeout: flag(
      "--tool_timeout <s>",
      "seconds one tool call may take before it returns an error to the model",
      parseFloatArg("tool_timeout", 0.001),
      30,
    ),
    tool_max_chars: flag(
      "--tool_max_chars <n>",
      "longest tool result the model reads; longer ones are cut with a marker",
      parseIntArg("tool_max_chars", 100),
      4000,
    ),
  } satisfies FlagTable;
}

const ENV_HELP =
  "roll out against an AgentGym HTTP environment server instead of a dataset: each assistant turn is " +
  "an action, read as the environment's AgentGym client reads it; the episode's score by the " +
  "environment's own rule is the reward component env";

/** --env URL and --env_dialect: roll out against an AgentGym environment server (GRPO, eval; `help`
 *  says what the script does with it). */
export function envFlags(help = ENV_HELP) {
  return {
    env: optional("--env <url>", help),
    env_dialect: flag(
      "--env_dialect <kind>",
      "the server's family, which fixes its request shapes, action format, scoring and instruction: " +
        "textcraft, babyai, sciworld, alfworld, webshop, sqlgym (AgentGym's servers), id or env_idx " +
        "(generic: the shipped guess-number server), auto (from the server's GET / banner; generic id when " +
        "it names no family)",
      parseChoice("env_dialect", DIALECTS),
      "auto" as Dialect,
    ),
  } satisfies FlagTable;
}

/** --env as an environment factory, checked by one real reset (envs/episodes.ts), or null without it. */
export async function environmentServer(o: {
  env?: string;
  env_dialect: Dialect;
  env_tasks?: string;
  tool_timeout: number;
  tool_max_chars: number;
}): Promise<EnvironmentFactory | null> {
  if (!o.env) return null;
  const probeIdx = o.env_tasks ? expandRanges(o.env_tasks)[0] : 0;
  return openEnvironmentServer(o.env, { dialect: o.env_dialect, timeoutMs: o.tool_timeout * 1000, maxChars: o.tool_max_chars, probeIdx });
}

/** --tools/--tool_timeout/--tool_max_chars as the tool-set options of every run. */
export function toolConfig(o: { tools?: string; tool_timeout?: number; tool_max_chars?: number }): {
  tools: string[];
  toolTimeout?: number;
  toolMaxChars?: number;
} {
  return { tools: splitToolSpecs(o.tools ?? DEFAULT_TOOLS.join(",")), toolTimeout: o.tool_timeout, toolMaxChars: o.tool_max_chars };
}

/** LoRA flags shared by SFT and GRPO. */
export function loraFlags(d: { r: number; alpha: number }) {
  return {
    lora_r: flag("--lora_r <n>", "LoRA rank", parseIntArg("lora_r", 1), d.r),
    lora_alpha: flag("--lora_alpha <x>", "LoRA alpha (scaling = alpha / r)", parseFloatArg("lora_alpha", 0), d.alpha),
    lora_dropout: flag("--lora_dropout <x>", "dropout on the LoRA input while training", parseFloatArg("lora_dropout", 0, 0.99), 0),
    lora_targets: flag(
      "--lora_targets <list>",
      `modules that get adapters: comma-separated subset of ${LORA_TARGETS.join(",")}, or all`,
      parseList("lora_targets", [...LORA_TARGETS, "all"]),
      ["all"],
    ),
  } satisfies FlagTable;
}

export function loraTargets(list: string[]): LoraTarget[] {
  return list.includes("all") ? [...LORA_TARGETS] : (list as LoraTarget[]);
}

/** Optimizer flags shared by SFT and GRPO (AdamW + a learning-rate schedule with warmup). */
export function optimizerFlags(d: { lr: number; scheduler: ScheduleType; warmupRatio: number }) {
  return {
    learning_rate: flag("--learning_rate <x>", "peak learning rate", parseFloatArg("learning_rate", 0), d.lr),
    lr_scheduler: flag(
      "--lr_scheduler <kind>",
      `${SCHEDULES.join(", ")} (with warmup)`,
      parseChoice("lr_scheduler", SCHEDULES),
      d.scheduler,
    ),
    warmup_ratio: flag(
      "--warmup_ratio <x>",
      "share of steps spent warming the learning rate up from 0",
      parseFloatArg("warmup_ratio", 0, 1),
      d.warmupRatio,
    ),
    weight_decay: flag("--weight_decay <x>", "AdamW decoupled weight decay", parseFloatArg("weight_decay", 0), 0.0),
    max_grad_norm: flag("--max_grad_norm <x>", "clip the global gradient norm to this", parseFloatArg("max_grad_norm", 0), 1.0),
  } satisfies FlagTable;
}

/** A training script's model, LoRA (r 16, alpha 32) and optimizer flags with its defaults. */
export function trainingFlags(d: { quantize: Quantize; lr: number; scheduler: ScheduleType; warmupRatio: number }) {
  return {
    ...modelFlags({ modelPath: "Qwen/Qwen2.5-0.5B", quantize: d.quantize }),
    ...loraFlags({ r: 16, alpha: 32 }),
    ...optimizerFlags(d),
  };
}

/** The default run folder: outputs/<model name>/<stage>. */
export function defaultOutputDir(modelPath: string, stage: string): string {
  const name =
    modelPath
      .replace(/[\\/]+$/, "")
      .split(/[\\/]/)
      .slice(-1)[0] || "model";
  return `outputs/${name}/${stage}`;
}

/** Parse argv for a command built outside a flag table (serve, report): commander errors become
 *  UsageError, --help exits 0, the preset fills the flags not given. */
export function parseWithPreset(cmd: Command, argv: string[], presets: Partial<Record<PresetName, Record<string, unknown>>>) {
  const { preset, o, explicit } = parseFlags<FlagTable, PresetName>(cmd, {}, argv, presets);
  return { preset, o: o as Record<string, any>, explicit };
}
