/** Ctrl-C in a terminal, as a user runs the README's command: `tsx scripts/train-gsm8k-agent.ts` in its
 *  own process group, SIGINT sent to the whole group. The run stops at a step boundary, saves a
 *  checkpoint whose weights, optimizer state and step agree, exits 130; `--resume` then ends with the
 *  same adapter and rollouts as a run that was never interrupted. */
import { afterAll, describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

const ROOT = path.join(__dirname, "..", "..");
const TSX = path.join(ROOT, "node_modules", "tsx", "dist", "cli.mjs");
const TINY_BASE = path.join(ROOT, "src", "presets", "tiny");
const FLAGS = [
  "--model_path",
  TINY_BASE,
  "--dataset",
  "synthetic",
  "--quantize",
  "nf4",
  "--total_epochs",
  "3",
  "--prompts_per_step",
  "2",
  "--samples_per_prompt",
  "4",
  "--max_new_tokens",
  "24",
  "--max_turns",
  "2",
  "--temperature",
  "1.5",
  "--learning_rate",
  "1e-2",
  "--reward_weights",
  "correctness=1,format=1,tool_use=1",
  "--save_steps",
  "100",
  "--lora_r",
  "4",
  "--no-tools_in_prompt",
  "--backend",
  "wasm",
];

interface Run {
  code: number | null;
  stderr: string;
}

/** Run the GRPO script under tsx in a new process group; `onMetrics(lines, interrupt)` is polled. */
function grpo(out: string, extra: string[] = [], onMetrics?: (lines: number, interrupt: () => void) => void): Promise<Run> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [TSX, "scripts/train-gsm8k-agent.ts", ...FLAGS, "--output_dir", out, ...extra], {
      cwd: ROOT,
      detached: true,
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, CI: "true" },
    });
    let stderr = "";
    p.stderr.on("data", (d) => (stderr += d));
    p.stdout.resume();
    let sent = false;
    const timer =
      onMetrics &&
      setInterval(async () => {
        const text = await fs.readFile(path.join(out, "metrics.jsonl"), "utf8").catch(() => "");
        onMetrics(text.split("\n").filter((l) => l.trim()).length, () => {
          if (!sent) process.kill(-p.pid!, "SIGINT"); // the terminal's Ctrl-C: every process of the group
          sent = true;
        });
      }, 100);
    p.on("close", (code) => {
      if (timer) clearInterval(timer);
      resolve({ code, stderr });
    });
  });
}

const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await fs.rm(d, { recursive: true, force: true });
});

describe("Ctrl-C through npx tsx", () => {
  it("saves the last completed step, exits 130, and --resume equals the uninterrupted run", async () => {
    const root = await fs.mkdtemp(path.join(os.tmpdir(), "marl-intr-"));
    dirs.push(root);
    const whole = path.join(root, "whole");
    const cut = path.join(root, "cut");
    const [a, b] = await Promise.all([grpo(whole), grpo(cut, [], (n, interrupt) => n >= 1 && interrupt())]);
    expect(a.code, a.stderr).toBe(0);
    expect(b.code, b.stderr).toBe(130);
    expect(b.stderr).toMatch(/interrupted: saved checkpoint-\d/);
    const latest = (await fs.readFile(path.join(cut, "latest"), "utf8")).trim();
    const state = JSON.parse(await fs.readFile(path.join(cut, latest, "trainer_state.json"), "utf8"));
    expect(latest).toBe(`checkpoint-${state.global_step}`);
    expect(state.global_step).toBeGreaterThanOrEqual(1);
    // The loop stopped where it saved: no step ran after the checkpoint, no final/ was written.
    const steps = (await fs.readFile(path.join(cut, "metrics.jsonl"), "utf8"))
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l).step);
    expect(steps).toEqual(Array.from({ length: state.global_step }, (_, i) => i + 1));
    await expect(fs.stat(path.join(cut, "final"))).rejects.toThrow();
    expect(state.log_history.map((h: { step: number }) => h.step)).toEqual(steps);
    for (const f of ["adapter_model.safetensors", "optimizer.safetensors"])
      await expect(fs.stat(path.join(cut, latest, f))).resolves.toBeTruthy();

    const resumed = await grpo(cut, ["--resume"]);
    expect(resumed.code, resumed.stderr).toBe(0);
    const read = (dir: string, f: string) => fs.readFile(path.join(dir, f));
    expect(Buffer.compare(await read(cut, "final/adapter_model.safetensors"), await read(whole, "final/adapter_model.safetensors"))).toBe(
      0,
    );
    expect(String(await read(cut, "trajectories.jsonl"))).toBe(String(await read(whole, "trajectories.jsonl")));
    // The adapter did change during the run, so the equality above says something.
    const first = await fs.readFile(path.join(cut, latest, "adapter_model.safetensors")).catch(() => null);
    if (state.global_step < 3 && first) expect(Buffer.compare(first, await read(whole, "final/adapter_model.safetensors"))).not.toBe(0);
  }, 300_000);
});
