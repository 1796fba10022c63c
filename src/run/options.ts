/** Flags shared by the four scripts, and `--preset`: a preset fills in every flag the user did not
 *  give on the command line (commander's value source tells which), so explicit flags always win. */
import { Command, CommanderError, Option } from "commander";
import { AUTO_ORDER, BACKEND_NAMES } from "../backend.ts";
import { DIALECTS } from "../envs/agentgym.ts";
import { parseChoice, parseFloatArg, parseIntArg, parseList, UsageError } from "../cli.ts";
import { splitToolSpecs } from "../agents/toolset.ts";
import { LORA_TARGETS, type LoraTarget, type Quantize } from "../model/types.ts";
import { SCHEDULES, type ScheduleType } from "../trainer/schedule.ts";
import { MAX_WASM_THREADS, resolveThreads, type ThreadsSpec } from "../wasm-threads.ts";

export const PRESETS = ["tiny"] as const;
export type PresetName = (typeof PRESETS)[number];
export const QUANTIZE_CHOICES: readonly Quantize[] = ["none", "int8", "nf4"];
export const BACKENDS = BACKEND_NAMES;

export function addModelOptions(cmd: Command, defaults: { modelPath: string; quantize: Quantize }): Command {
  return cmd
    .option("--preset <name>", `fill every flag not given with a preset's values (${PRESETS.join(", ")})`, parseChoice("preset", PRESETS))
    .option("--model_path <id|dir>", "hub id, Hugging Face folder, full-weights output, or a PEFT adapter folder (its base is read from adapter_config.json)", defaults.modelPath)
    .option("--quantize <kind>", `frozen base weights: ${QUANTIZE_CHOICES.join(", ")}`, parseChoice("quantize", QUANTIZE_CHOICES), defaults.quantize)
    .option("--backend <name>", `tfjs backend: ${BACKENDS.join(", ")} (auto: ${AUTO_ORDER})`, parseChoice("backend", BACKENDS), "auto")
    .addOption(threadsOption())
    .option("--seed <n>", "random seed (weights of a fresh adapter, data order, sampling)", parseIntArg("seed", 0), 0)
    .option("--no-tools_in_prompt", "do not render the tool schemas into the system prompt (the model learned the format in SFT)")
    .option("--no-unpack_base", "keep an int8/nf4 base packed while generating: less memory, slower decoding (default: unpacked to f32 for as long as it generates)");
}

/** `--threads`: auto or 1–8 (every script and bench takes it). */
export function threadsOption(): Option {
  return new Option("--threads <n>", `wasm threads: auto (every core this process may use, up to ${MAX_WASM_THREADS}) or a count; 1 = the single-threaded build`)
    .argParser(parseThreads)
    .default("auto");
}

export function parseThreads(value: string): ThreadsSpec {
  if (value === "auto") return "auto";
  try {
    return resolveThreads(value);
  } catch {
    throw new UsageError(`--threads ${JSON.stringify(value)}: expected auto or a whole number from 1 to ${MAX_WASM_THREADS}`);
  }
}

/** The run's tools (agents/toolset.ts): --tools, --tool_timeout, --tool_max_chars. */
export function addToolOptions(cmd: Command): Command {
  return cmd
    .option("--tools <list>", "tools the agent may call, comma-separated: a built-in name (calculator), mcp:<command line> (an MCP server over stdio) or mcp:<http(s) URL> (Streamable HTTP)", "calculator")
    .option("--tool_timeout <s>", "seconds one tool call may take before it returns an error to the model", parseFloatArg("tool_timeout", 0.001), 30)
    .option("--tool_max_chars <n>", "longest tool result the model reads; longer ones are cut with a marker", parseIntArg("tool_max_chars", 100), 4000);
}

/** --env URL and --env_dialect: roll out against an AgentGym environment server (GRPO and eval). */
export function addEnvOptions(cmd: Command): Command {
  return cmd
    .option("--env <url>", "roll out against an AgentGym HTTP environment server instead of a dataset: each assistant turn is an action (its last \"Action:\" line), the environment's reward is the reward component env")
    .option("--env_dialect <kind>", "the server's API: id (TextCraft, BabyAI, ALFWorld, SciWorld) or env_idx (WebShop, SQLGym)", parseChoice("env_dialect", DIALECTS), "id");
}

/** --tools/--tool_timeout/--tool_max_chars as the config fields of every run. */
export function toolConfig(o: Record<string, unknown>): { tools: string[]; toolTimeout: number; toolMaxChars: number } {
  return { tools: splitToolSpecs(o.tools as string), toolTimeout: o.tool_timeout as number, toolMaxChars: o.tool_max_chars as number };
}

