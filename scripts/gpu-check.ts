/** npm run gpu-check — what this machine's GPU does with the trainer, in one run of a few minutes: the
 *  WebGPU adapter and its limits, the golden parity subset on webgpu (vitest, CI=true), the small
 *  bench, and one GRPO step of the 0.5B's shape (random weights, NF4 base, LoRA r16 on all modules,
 *  4 questions × 8 rollouts × 256 new tokens after prompts of 220 tokens; advantages ±1, as random
 *  weights earn no reward), rollouts and update timed apart; one JSON record in --out.
 *  A software adapter measures nothing a GPU would: it is refused unless given
 *  `--allow-software --config small` (CI runs that form, with a short step, so the script cannot rot).
 *  Leaves out: the real tokenizer and GSM8K prompts (synthetic token ids of the same lengths). */
import { Command } from "commander";
import { spawnSync } from "node:child_process";
import { promises as fs } from "node:fs";
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../src/engine/backend.ts";
import { registerWebgpu } from "../src/engine/webgpu.ts";
import { createModel } from "../src/model/load.ts";
import { LORA_TARGETS } from "../src/model/types.ts";
import { sampleTokens } from "../src/rollout/sampler.ts";
import { runMain } from "../src/run/cli.ts";
import { grpoStep, type GrpoRollout } from "../src/trainer/grpo.ts";
import { AdamW } from "../src/trainer/optimizer.ts";
import { UsageError } from "../src/util/errors.ts";
import { Rng } from "../src/util/rng.ts";
import { benchContext, BENCH_CONFIGS, tokenBatch, WORKLOADS, type Measurement } from "./lib/bench.ts";

const defaults = { config: "0.5b", out: "outputs/gpu-check.json", allowSoftware: false };
const opts = new Command("gpu-check")
  .description("Adapter, parity subset, small bench and one GRPO step on the webgpu backend; one JSON record")
  .option("--config <name>", "shape of the GRPO step: 0.5b | small", defaults.config)
  .option("--out <file>", "where the JSON record is written", defaults.out)
  .option("--allow-software", "run on a software adapter (only with --config small: checks the script, measures nothing)", false)
  .parse()
  .opts<typeof defaults>();

/** The parity subset: the golden suite and the held-out Qwen2 variant against PyTorch, on webgpu. */
const PARITY = ["test/engine/webgpu/parity.test.ts", "test/engine/webgpu/variant.test.ts"];
/** The GRPO step per config: questions × samples rollouts of promptLen + newTokens. */
const STEP = {
  "0.5b": { questions: 4, samples: 8, promptLen: 220, newTokens: 256, microBatch: 8 },
  small: { questions: 2, samples: 2, promptLen: 16, newTokens: 8, microBatch: 4 },
} as const;

const now = () => performance.now() / 1000;

await runMain(async () => {
  const t0 = now();
  if (!(opts.config in STEP)) throw new UsageError(`--config must be 0.5b or small, got "${opts.config}"`);
  const probe = await registerWebgpu(false);
  if (!probe.ok) throw new UsageError(`gpu-check: ${probe.reason}`);
  const { info } = probe;
  if (info.fallback && !(opts.allowSoftware && opts.config === "small"))
    throw new UsageError(
      `gpu-check: only a software adapter (${info.description}); it measures nothing a GPU would. To check the script itself: npm run gpu-check -- --allow-software --config small`,
    );
  await initBackend("webgpu");
  console.log(`adapter: ${info.description}${info.fallback ? " (software)" : ""}`);
  console.log(`limits: ${JSON.stringify(info.limits)}`);

  // 1. parity: a child vitest on the same adapter (Dawn's options and the adapter's env pass through)
  const tp = now();
  const vt = spawnSync("npx", ["vitest", "run", ...PARITY], { env: { ...process.env, CI: "true" }, encoding: "utf8", stdio: "pipe" });
  const parity = { files: PARITY, passed: vt.status === 0, seconds: round(now() - tp) };
  console.log(`parity subset: ${parity.passed ? "passed" : "FAILED"} in ${parity.seconds} s`);
  if (!parity.passed) process.stderr.write(`${(vt.stdout ?? "").slice(-4000)}${(vt.stderr ?? "").slice(-2000)}\n`);

  // 2. the small bench
  const bench: Measurement[] = [];
  const ctx = benchContext("small", "none", info.fallback ? 1 : 3);
  for (const w of WORKLOADS.filter((x) => ["forward", "fwd_bwd", "decode"].includes(x.name))) bench.push(...(await w.run(ctx)));
  ctx.dispose();
  for (const m of bench) console.log(`bench small ${m.workload}: ${m.tokens_per_s} tokens/s`);

  // 3. one GRPO step of the config's shape
  const grpo = await grpoShape(opts.config as keyof typeof STEP);
  console.log(
    `grpo ${opts.config}: rollouts ${grpo.rolloutSeconds} s (${grpo.sampledTokensPerS} sampled tokens/s at batch ${grpo.rows}), update ${grpo.updateSeconds} s`,
  );

  const record = {
    adapter: info.description,
    software: info.fallback,
    limits: info.limits,
    parity,
    bench,
    grpo,
    seconds: round(now() - t0),
  };
  await fs.mkdir(path.dirname(opts.out), { recursive: true });
  await fs.writeFile(opts.out, JSON.stringify(record, null, 2) + "\n");
  console.log(`wrote ${opts.out} (${record.seconds} s in all)`);
  if (!parity.passed) throw new Error("gpu-check: the parity subset failed on this adapter (output above)");
});

