/** Memory soak of the tiny GRPO run: the preset's settings for many steps, then the RSS curve (and
 *  its JS-heap and wasm-heap parts) every --every steps, and the growth against step 20. Memory is
 *  measured here, outside the test suite (the suite only checks that a short run does not grow).
 *  npx tsx scripts/bench-soak.ts --steps 500 [--model_path outputs/tiny/sft/final] [--output_dir DIR] */
import { Command } from "commander";
import { existsSync } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { promises as fs } from "node:fs";
import { shutdownCalculator } from "../src/agents/calculator.ts";
import { parseIntArg, runMain } from "../src/cli.ts";
import { TINY_BASE_DIR, TINY_GRPO, TINY_PROBLEMS } from "../src/presets/tiny.ts";
import { defaultsOf } from "../src/run/flags.ts";
import { GRPO_FLAGS } from "../src/run/grpo-flags.ts";
import { runGrpo } from "../src/run/grpo-run.ts";
import { readMetrics } from "../src/trainer/metrics.ts";

const sftOut = TINY_GRPO.model_path as string;
const program = new Command("bench-soak")
  .description("RSS over a long tiny GRPO run")
  .option("--steps <n>", "GRPO steps", parseIntArg("steps", 21), 500)
  .option("--every <n>", "print one row per this many steps", parseIntArg("every", 1), 20)
  .option("--model_path <dir>", "policy to start from (default: the tiny SFT output if present, else the tiny base)", existsSync(sftOut) ? sftOut : TINY_BASE_DIR)
  .option("--output_dir <dir>", "run folder (default: a temp folder)")
  .option("--backend <name>", "tfjs backend", "wasm");

await runMain(async () => {
  const o = program.parse(process.argv).opts();
  const out = o.output_dir ?? path.join(await fs.mkdtemp(path.join(os.tmpdir(), "marl-soak-")), "grpo");
  try {
    // The preset's run, longer: its flags with the step count, start and folder of this bench.
    await runGrpo({
      ...defaultsOf(GRPO_FLAGS), ...TINY_GRPO, synthetic: TINY_PROBLEMS, model_path: o.model_path, max_steps: o.steps, output_dir: out,
      backend: o.backend, quiet: true,
    });
  } finally {
    await shutdownCalculator();
  }
  const m = await readMetrics(path.join(out, "metrics.jsonl"));
  const mb = (x: unknown) => ((x as number) / 1024 / 1024).toFixed(0);
  const ref = m.find((r) => r.step === 20)!;
  process.stdout.write("step  rss_MB  heap_MB  wasm_MB  tensors  rss_vs_step20\n");
  for (const r of m.filter((r) => typeof r.rss_bytes === "number" && ((r.step as number) % o.every === 0 || r.step === 1)))
    process.stdout.write(`${String(r.step).padStart(4)}  ${mb(r.rss_bytes).padStart(6)}  ${mb(r.heap_bytes).padStart(7)}  ${mb(r.wasm_bytes).padStart(7)}  ${String(r.tensors).padStart(7)}  ${(((r.rss_bytes as number) / (ref.rss_bytes as number) - 1) * 100).toFixed(1).padStart(6)}%\n`);
  process.stdout.write(`metrics: ${path.join(out, "metrics.jsonl")}\n`);
});
