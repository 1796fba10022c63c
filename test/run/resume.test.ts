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
import { LORA_TARGETS } from "../../src/model/types.ts";
import { runGrpo, type GrpoRunConfig } from "../../src/run/grpo-run.ts";
import { runSft, type SftRunConfig } from "../../src/run/sft-run.ts";
import { Interrupted } from "../../src/shutdown.ts";
import { generateSynthetic } from "../../src/datasets/synthetic.ts";
import { readRunConfig } from "../../src/cli.ts";
import { makeTinyModelDir } from "./tiny-fixture.ts";

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

const sftCfg = (outputDir: string, over: Partial<SftRunConfig> = {}): SftRunConfig => ({
  modelPath: base, dataset: "synthetic", synthetic: TINY_PROBLEMS, maxSamples: 8, numEpochs: 2, batchSize: 2, gradientAccumulationSteps: 1,
  learningRate: 1e-3, lrScheduler: "cosine", warmupRatio: 0, weightDecay: 0, maxGradNorm: 1, maxLength: 512, loraR: 4, loraAlpha: 8,
  loraDropout: 0, loraTargets: [...LORA_TARGETS], quantize: "none", full: false, toolsInPrompt: false, evalSamples: 0, evalMaxNewTokens: 8,
  maxTurns: 1, saveSteps: 0, seed: 0, outputDir, backend: "wasm", overwrite: false, quiet: true, ...over,
});

const grpoCfg = (modelPath: string, outputDir: string, over: Partial<GrpoRunConfig> = {}): GrpoRunConfig => ({
  modelPath, dataset: "synthetic", synthetic: TINY_PROBLEMS, totalEpochs: 2, promptsPerStep: 1, samplesPerPrompt: 2, maxNewTokens: 8, maxTurns: 1,
  temperature: 1, topP: 1, topK: 0, beta: 0, epsilon: 0.2, epsilonHigh: 0.2, numIterations: 1, lossType: "grpo", scaleRewards: "group",
  rewardWeights: { correctness: 1 },
  score: (t) => ({ reward: t.completionIds.filter((id) => id % 2 === 0).length, components: {} }),
  learningRate: 1e-2, lrScheduler: "constant", warmupRatio: 0, weightDecay: 0, maxGradNorm: 1, microBatchSize: 4, loraR: 4, loraAlpha: 8,
  loraDropout: 0, loraTargets: [...LORA_TARGETS], quantize: "nf4", toolsInPrompt: false, saveSteps: 0, saveTotalLimit: 2, evalSamples: 0, seed: 3,
  outputDir, backend: "wasm", overwrite: false, resume: false, quiet: true, ...over,
});

const read = (dir: string, f: string) => fs.readFile(path.join(dir, f));
const exists = (p: string) => fs.stat(p).then(() => true, () => false);

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
    expect(Buffer.compare(await read(cut, "final/adapter_model.safetensors"), await read(whole, "final/adapter_model.safetensors"))).toBe(0);
    const steps = (await fs.readFile(path.join(cut, "metrics.jsonl"), "utf8")).trim().split("\n").map((l) => JSON.parse(l).step);
    expect(steps).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    for (const f of ["tokenizer.json", "adapter_config.json"]) expect(await exists(path.join(cut, "final", f)), f).toBe(true);
    // Finished: nothing left to resume.
    await expect(runSft(sftCfg(cut, { resume: true }))).rejects.toThrow(/already ran 8 of 8 steps/);
  }, 120_000);
});

describe("a run killed after its last step", () => {
  it("is finished by --resume (GRPO and SFT), also from a copied run folder", async () => {
    const sftDir = path.join(root, "sft-end");
    await runSft(sftCfg(sftDir, { numEpochs: 1 }));
    const grpoDir = path.join(root, "grpo-end");
    await runGrpo(grpoCfg(path.join(sftDir, "final"), grpoDir));
    const finals = { sft: await read(sftDir, "final/adapter_model.safetensors"), grpo: await read(grpoDir, "final/adapter_model.safetensors") };
    for (const [kind, dir] of [["sft", sftDir], ["grpo", grpoDir]] as const) {
      // As the kill left it: the last checkpoint written, final/ still under its temp name, no report.
      await fs.rename(path.join(dir, "final"), path.join(dir, ".final.1234.5678.tmp"));
      await fs.rm(path.join(dir, "report.html"));
      const copy = path.join(root, `${kind}-copy`);
      await fs.cp(dir, copy, { recursive: true });
      for (const d of [dir, copy]) {
        if (kind === "sft") await runSft(sftCfg(d, { numEpochs: 1, resume: true }));
        else await runGrpo(grpoCfg(path.join(sftDir, "final"), d, { resume: true }));
        expect(Buffer.compare(await read(d, "final/adapter_model.safetensors"), finals[kind]), `${kind} ${d}`).toBe(0);
        expect(await exists(path.join(d, "report.html"))).toBe(true);
      }
    }
    // A checkpoint without optimizer state is refused instead of silently restarting AdamW.
    await fs.rm(path.join(grpoDir, "checkpoint-2", "optimizer.safetensors"));
    await expect(runGrpo(grpoCfg(path.join(sftDir, "final"), grpoDir, { totalEpochs: 3, resume: true }))).rejects.toThrow(/has no optimizer.safetensors/);
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
      await runSft(sftCfg(out, { dataset: file, maxSamples: undefined, numEpochs: 1, batchSize: 4, evalSamples: 4, quiet: false }));
    } finally {
      process.stderr.write = write;
    }
    const evaluated = JSON.parse(String(await read(out, "eval.json"))).samples.map((q: { question: string }) => q.question);
    expect(evaluated.sort()).toEqual(rows.slice(8).map((r) => r.question).sort());
    const split = (await readRunConfig(out)).config as { dataSplit: string };
    expect(split.dataSplit).toMatch(/rows 1-8 for training \(8 used\), the last 4 held out/);
    expect(lines.join("")).toContain(`data: ${split.dataSplit}`);
  }, 120_000);
});