function round(x: number): number {
  return Math.round(x * 100) / 100;
}

/** Rollouts (prefill, then newTokens − 1 decode steps with the device sampler at temperature 1, the
 *  base unpacked as rollouts do) and one GRPO update (β 0.04: the KL reference pass included). */
async function grpoShape(name: keyof typeof STEP) {
  const s = STEP[name],
    config = BENCH_CONFIGS[name];
  const rows = s.questions * s.samples;
  const model = await createModel(config, {
    seed: 0,
    quantize: "nf4",
    lora: { r: 16, alpha: 32, dropout: 0, targetModules: [...LORA_TARGETS] },
  });
  const prompts = tokenBatch(s.questions, s.promptLen, config.vocabSize, 3).flatMap((p) => Array.from({ length: s.samples }, () => p));
  const rng = new Rng(1);
  const tr = now();
  const release = model.unpackBase?.() ?? (() => {});
  const generated: number[][] = prompts.map(() => []);
  try {
    const { logits, cache } = model.prefill(
      prompts,
      prompts.map((r) => r.map(() => 1)),
    );
    let lg = logits;
    for (let t = 0; t < s.newTokens; t++) {
      const { tokens } = await sampleTokens(lg, { temperature: 1 }, rng);
      lg.dispose();
      tokens.forEach((tok, i) => generated[i].push(tok));
      if (t === s.newTokens - 1) break;
      lg = model.decodeStep(tokens, cache);
    }
    cache.dispose();
  } finally {
    release();
  }
  const rolloutSeconds = now() - tr;
  const batch: GrpoRollout[] = prompts.map((p, i) => ({
    ids: [...p, ...generated[i]],
    lossMask: [...p.map(() => 0), ...generated[i].map(() => 1)],
    advantage: i % 2 ? 1 : -1,
  }));
  const optimizer = new AdamW(model.trainableVariables(), { lr: 1e-5 });
  const tu = now();
  const stats = await grpoStep(model, optimizer, batch, {
    beta: 0.04,
    epsilon: 0.2,
    epsilonHigh: 0.28,
    lossType: "grpo",
    maxNewTokens: s.newTokens,
    numIterations: 1,
    maxGradNorm: 1,
    lr: 1e-5,
    microBatchSize: s.microBatch,
  });
  const updateSeconds = now() - tu;
  optimizer.dispose();
  model.dispose();
  if (!Number.isFinite(stats.loss)) throw new Error(`gpu-check: the GRPO step's loss is ${stats.loss}`);
  return {
    config: name,
    rows,
    promptTokens: s.promptLen,
    newTokens: s.newTokens,
    rolloutSeconds: round(rolloutSeconds),
    sampledTokensPerS: round((rows * s.newTokens) / rolloutSeconds),
    updateSeconds: round(updateSeconds),
    loss: stats.loss,
    tokens: stats.tokens,
    backend: tf.getBackend(),
  };
}
