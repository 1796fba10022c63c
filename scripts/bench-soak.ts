/** Memory soak of the tiny GRPO run: the preset's settings for many steps, then the RSS curve (and
 *  its JS-heap and wasm-heap parts) every --every steps, and the growth against step 20. Memory is
 *  measured here, outside the test suite (the suite only checks that a short run does not grow).
 *  npx tsx scripts/bench-soak.ts --steps 500 [--model_path outputs/tiny/sft/final] [--output_dir DIR] [--prompts_per_step N]
 *  npx tsx scripts/bench-soak.ts --from DIR/metrics.jsonl   (the table of a run stopped early) */
import { Command } from "commander";
import { existsSync } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { promises as fs } from "node:fs";
import { shutdownCalculator } from "../src/agents/calculator.ts";
import { parseIntArg, runMain } from "../src/run/cli.ts";
import { TINY_BASE_DIR, TINY_PROBLEMS } from "../src/presets/tiny.ts";
import { TINY_GRPO } from "../src/run/grpo-flags.ts";
import { defaultsOf } from "../src/run/flags.ts";
import { GRPO_FLAGS } from "../src/run/grpo-flags.ts";
import { runGrpo } from "../src/run/grpo-run.ts";
import { readMetrics } from "../src/trainer/metrics.ts";

const sftOut = TINY_GRPO.model_path as string;
const program = new Command("bench-soak")
  .description("RSS over a long tiny GRPO run")
  .option("--steps <n>", "GRPO steps", parseIntArg("steps", 21), 500)
  .option("--every <n>", "print one row per this many steps", parseIntArg("every", 1), 20)
  .option(
    "--model_path <dir>",
    "policy to start from (default: the tiny SFT output if present, else the tiny base)",
    existsSync(sftOut) ? sftOut : TINY_BASE_DIR,
  )
  .option("--output_dir <dir>", "run folder (default: a temp folder)")
  .option(
    "--prompts_per_step <n>",
    "questions per step (default: the preset's); 2 with 8 samples is one micro-batch of 16, the preset's, at a quarter of the rollout time",
    parseIntArg("prompts_per_step", 1),
  )
  .option("--backend <name>", "tfjs backend", "wasm")
  .option("--from <metrics.jsonl>", "print the table of an earlier (or stopped) run's metrics instead of running");

await runMain(async () => {
  const o = program.parse(process.argv).opts();
  const out = o.from ? path.dirname(o.from) : (o.output_dir ?? path.join(await fs.mkdtemp(path.join(os.tmpdir(), "marl-soak-")), "grpo"));
  if (!o.from) {
    try {
      // The preset's run, longer: its flags with the step count, start and folder of this bench.
      await runGrpo({
        ...defaultsOf(GRPO_FLAGS),
        ...TINY_GRPO,
        synthetic: TINY_PROBLEMS,
        model_path: o.model_path,
        max_steps: o.steps,
        output_dir: out,
        ...(o.prompts_per_step ? { prompts_per_step: o.prompts_per_step } : {}),
        backend: o.backend,
        quiet: true,
      });
    } finally {
      await shutdownCalculator();
    }
  }
  const m = (await readMetrics(o.from ?? path.join(out, "metrics.jsonl"))).filter((r) => typeof r.rss_bytes === "number");
  const mb = (x: unknown) => (typeof x === "number" ? (x / 1024 / 1024).toFixed(0) : "-");
  const ref = m.find((r) => r.step === 20) ?? m[0];
  const cols: [string, string][] = [
    ["rss_MB", "rss_bytes"],
    ["heap_MB", "heap_bytes"],
    ["ext_MB", "external_bytes"],
    ["abuf_MB", "array_buffer_bytes"],
    ["wasm_MB", "wasm_bytes"],
  ];
  process.stdout.write(`step  ${cols.map(([c]) => c).join("  ")}  tensors  rss_vs_step${ref.step}\n`);
  for (const r of m.filter((r) => (r.step as number) % o.every === 0 || r.step === 1 || r === m.at(-1)))
    process.stdout.write(
      `${String(r.step).padStart(4)}  ${cols.map(([c, k]) => mb(r[k]).padStart(c.length)).join("  ")}  ${String(r.tensors).padStart(7)}  ${(((r.rss_bytes as number) / (ref.rss_bytes as number) - 1) * 100).toFixed(1).padStart(6)}%\n`,
    );
  // Growth per 100 steps from step 20 on: the least-squares slope of RSS, so one noisy sample does not decide it.
  const tail = m.filter((r) => (r.step as number) >= (ref.step as number));
  if (tail.length >= 2) {
    const xs = tail.map((r) => r.step as number),
      ys = tail.map((r) => (r.rss_bytes as number) / 1024 / 1024);
    const mx = xs.reduce((a, b) => a + b) / xs.length,
      my = ys.reduce((a, b) => a + b) / ys.length;
    const slope = xs.reduce((a, x, i) => a + (x - mx) * (ys[i] - my), 0) / xs.reduce((a, x) => a + (x - mx) ** 2, 0);
    const last = m.at(-1)!;
    process.stdout.write(
      `rss: step 1 ${mb(m[0].rss_bytes)} MB, step ${ref.step} ${mb(ref.rss_bytes)} MB, step ${last.step} ${mb(last.rss_bytes)} MB; ` +
        `max ${mb(Math.max(...tail.map((r) => r.rss_bytes as number)))} MB (${((Math.max(...tail.map((r) => r.rss_bytes as number)) / (ref.rss_bytes as number) - 1) * 100).toFixed(1)}% over step ${ref.step}); ` +
        `slope from step ${ref.step}: ${(slope * 100).toFixed(1)} MB per 100 steps\n`,
    );
  }
  process.stdout.write(`metrics: ${path.join(out, "metrics.jsonl")}\n`);
});
