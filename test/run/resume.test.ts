/** Stopping and continuing runs in-process: an interrupt (SIGINT delivered to the process's
 *  listeners) stops SFT at a step boundary with a checkpoint that --resume continues to the same
 *  model; a run killed after its last step is finished by --resume; a copied run folder resumes;
 *  a checkpoint without optimizer state is refused. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { shutdownCalculator } from "../../src/agents/calculator.ts";
import { TINY_PROBLEMS } from "../../src/presets/tiny.ts";
import { defaultsOf } from "../../src/run/flags.ts";
import { GRPO_FLAGS } from "../../src/run/grpo-flags.ts";
import { SFT_FLAGS } from "../../src/run/sft-flags.ts";
import { runGrpo, type GrpoRunConfig } from "../../src/run/grpo-run.ts";
import { runSft, type SftRunConfig } from "../../src/run/sft-run.ts";
import { Interrupted } from "../../src/run/shutdown.ts";
import { generateSynthetic } from "../../src/datasets/synthetic.ts";
import { readRunConfig } from "../../src/run/output-dir.ts";
import { registerReward } from "./helpers/reward.ts";
import { makeTinyModelDir } from "./helpers/tiny-fixture.ts";

let base: string;
let root: string;
beforeAll(async () => {
  base = await makeTinyModelDir();
  root = await fs.mkdtemp(path.join(os.tmpdir(), "marl-resume-"));
});
afterAll(async () => {
  await shutdownCalculator();
  await fs.rm(root, { recursive: true, force: true });
});

const sftCfg = (output_dir: string, over: Partial<SftRunConfig> = {}): SftRunConfig => ({
  ...defaultsOf(SFT_FLAGS),
  model_path: base,
  dataset: "synthetic",
  synthetic: TINY_PROBLEMS,
  max_samples: 8,
  num_epochs: 2,
  batch_size: 2,
  learning_rate: 1e-3,
  warmup_ratio: 0,
  max_length: 512,
  lora_r: 4,
  lora_alpha: 8,
  tools_in_prompt: false,
  eval_samples: 0,
  eval_max_new_tokens: 8,
  max_turns: 1,
  output_dir,
  backend: "wasm",
  quiet: true,
  ...over,
});

const EVEN_COUNT = registerReward("even_count", (t) => t.completionIds.filter((id) => id % 2 === 0).length);

const grpoCfg = (model_path: string, output_dir: string, over: Partial<GrpoRunConfig> = {}): GrpoRunConfig => ({
  ...defaultsOf(GRPO_FLAGS),
  model_path,
  dataset: "synthetic",
  synthetic: TINY_PROBLEMS,
  max_steps: 2,
  prompts_per_step: 1,
  samples_per_prompt: 2,
  max_new_tokens: 8,
  max_turns: 1,
  beta: 0,
  epsilon_high: 0.2,
  reward_weights: EVEN_COUNT,
  learning_rate: 1e-2,
  micro_batch_size: 4,
  lora_r: 4,
  lora_alpha: 8,
  quantize: "nf4",
  tools_in_prompt: false,
  save_steps: 0,
  seed: 3,
  output_dir,
  backend: "wasm",
  quiet: true,
  ...over,
});

const read = (dir: string, f: string) => fs.readFile(path.join(dir, f));
const exists = (p: string) =>
  fs.stat(p).then(
    () => true,
    () => false,
  );

/** Deliver SIGINT to the process's listeners once metrics.jsonl has `lines` lines. */
function interruptAfter(dir: string, lines: number): () => void {
  let fired = false;
  const timer = setInterval(async () => {
    const text = await fs.readFile(path.join(dir, "metrics.jsonl"), "utf8").catch(() => "");
    if (!fired && text.split("\n").filter((l) => l.trim()).length >= lines) {
      fired = true;
      clearInterval(timer);
      process.emit("SIGINT");
    }
  }, 5);
  return () => clearInterval(timer);
}

describe("SFT --resume", () => {
  it("an interrupt saves the last completed step; --resume makes the uninterrupted run's adapter", async () => {
    const whole = path.join(root, "sft-whole");
    const cut = path.join(root, "sft-cut");
    const a = await runSft(sftCfg(whole));
    expect(a.steps).toBe(8);
    const stop = interruptAfter(cut, 2);
    const err = await runSft(sftCfg(cut)).catch((e) => e);
    stop();
    expect(err).toBeInstanceOf(Interrupted);
    const latest = (await fs.readFile(path.join(cut, "latest"), "utf8")).trim();
    const state = JSON.parse(String(await read(cut, `${latest}/trainer_state.json`)));
    expect(state.global_step).toBeGreaterThanOrEqual(2);
    expect(state.global_step).toBeLessThan(8);
    expect(await exists(path.join(cut, "final"))).toBe(false);
    const b = await runSft(sftCfg(cut, { resume: true }));
    expect(b.steps).toBe(8);
    expect(Buffer.compare(await read(cut, "final/adapter_model.safetensors"), await read(whole, "final/adapter_model.safetensors"))).toBe(
      0,
    );
    const steps = (await fs.readFile(path.join(cut, "metrics.jsonl"), "utf8"))
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l).step);
    expect(steps).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    for (const f of ["tokenizer.json", "adapter_config.json"]) expect(await exists(path.join(cut, "final", f)), f).toBe(true);
    // Finished: nothing left to resume.
    await expect(runSft(sftCfg(cut, { resume: true }))).rejects.toThrow(/already ran 8 of 8 steps/);
  }, 120_000);
});

