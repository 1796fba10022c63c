/** scripts/serve.ts's flags → a validated server config (the workspace is made if missing; nothing
 *  else is written here). Protocol flags override every served scenario's defaults. */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { Command } from "commander";
import { parseChoice, parseFloatArg, parseIntArg, parseList } from "../run/cli.ts";
import { UsageError } from "../util/errors.ts";
import { BACKENDS, parseWithPreset, QUANTIZE_CHOICES, threadsOption } from "../run/options.ts";
import type { ServeOptions } from "./http.ts";
import { makeScenario, SCENARIO_IDS, type ScenarioId, type ScenarioProtocol } from "./scenarios.ts";

export function serveCommand(): Command {
  return new Command()
    .name("serve")
    .description(
      "AutoRL-Bench-compatible grading server: agents train models in --workspace and submit them over " +
        "HTTP to be scored against the base model",
    )
    .exitOverride()
    .configureOutput({ outputError: () => {} })
    .requiredOption("--workspace <dir>", "the agents' folder: submitted model paths must resolve inside it (made if missing)")
    .option("--port <n>", "TCP port (0: any free one)", parseIntArg("port", 0, 65535), 8000)
    .option("--host <addr>", "address to bind; the default answers this machine only", "127.0.0.1")
    .option(
      "--scenarios <list>",
      `scenarios to serve, comma-separated (${SCENARIO_IDS.join(", ")}); the first is the default of ` +
        `/submit (default: tiny, and gsm8k where its model and data are on this machine)`,
      parseList("scenarios", SCENARIO_IDS),
    )
    .option(
      "--time_budget <seconds>",
      "agents' time budget, written into <workspace>/run_meta.json only where that file (AutoRL-Bench's " +
        "harness writes it first) sets none; evaluations are refused once it is spent (default: none)",
      parseIntArg("time_budget", 1),
    )
    .option("--state_dir <dir>", "where baselines, the submission history and cached evaluations go (default <workspace>/grading)")
    .option(
      "--max_queue <n>",
      "evaluations that may wait behind the running one; more get 429 with Retry-After",
      parseIntArg("max_queue", 0),
      8,
    )
    .option(
      "--max_model_gb <x>",
      "refuse submitted folders whose weights and configs are larger than this",
      parseFloatArg("max_model_gb", 0),
      8,
    )
    .option("--gsm8k_model <id|dir>", "base model of the gsm8k scenario", "Qwen/Qwen2.5-0.5B")
    .option(
      "--gsm8k_data <name|path>",
      "GSM8K for the gsm8k scenario: gsm8k (Hugging Face cache) or a folder / .jsonl / .parquet holding the splits",
      "gsm8k",
    )
    .option("--max_samples <n>", "questions per evaluation (default: tiny 200, gsm8k the whole test split)", parseIntArg("max_samples", 1))
    .option("--samples_per_prompt <k>", "samples per question (k > 1 needs --temperature > 0)", parseIntArg("samples_per_prompt", 1))
    .option("--temperature <t>", "sampling temperature; 0 = greedy (default)", parseFloatArg("temperature", 0, 10))
    .option("--batch_size <n>", "questions per decode batch (default: tiny 16, gsm8k 8)", parseIntArg("batch_size", 1))
    .option(
      "--max_new_tokens <n>",
      "token budget per rollout over all turns (default: tiny 160, gsm8k 512)",
      parseIntArg("max_new_tokens", 1),
    )
    .option("--max_turns <n>", "assistant turns per rollout (default: tiny 5, gsm8k 8)", parseIntArg("max_turns", 1))
    .option(
      "--quantize <kind>",
      `base weights of every evaluated model: ${QUANTIZE_CHOICES.join(", ")} (default none)`,
      parseChoice("quantize", QUANTIZE_CHOICES),
    )
    .option("--backend <name>", `tfjs backend: ${BACKENDS.join(", ")}`, parseChoice("backend", BACKENDS))
    .addOption(threadsOption())
    .option("--seed <n>", "sampling seed of the evaluation (default 0)", parseIntArg("seed", 0));
}

/** argv → ServeOptions (log goes to stderr). */
export async function parseServeArgs(
  argv: string[],
  log: (line: string) => void = (l) => process.stderr.write(l + "\n"),
): Promise<ServeOptions> {
  const { o } = parseWithPreset(serveCommand(), argv, {});
  // The protocol flags have the protocol's names.
  const overrides: Partial<ScenarioProtocol> = {
    max_samples: o.max_samples,
    samples_per_prompt: o.samples_per_prompt,
    temperature: o.temperature,
    batch_size: o.batch_size,
    max_new_tokens: o.max_new_tokens,
    max_turns: o.max_turns,
    quantize: o.quantize,
    backend: o.backend,
    threads: o.threads,
    seed: o.seed,
  };
  if ((o.samples_per_prompt ?? 1) > 1 && !(o.temperature > 0))
    throw new UsageError(
      `--samples_per_prompt ${o.samples_per_prompt} with a greedy evaluation: the samples would be identical; add --temperature > 0`,
    );
  const explicit = o.scenarios !== undefined;
  const ids = explicit ? [...new Set(o.scenarios as ScenarioId[])] : [...SCENARIO_IDS];

  const stat = await fs.stat(o.workspace).catch(() => null);
  if (stat && !stat.isDirectory()) throw new UsageError(`--workspace ${o.workspace} is a file; expected a folder`);
  await fs.mkdir(o.workspace, { recursive: true });
  const workspace = await fs.realpath(o.workspace);
  const stateDir = path.resolve(o.state_dir ?? path.join(workspace, "grading"));
  if (
    o.gsm8k_data !== "gsm8k" &&
    o.gsm8k_data !== "openai/gsm8k" &&
    ids.includes("gsm8k") &&
    !(await fs.stat(o.gsm8k_data).catch(() => null))
  )
    throw new UsageError(`--gsm8k_data ${o.gsm8k_data}: no such file or folder; expected gsm8k or a GSM8K .jsonl/.parquet path or folder`);
  const scenarios = ids.map((id) =>
    makeScenario(id, { stateDir, explicit, gsm8kModel: o.gsm8k_model, gsm8kData: o.gsm8k_data, overrides }),
  );
  return {
    host: o.host,
    port: o.port,
    workspace,
    stateDir,
    scenarios,
    maxQueue: o.max_queue,
    maxModelBytes: Math.floor(o.max_model_gb * 2 ** 30),
    timeBudget: o.time_budget ?? null,
    log,
  };
}
