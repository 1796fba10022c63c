/** Ctrl-C during SFT's closing evaluation (after the last step, once final/ is saved): the evaluation
 *  stops, the report is written from what the run has, the run exits 130 saying what --resume does;
 *  --resume then runs the evaluation, writes eval.json, and reports the run's real final loss. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { ROOT } from "./helpers/run-script.ts";
import { makeTinyModelDir } from "./helpers/tiny-fixture.ts";

const TSX = path.join(ROOT, "node_modules", "tsx", "dist", "cli.mjs");
let model: string;
let root: string;
beforeAll(async () => {
  model = await makeTinyModelDir(); // random weights: every evaluation rollout runs to its token budget
  root = await fs.mkdtemp(path.join(os.tmpdir(), "marl-intr-eval-"));
});
afterAll(async () => {
  for (const d of [model, root]) await fs.rm(d, { recursive: true, force: true });
});

const SFT = [
  "--dataset",
  "synthetic",
  "--max_samples",
  "16",
  "--batch_size",
  "8",
  "--lora_r",
  "4",
  "--eval_samples",
  "64",
  "--eval_max_new_tokens",
  "100",
];
const GRPO = [
  "--dataset",
  "synthetic",
  "--max_steps",
  "4",
  "--prompts_per_step",
  "2",
  "--samples_per_prompt",
  "2",
  "--max_new_tokens",
  "16",
  "--max_turns",
  "1",
  "--lora_r",
  "4",
  "--eval_samples",
  "0",
  "--no-tools_in_prompt",
];

const sft = (out: string, extra: string[], interruptOn?: RegExp) =>
  run("train-sft.ts", [...SFT, "--output_dir", out, ...extra], interruptOn);
const grpo = (out: string, extra: string[], interruptOn?: RegExp) =>
  run("train-gsm8k-agent.ts", [...GRPO, "--output_dir", out, ...extra], interruptOn);

/** A training script in its own process group; `interruptOn` (stderr so far) says when to send the terminal's Ctrl-C. */
function run(script: string, args: string[], interruptOn?: RegExp): Promise<{ code: number | null; stderr: string; stdout: string }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [TSX, path.join("scripts", script), "--model_path", model, "--backend", "wasm", ...args], {
      cwd: ROOT,
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, CI: "true" },
    });
    let stderr = "",
      stdout = "",
      sent = false;
    p.stdout.on("data", (d) => (stdout += d));
    p.stderr.on("data", (d) => {
      stderr += d;
      if (interruptOn && !sent && interruptOn.test(stderr)) {
        sent = true;
        process.kill(-p.pid!, "SIGINT");
      }
    });
    p.on("close", (code) => resolve({ code, stderr, stdout }));
  });
}

describe("Ctrl-C during SFT's closing evaluation", () => {
  it("writes the report, exits 130 naming --resume, and --resume finishes with eval.json and the real final loss", async () => {
    const out = path.join(root, "run");
    const cut = await sft(out, [], /saved adapter to /);
    expect(cut.code, cut.stderr).toBe(130);
    expect(cut.stderr).toMatch(/interrupted: .*closing evaluation .*--resume/);
    await expect(fs.stat(path.join(out, "report.html"))).resolves.toBeTruthy();
    await expect(fs.stat(path.join(out, "eval.json"))).rejects.toThrow(); // no half evaluation passed off as whole

    const resumed = await sft(out, ["--resume"]);
    expect(resumed.code, resumed.stderr).toBe(0);
    const loss = /sft done: 2 steps, final loss (\S+),/.exec(resumed.stdout)?.[1];
    expect(Number.isFinite(Number(loss)), resumed.stdout).toBe(true);
    const lastLogged = (await fs.readFile(path.join(out, "metrics.jsonl"), "utf8"))
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l))
      .filter((m) => m.loss !== undefined)
      .at(-1).loss;
    expect(Number(loss)).toBeCloseTo(lastLogged, 4);
    expect(JSON.parse(await fs.readFile(path.join(out, "eval.json"), "utf8")).n).toBe(64);
  }, 240_000);
});

describe("Ctrl-C during GRPO", () => {
  it("leaves report.html beside the checkpoint it saves, and says so", async () => {
    const out = path.join(root, "grpo");
    const cut = await grpo(out, [], /step 1\/4/);
    expect(cut.code, cut.stderr).toBe(130);
    expect(cut.stderr).toMatch(/interrupted: saved checkpoint-\d+ and report\.html in .*; continue with --resume/);
    const html = await fs.readFile(path.join(out, "report.html"), "utf8");
    expect(html).toContain("GRPO");
    await expect(fs.stat(path.join(out, "final"))).rejects.toThrow();
  }, 240_000);
});