describe("a run killed after its last step", () => {
  it("is finished by --resume (GRPO and SFT), also from a copied run folder", async () => {
    const sftDir = path.join(root, "sft-end");
    await runSft(sftCfg(sftDir, { num_epochs: 1 }));
    const grpoDir = path.join(root, "grpo-end");
    await runGrpo(grpoCfg(path.join(sftDir, "final"), grpoDir));
    const finals = {
      sft: await read(sftDir, "final/adapter_model.safetensors"),
      grpo: await read(grpoDir, "final/adapter_model.safetensors"),
    };
    for (const [kind, dir] of [
      ["sft", sftDir],
      ["grpo", grpoDir],
    ] as const) {
      // As the kill left it: the last checkpoint written, final/ still under its temp name, no report.
      await fs.rename(path.join(dir, "final"), path.join(dir, ".final.1234.5678.tmp"));
      await fs.rm(path.join(dir, "report.html"));
      const copy = path.join(root, `${kind}-copy`);
      await fs.cp(dir, copy, { recursive: true });
      for (const d of [dir, copy]) {
        if (kind === "sft") await runSft(sftCfg(d, { num_epochs: 1, resume: true }));
        else await runGrpo(grpoCfg(path.join(sftDir, "final"), d, { resume: true }));
        expect(Buffer.compare(await read(d, "final/adapter_model.safetensors"), finals[kind]), `${kind} ${d}`).toBe(0);
        expect(await exists(path.join(d, "report.html"))).toBe(true);
      }
    }
    // A checkpoint without optimizer state is refused instead of silently restarting AdamW.
    await fs.rm(path.join(grpoDir, "checkpoint-2", "optimizer.safetensors"));
    await expect(runGrpo(grpoCfg(path.join(sftDir, "final"), grpoDir, { max_steps: 3, resume: true }))).rejects.toThrow(
      /has no optimizer.safetensors/,
    );
  }, 120_000);
});

describe("a run killed before its first checkpoint", () => {
  it("is run from step 0 by --resume (GRPO and SFT), to the uninterrupted run's adapter", async () => {
    const sftWhole = path.join(root, "sft-first-whole");
    await runSft(sftCfg(sftWhole, { num_epochs: 1 }));
    const grpoWhole = path.join(root, "grpo-first-whole");
    await runGrpo(grpoCfg(path.join(sftWhole, "final"), grpoWhole));
    for (const [kind, whole] of [
      ["sft", sftWhole],
      ["grpo", grpoWhole],
    ] as const) {
      // As a SIGKILL during step 2 leaves it (checkpoints every 10 steps): run.json, a logged step, a dead lock.
      const cut = path.join(root, `${kind}-first-cut`);
      await fs.mkdir(cut);
      await fs.copyFile(path.join(whole, "run.json"), path.join(cut, "run.json"));
      await fs.writeFile(
        path.join(cut, "metrics.jsonl"),
        (await fs.readFile(path.join(whole, "metrics.jsonl"), "utf8")).split("\n")[0] + "\n",
      );
      await fs.writeFile(path.join(cut, ".lock"), "999999999\n");
      if (kind === "sft") await runSft(sftCfg(cut, { num_epochs: 1, resume: true }));
      else await runGrpo(grpoCfg(path.join(sftWhole, "final"), cut, { resume: true }));
      const final = "final/adapter_model.safetensors";
      expect(Buffer.compare(await read(cut, final), await read(whole, final)), kind).toBe(0);
      const steps = (await fs.readFile(path.join(cut, "metrics.jsonl"), "utf8")).trim().split("\n");
      expect(steps.map((l) => JSON.parse(l).step)).toEqual(kind === "sft" ? [1, 2, 3, 4] : [1, 2]);
    }
  }, 120_000);
});

describe("held-out evaluation with a .jsonl dataset", () => {
  it("never sees a training row; the split is printed and kept in run.json", async () => {
    const rows = generateSynthetic({ n: 12, seed: 7, ...TINY_PROBLEMS });
    const file = path.join(root, "data.jsonl");
    await fs.writeFile(file, rows.map((r) => JSON.stringify({ question: r.question, answer: r.answer })).join("\n") + "\n");
    const out = path.join(root, "sft-file");
    const lines: string[] = [];
    const write = process.stderr.write;
    process.stderr.write = ((l: string) => (lines.push(String(l)), true)) as typeof process.stderr.write;
    try {
      await runSft(sftCfg(out, { dataset: file, max_samples: undefined, num_epochs: 1, batch_size: 4, eval_samples: 4, quiet: false }));
    } finally {
      process.stderr.write = write;
    }
    const evaluated = JSON.parse(String(await read(out, "eval.json"))).samples.map((q: { question: string }) => q.question);
    expect(evaluated.sort()).toEqual(
      rows
        .slice(8)
        .map((r) => r.question)
        .sort(),
    );
    const split = (await readRunConfig(out)).config as { dataSplit: string };
    expect(split.dataSplit).toMatch(/rows 1-8 for training \(8 used\), the last 4 held out/);
    expect(lines.join("")).toContain(`data: ${split.dataSplit}`);
    // Held-out rows are cut from this file's end, so another --eval_samples would train on other rows.
    await expect(
      runSft(sftCfg(out, { dataset: file, max_samples: undefined, num_epochs: 1, batch_size: 4, eval_samples: 2, resume: true })),
    ).rejects.toThrow(/^--resume: .* was run with other settings \(eval_samples\)/);
  }, 120_000);
});
