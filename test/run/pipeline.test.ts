/** The tiny pipeline end to end, shortened: SFT (full) → GRPO (LoRA on NF4) → files and metrics a
 *  run must leave; and GRPO resume equivalence: N steps = N/2 steps, resume, N/2 steps. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { shutdownCalculator } from "../../src/agents/calculator.ts";
import { TINY_PROBLEMS } from "../../src/presets/tiny.ts";
import { readMetrics } from "../../src/trainer/metrics.ts";
import { runGrpo, type GrpoRunConfig } from "../../src/run/grpo-run.ts";
import { runSft, type SftRunConfig } from "../../src/run/sft-run.ts";
import { defaultsOf } from "../../src/run/flags.ts";
import { GRPO_FLAGS } from "../../src/run/grpo-flags.ts";
import { SFT_FLAGS } from "../../src/run/sft-flags.ts";
import { evenShare, registerReward } from "./helpers/reward.ts";
import { makeTinyModelDir } from "./helpers/tiny-fixture.ts";

let base: string;
let root: string;
let sftDir: string;
let sft: Awaited<ReturnType<typeof runSft>>;
beforeAll(async () => {
  await initBackend("wasm");
  base = await makeTinyModelDir();
  root = await fs.mkdtemp(path.join(os.tmpdir(), "marl-run-"));
  sftDir = path.join(root, "sft");
  sft = await runSft(sftCfg(sftDir)); // both tests start from it
});
afterAll(async () => {
  await shutdownCalculator();
});

const sftCfg = (output_dir: string): SftRunConfig => ({
  ...defaultsOf(SFT_FLAGS),
  model_path: base,
  dataset: "synthetic",
  synthetic: TINY_PROBLEMS,
  max_samples: 8,
  batch_size: 4,
  learning_rate: 1e-3,
  lr_scheduler: "constant",
  warmup_ratio: 0,
  max_length: 512,
  lora_r: 4,
  lora_alpha: 8,
  full: true,
  tools_in_prompt: false,
  eval_samples: 4,
  eval_max_new_tokens: 24,
  max_turns: 3,
  output_dir,
  backend: "wasm",
  quiet: true,
});

// Random weights never answer right, so every group would carry no signal: reward the share of
// even token ids instead, which varies between samples.
const EVEN = registerReward("even", evenShare);

const grpoCfg = (model_path: string, output_dir: string, over: Partial<GrpoRunConfig> = {}): GrpoRunConfig => ({
  ...defaultsOf(GRPO_FLAGS),
  model_path,
  dataset: "synthetic",
  synthetic: TINY_PROBLEMS,
  max_steps: 2,
  prompts_per_step: 2,
  samples_per_prompt: 3,
  max_new_tokens: 24,
  max_turns: 3,
  temperature: 1,
  beta: 0.04,
  epsilon: 0.2,
  epsilon_high: 0.2,
  reward_weights: EVEN,
  learning_rate: 1e-2,
  micro_batch_size: 4,
  lora_r: 4,
  lora_alpha: 8,
  quantize: "nf4",
  tools_in_prompt: false,
  save_steps: 1,
  save_total_limit: 3,
  seed: 3,
  output_dir,
  backend: "wasm",
  quiet: true,
  ...over,
});

describe("tiny pipeline", () => {
  it("SFT then GRPO leave the files and metrics a run must produce", async () => {
    expect(sft.steps).toBe(2);
    expect(Number.isFinite(sft.finalLoss)).toBe(true);
    for (const f of [
      "run.json",
      "metrics.jsonl",
      "report.html",
      "eval.json",
      "final/config.json",
      "final/model.safetensors",
      "final/tokenizer.json",
    ])
      await expect(fs.stat(path.join(sftDir, f)), f).resolves.toBeTruthy();
    const sftMetrics = await readMetrics(path.join(sftDir, "metrics.jsonl"));
    expect(sftMetrics.filter((m) => typeof m.loss === "number")).toHaveLength(2);
    expect(sftMetrics.at(-1)).toHaveProperty("eval_accuracy");
    expect(sft.eval?.n).toBe(4);

    const before = tf.memory().numTensors;
    const grpoDir = path.join(root, "grpo");
    const r = await runGrpo(grpoCfg(path.join(sftDir, "final"), grpoDir));
    expect(r.steps).toBe(2);
    expect(tf.memory().numTensors).toBe(before);
    for (const f of [
      "run.json",
      "metrics.jsonl",
      "report.html",
      "trajectories.jsonl",
      "latest",
      "final/adapter_config.json",
      "final/adapter_model.safetensors",
    ])
      await expect(fs.stat(path.join(grpoDir, f)), f).resolves.toBeTruthy();
    const m = await readMetrics(path.join(grpoDir, "metrics.jsonl"));
    expect(m.map((x) => x.step)).toEqual([1, 2]);
    expect(m[0].kl).toBe(0); // the adapter starts at B = 0: policy = reference
    expect(m[1].kl as number).toBeGreaterThan(0);
    for (const key of [
      "reward",
      "reward_std",
      "accuracy",
      "reward_even",
      "kl",
      "clip_ratio",
      "entropy",
      "completion_len",
      "tool_calls",
      "tool_error_rate",
      "zero_signal_groups",
      "rollout_tokens_per_s",
      "step_time",
      "tensors",
      "rss_bytes",
    ])
      expect(m[0], key).toHaveProperty(key);
    // The loss and its settings: on every metrics line, in run.json (the flags, resolved) and the report.
    expect(m[1]).toMatchObject({
      loss_type: "grpo",
      importance_sampling_level: "token",
      epsilon: 0.2,
      epsilon_high: 0.2,
      beta: 0.04,
      mask_truncated_completions: false,
    });
    const run = JSON.parse(await fs.readFile(path.join(grpoDir, "run.json"), "utf8"));
    expect(run.config).toMatchObject({
      loss_type: "grpo",
      importance_sampling_level: "token",
      epsilon_high: 0.2,
      max_steps: 2,
      output_dir: grpoDir,
    });
    expect(await fs.readFile(path.join(grpoDir, "report.html"), "utf8")).toContain(
      "grpo (ε 0.2, ε_high 0.2, β 0.04, token-level ratios, truncated rollouts trained)",
    );
    const lines = (await fs.readFile(path.join(grpoDir, "trajectories.jsonl"), "utf8")).trim().split("\n");
    expect(lines).toHaveLength(2 * 2 * 3);
    // the report shows both steps' groups of rollouts, and the SFT report its held-out transcripts
    const report = await fs.readFile(path.join(grpoDir, "report.html"), "utf8");
    expect(report.match(/<details open><summary>step \d/g)).toHaveLength(2);
    expect(report.match(/<div class="group">/g)).toHaveLength(2 * 2);
    expect(await fs.readFile(path.join(sftDir, "report.html"), "utf8")).toContain('<h2 id="held-out">Held-out transcripts</h2>');
    const adapterCfg = JSON.parse(await fs.readFile(path.join(grpoDir, "final/adapter_config.json"), "utf8"));
    // The base is named relative to the adapter folder, and resolves to the SFT output from there.
    expect(path.resolve(grpoDir, "final", adapterCfg.base_model_name_or_path)).toBe(path.resolve(sftDir, "final"));
    expect(path.isAbsolute(adapterCfg.base_model_name_or_path)).toBe(false);
  });

  it("GRPO resumed halfway makes the same adapter as an uninterrupted run", async () => {
    const whole = path.join(root, "whole");
    const halves = path.join(root, "halves");
    await runGrpo(grpoCfg(path.join(sftDir, "final"), whole, { max_steps: 2 }));
    await runGrpo(grpoCfg(path.join(sftDir, "final"), halves, { max_steps: 1 }));
    await runGrpo(grpoCfg(path.join(sftDir, "final"), halves, { max_steps: 2, resume: true }));
    const a = await fs.readFile(path.join(whole, "final/adapter_model.safetensors"));
    const b = await fs.readFile(path.join(halves, "final/adapter_model.safetensors"));
    const init = await fs.readFile(path.join(halves, "checkpoint-1/adapter_model.safetensors"));
    expect(Buffer.compare(a, init)).not.toBe(0); // the second step changed the adapter
    expect(Buffer.compare(a, b)).toBe(0);
    const m = await readMetrics(path.join(halves, "metrics.jsonl"));
    expect(m.map((x) => x.step)).toEqual([1, 2]);
    const rollouts = (dir: string) => fs.readFile(path.join(dir, "trajectories.jsonl"), "utf8");
    expect(await rollouts(halves)).toBe(await rollouts(whole)); // same rollouts, each step once
    const history = async (dir: string) =>
      JSON.parse(await fs.readFile(path.join(dir, "checkpoint-2", "trainer_state.json"), "utf8")).log_history.map(
        (h: { step: number }) => h.step,
      );
    expect(await history(halves)).toEqual([1, 2]); // the resumed run keeps the first run's history
    expect(await history(halves)).toEqual(await history(whole));
    // Resuming with other settings names them; --overwrite with --resume is refused.
    await expect(runGrpo(grpoCfg(path.join(sftDir, "final"), halves, { max_steps: 3, resume: true, learning_rate: 5e-3 }))).rejects.toThrow(
      /other settings \(learning_rate\)/,
    );
    await expect(runGrpo(grpoCfg(path.join(sftDir, "final"), halves, { max_steps: 3, resume: true, overwrite: true }))).rejects.toThrow(
      /--overwrite and --resume together/,
    );
  });
});
