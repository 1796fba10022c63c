/** The evaluation run end to end on a random tiny model (files and counts), the paired improvement
 *  on hand-made results, and the script's bad-input handling as a real process. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs";
import { shutdownCalculator } from "../../src/agents/calculator.ts";
import { summarize, type EvalQuestion, type EvalResult, type EvalSample } from "../../src/run/evaluate.ts";
import { rewriteEvalReport } from "../../src/report/eval-report.ts";
import { formatEvalTable, pairedImprovement } from "../../src/report/eval-table.ts";
import { parseEvalArgs, runEval } from "../../src/run/eval-run.ts";
import { TINY_PROBLEMS } from "../../src/presets/tiny.ts";
import { makeSmallModelDir } from "./helpers/tiny-fixture.ts";

let modelDir: string;
beforeAll(async () => {
  modelDir = await makeSmallModelDir("eval-run-model-");
});
afterAll(async () => {
  await shutdownCalculator();
});

const sample = (strict: boolean): EvalSample => ({
  finalText: "",
  text: "",
  strict,
  lenient: strict,
  formatValid: true,
  toolCalls: 0,
  toolErrors: 0,
  parseErrors: 0,
  truncated: false,
  turns: [],
});
const result = (perQuestion: boolean[][]): EvalResult =>
  summarize(
    perQuestion.map((s, i): EvalQuestion => ({ id: `q${i}`, question: "?", gold: "1", samples: s.map(sample) })),
    perQuestion[0].length,
    0,
  );

describe("pairedImprovement", () => {
  it("is the mean per-question difference with a normal 95% interval", () => {
    // k = 2: per-question accuracies a = [1, .5, 0, 0], b = [.5, .5, .5, 0] → d = [.5, 0, -.5, 0]
    const a = result([
      [true, true],
      [true, false],
      [false, false],
      [false, false],
    ]);
    const b = result([
      [true, false],
      [false, true],
      [true, false],
      [false, false],
    ]);
    const d = pairedImprovement(a, b);
    const sd = Math.sqrt((0.25 + 0 + 0.25 + 0) / 3); // sample std of d, mean 0
    expect(d.value).toBeCloseTo(0, 12);
    expect(d.hi).toBeCloseTo((1.96 * sd) / 2, 12);
    expect(d.lo).toBeCloseTo((-1.96 * sd) / 2, 12);
    expect(d.n).toBe(4);
  });
  it("clamps to [-1, 1] and refuses unpaired results", () => {
    const all = result([[true], [true]]);
    const none = result([[false], [false]]);
    expect(pairedImprovement(all, none)).toMatchObject({ value: 1, lo: 1, hi: 1 });
    expect(pairedImprovement(none, all)).toMatchObject({ value: -1, lo: -1, hi: -1 });
    expect(() => pairedImprovement(all, result([[true]]))).toThrow(/same questions: 2 vs 1/);
  });
  it("table has one row per model and the pass@k column named by k", () => {
    const t = formatEvalTable([
      { name: "base", result: result([[true, false]]) },
      { name: "rl", result: result([[true, true]]) },
    ]);
    const lines = t.split("\n");
    expect(lines).toHaveLength(4);
    expect(lines[0]).toMatch(/^model +\| strict acc \[95% CI\] +\| lenient acc \| pass@2 \| format \| tools\/rollout$/);
    expect(lines[2]).toMatch(/^base +\| 0\.500 \[/);
    expect(lines[3]).toMatch(/^rl +\| 1\.000 \[0\.342, 1\.000\] \| 1\.000 +\| 1\.000/);
  });
});

describe("runEval on a random tiny model", () => {
  it("writes eval.json, samples per model and report.html with the right counts, and leaks no tensors", async () => {
    const out = path.join(await fs.mkdtemp(path.join(os.tmpdir(), "eval-run-out-")), "eval");
    const cfg = await parseEvalArgs([
      "node",
      "eval",
      "--model_path",
      modelDir,
      "--baseline",
      modelDir,
      "--dataset",
      "synthetic",
      "--max_samples",
      "3",
      "--samples_per_prompt",
      "2",
      "--temperature",
      "1",
      "--batch_size",
      "2",
      "--max_new_tokens",
      "6",
      "--max_turns",
      "2",
      "--backend",
      "wasm",
      "--output_dir",
      out,
    ]);
    const name = path.basename(modelDir);
    expect(cfg.models.map((m) => m.name)).toEqual([`${name}-baseline`, name]);
    const lines: string[] = [];
    const before = tf.memory().numTensors;
    const res = await runEval(cfg, { out: (l) => lines.push(l), progress: false });
    expect(tf.memory().numTensors).toBe(before);

    const evalJson = JSON.parse(await fs.readFile(path.join(out, "eval.json"), "utf8"));
    expect(evalJson.models).toHaveLength(2);
    for (const m of evalJson.models) {
      expect(m).toMatchObject({ n: 3, k: 2, quantize: "none" });
      expect(m.strict.total).toBe(6);
    }
    expect(evalJson.improvements).toHaveLength(1);
    // Same weights, same seed, same questions → the same samples, so the paired difference is exactly 0.
    expect(evalJson.improvements[0]).toMatchObject({ model: name, baseline: `${name}-baseline`, value: 0, lo: 0, hi: 0, n: 3 });
    for (const m of cfg.models) {
      const rows = (await fs.readFile(path.join(out, `samples-${m.name}.jsonl`), "utf8"))
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l));
      expect(rows).toHaveLength(3);
      for (const r of rows) {
        expect(r.samples).toHaveLength(2);
        expect(typeof r.question).toBe("string");
        expect(typeof r.gold).toBe("string");
        expect(typeof r.samples[0].strict).toBe("boolean");
        expect(Array.isArray(r.samples[0].turns)).toBe(true);
      }
    }
    const html = await fs.readFile(path.join(out, "report.html"), "utf8");
    expect(html).toContain(`${name}-baseline`);
    // per-question view: both models side by side for each of the 3 questions; nothing changed between them
    expect(html.match(/<div class="group qq/g)).toHaveLength(3);
    expect(html).toContain(`${name}-baseline → ${name}: wrong → right (0)`);
    // written again from the folder's files alone: the same table and questions
    const again = await fs.readFile(await rewriteEvalReport(out), "utf8");
    const part = (h: string) => h.slice(h.indexOf("<h2>Results</h2>"), h.indexOf("<h2>Config</h2>"));
    expect(part(again)).toBe(part(html));
    expect(part(html)).toContain("Per question");
    expect(res.results).toHaveLength(2);
    expect(lines.some((l) => l.startsWith(`improvement ${name} vs ${name}-baseline: strict +0.000`))).toBe(true);
    expect(lines.filter((l) => /^\S+: strict \d\.\d{3} \[/.test(l))).toHaveLength(2); // formatEvalLine per model
    // A second run into the same folder is refused without --overwrite, before any model is opened;
    // the message names the flag eval has (an evaluation cannot be continued: no --resume).
    const second = runEval(cfg, { out: () => {}, progress: false });
    await expect(second).rejects.toThrow(/already holds a run; pass --overwrite to replace it or pick another --output_dir$/);
  }, 60_000);
});

describe("--preset tiny with --model_path", () => {
  it("evaluates that model (and --baseline) on the preset's questions with the preset's protocol", async () => {
    const cfg = await parseEvalArgs([
      "node",
      "eval",
      "--preset",
      "tiny",
      "--model_path",
      modelDir,
      "--baseline",
      modelDir,
      "--max_samples",
      "3",
    ]);
    const name = path.basename(modelDir);
    expect(cfg.models.map((m) => [m.name, m.modelPath, m.quantize])).toEqual([
      [`${name}-baseline`, modelDir, "none"],
      [name, modelDir, "none"],
    ]);
    expect(cfg.synthetic).toEqual(TINY_PROBLEMS);
    expect(cfg).toMatchObject({
      dataset: "synthetic",
      max_samples: 3,
      max_new_tokens: 160,
      max_turns: 5,
      tools_in_prompt: false,
      batch_size: 64,
      output_dir: path.join("outputs", name, "eval"),
    });
    const err = await parseEvalArgs(["node", "eval", "--preset", "tiny", "--baseline", modelDir]).then(
      () => null,
      (e: Error) => e,
    );
    expect(err?.message).toMatch(/^--preset tiny without --model_path evaluates its own base, sft and rl checkpoints/);
  });
});

describe("bad input", () => {
  it("is a UsageError naming the value, thrown before anything is written", async () => {
    const out = path.join(await fs.mkdtemp(path.join(os.tmpdir(), "eval-bad-")), "eval");
    const cases: Array<[string[], RegExp]> = [
      [["--model_path", modelDir, "--adapter", modelDir], /^--adapter .*: no adapter_config.json/],
      [["--model_path", modelDir, "--dataset", "/nonexistent/gsm8k.jsonl"], /^--dataset \/nonexistent\/gsm8k.jsonl: no such file/],
      [["--model_path", modelDir, "--samples_per_prompt", "4"], /^--samples_per_prompt 4 with --temperature 0/],
      [["--model_path", modelDir, "--quantize", "fp4"], /^--quantize "fp4": expected one of none, int8, nf4/],
      [["--model_path", modelDir, "--quantize_for", "rl=nf4"], /^--quantize_for rl=nf4: no model named rl/],
      [["--model_path", modelDir, "--max_samples", "0"], /^--max_samples "0": expected a whole number >= 1/],
      [["--model_path", modelDir, "--split", "dev"], /^--split "dev": expected one of test, train/],
      [["--model_path", "Qwen"], /^--model_path Qwen: no such folder/],
      [["--nope"], /unknown option '--nope'/],
    ];
    for (const [args, msg] of cases) {
      const err = await parseEvalArgs(["node", "eval", ...args, "--output_dir", out]).then(
        () => null,
        (e: Error) => e,
      );
      expect(err?.name, args.join(" ")).toBe("UsageError");
      expect(err!.message).toMatch(msg);
    }
    expect(
      await fs.stat(out).then(
        () => true,
        () => false,
      ),
    ).toBe(false);
  });

  it("a model that fails to load after the run folder was made leaves nothing behind", async () => {
    const bad = await fs.mkdtemp(path.join(os.tmpdir(), "eval-bad-model-"));
    await fs.cp(modelDir, bad, { recursive: true });
    await fs.writeFile(path.join(bad, "model.safetensors"), "not a safetensors file");
    const out = path.join(await fs.mkdtemp(path.join(os.tmpdir(), "eval-bad-")), "eval");
    const cfg = await parseEvalArgs([
      "node",
      "eval",
      "--model_path",
      bad,
      "--dataset",
      "synthetic",
      "--max_samples",
      "2",
      "--output_dir",
      out,
    ]);
    await expect(runEval(cfg, { out: () => {}, progress: false })).rejects.toThrow(/model.safetensors/);
    expect(
      await fs.stat(out).then(
        () => true,
        () => false,
      ),
    ).toBe(false); // no stale run.json to block the rerun
  });

  it("the script exits 2 with one error line and writes nothing", async () => {
    const tsx = path.resolve("node_modules/.bin/tsx");
    const out = path.join(await fs.mkdtemp(path.join(os.tmpdir(), "eval-bad-")), "eval");
    const run = (args: string[]) =>
      new Promise<{ status: number | null; stdout: string; stderr: string }>((resolve) => {
        const p = spawn(tsx, ["scripts/eval.ts", ...args, "--output_dir", out], { stdio: ["ignore", "pipe", "pipe"] });
        let stdout = "",
          stderr = "";
        p.stdout.on("data", (d) => (stdout += d));
        p.stderr.on("data", (d) => (stderr += d));
        p.on("close", (status) => resolve({ status, stdout, stderr }));
      });
    const [a, b] = await Promise.all([run(["--temperature", "abc"]), run(["--model_path", path.join(out, "missing")])]);
    for (const [r, msg] of [
      [a, /^error: --temperature "abc": expected a number/],
      [b, /^error: --model_path .*missing: no such folder/],
    ] as const) {
      expect(r.status).toBe(2);
      expect(r.stderr.trim().split("\n")).toHaveLength(1);
      expect(r.stderr.trim()).toMatch(msg);
      expect(r.stdout).toBe("");
    }
    expect(
      await fs.stat(out).then(
        () => true,
        () => false,
      ),
    ).toBe(false);
  }, 240_000); // two tsx processes starting at once: slow on a loaded machine
});