/** Option name as commander stores it: --model_path → model_path. */
function key(flag: string): string {
  return flag.replace(/^--/, "");
}

/** Set every option still at its default to the preset's value. Unknown keys are a programming error. */
export function applyPreset(cmd: Command, values: Record<string, unknown>): void {
  const known = new Set(cmd.options.map((o: Option) => o.attributeName()));
  for (const [flag, value] of Object.entries(values)) {
    const name = key(flag);
    if (!known.has(name)) throw new Error(`preset sets unknown option ${flag}`);
    const source = cmd.getOptionValueSource(name);
    if (source === undefined || source === "default") cmd.setOptionValueWithSource(name, value, "config");
  }
}

/** LoRA flags shared by SFT and GRPO. */
function addLoraOptions(cmd: Command, d: { r: number; alpha: number }): Command {
  return cmd
    .option("--lora_r <n>", "LoRA rank", parseIntArg("lora_r", 1), d.r)
    .option("--lora_alpha <x>", "LoRA alpha (scaling = alpha / r)", parseFloatArg("lora_alpha", 0), d.alpha)
    .option("--lora_dropout <x>", "dropout on the LoRA input while training", parseFloatArg("lora_dropout", 0, 0.99), 0)
    .option("--lora_targets <list>", `modules that get adapters: comma-separated subset of ${LORA_TARGETS.join(",")}, or all`, parseList("lora_targets", [...LORA_TARGETS, "all"]), ["all"]);
}

export function loraTargets(list: string[]): LoraTarget[] {
  return list.includes("all") ? [...LORA_TARGETS] : (list as LoraTarget[]);
}

/** The default run folder: outputs/<model name>/<stage>. */
export function defaultOutputDir(modelPath: string, stage: string): string {
  const name = modelPath.replace(/[\\/]+$/, "").split(/[\\/]/).slice(-1)[0] || "model";
  return `outputs/${name}/${stage}`;
}

/** Parse argv (commander errors become UsageError, --help exits 0) and apply the preset if one was
 *  named. Returns the command, its options, and whether a flag was given explicitly. */
export function parseWithPreset(cmd: Command, argv: string[], presets: Partial<Record<PresetName, Record<string, unknown>>>) {
  try {
    cmd.parse(argv);
  } catch (err) {
    if (err instanceof CommanderError) {
      if (err.exitCode === 0) process.exit(0); // --help
      throw new UsageError(err.message.replace(/^error: /, ""));
    }
    throw err;
  }
  const preset = cmd.getOptionValue("preset") as PresetName | undefined;
  const values = preset ? presets[preset] : undefined;
  if (values) applyPreset(cmd, values);
  const explicit = (k: string) => !["default", undefined].includes(cmd.getOptionValueSource(k));
  return { preset, o: cmd.opts(), explicit };
}

/** Optimizer flags shared by SFT and GRPO (AdamW + a learning-rate schedule with warmup). */
function addOptimizerOptions(cmd: Command, d: { lr: number; scheduler: ScheduleType; warmupRatio: number }): Command {
  return cmd
    .option("--learning_rate <x>", "peak learning rate", parseFloatArg("learning_rate", 0), d.lr)
    .option("--lr_scheduler <kind>", `${SCHEDULES.join(", ")} (with warmup)`, parseChoice("lr_scheduler", SCHEDULES), d.scheduler)
    .option("--warmup_ratio <x>", "share of steps spent warming the learning rate up from 0", parseFloatArg("warmup_ratio", 0, 1), d.warmupRatio)
    .option("--weight_decay <x>", "AdamW decoupled weight decay", parseFloatArg("weight_decay", 0), 0.0)
    .option("--max_grad_norm <x>", "clip the global gradient norm to this", parseFloatArg("max_grad_norm", 0), 1.0);
}

/** A training script's command: model, LoRA (r 16, alpha 32) and optimizer flags with its defaults. */
export function trainingCommand(name: string, description: string, d: { quantize: Quantize; lr: number; scheduler: ScheduleType; warmupRatio: number }): Command {
  const base = new Command().name(name).description(description).exitOverride().configureOutput({ outputError: () => {} });
  const cmd = addModelOptions(base, { modelPath: "Qwen/Qwen2.5-0.5B", quantize: d.quantize });
  return addOptimizerOptions(addLoraOptions(cmd, { r: 16, alpha: 32 }), d);
}
