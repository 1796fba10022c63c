/** The calculator served over MCP (scripts/mcp-tool-server.ts, stdio) gives the same GRPO step as the
 *  built-in one: same seed, byte-equal trajectories, the same metrics apart from timing and memory. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { initBackend } from "../../src/kernels/backend.ts";
import { shutdownCalculator } from "../../src/agents/calculator.ts";
import { SYSTEM_PROMPT } from "../../src/agents/prompts.ts";
import { TINY_BASE_DIR, TINY_PROBLEMS } from "../../src/presets/tiny.ts";
import { readMetrics } from "../../src/trainer/metrics.ts";
import { runGrpo, type GrpoRunConfig } from "../../src/run/grpo-run.ts";
import { defaultsOf } from "../../src/run/flags.ts";
import { GRPO_FLAGS } from "../../src/run/grpo-flags.ts";

const ROOT = path.join(import.meta.dirname, "..", "..");
const MCP_CALCULATOR = `mcp:${JSON.stringify(process.execPath)} --import tsx ${JSON.stringify(path.join(ROOT, "scripts", "mcp-tool-server.ts"))}`;
const TIMING = /^time$|(_time|_per_s|tensors|bytes)$/;

let root: string;
beforeAll(async () => {
  await initBackend("wasm");
  root = await fs.mkdtemp(path.join(os.tmpdir(), "marl-tools-"));
});
afterAll(async () => {
  await shutdownCalculator();
  await fs.rm(root, { recursive: true, force: true });
});

// The shipped tiny base was pretrained on tool-calling text, so its rollouts call the calculator. The
// tool schemas go into the prompt, so equal trajectories also mean equal <tools> blocks and system prompts.
const cfg = (tools: string[], outputDir: string): GrpoRunConfig => ({
  ...defaultsOf(GRPO_FLAGS),
  model_path: TINY_BASE_DIR,
  dataset: "synthetic",
  synthetic: TINY_PROBLEMS,
  max_steps: 1,
  prompts_per_step: 2,
  samples_per_prompt: 2,
  max_new_tokens: 160,
  max_turns: 5,
  temperature: 0.7,
  beta: 0,
  loss_type: "dr_grpo",
  learning_rate: 5e-4,
  micro_batch_size: 8,
  lora_r: 4,
  lora_alpha: 8,
  quantize: "none",
  tools_in_prompt: true,
  save_steps: 0,
  save_total_limit: 1,
  seed: 5,
  output_dir: outputDir,
  backend: "wasm",
  quiet: true,
  tools: tools.join(","),
});

describe("--tools mcp:<calculator server>", () => {
  it("one GRPO step makes byte-equal trajectories and the same metrics as --tools calculator", async () => {
    const builtIn = path.join(root, "builtin"),
      mcp = path.join(root, "mcp");
    await runGrpo(cfg(["calculator"], builtIn));
    await runGrpo(cfg([MCP_CALCULATOR], mcp));
    const read = (dir: string) => fs.readFile(path.join(dir, "trajectories.jsonl"), "utf8");
    const a = await read(builtIn);
    const b = await read(mcp);
    expect(b.length).toBe(a.length);
    expect(b === a, "trajectories.jsonl differs").toBe(true);
    const prompt = JSON.parse(a.split("\n")[0]).promptText as string;
    expect(prompt).toContain(SYSTEM_PROMPT);
    expect(prompt).toMatch(
      /<tools>\n\{"type": "function", "function": \{"name": "calculator", "description": "Evaluate an arithmetic expression"/,
    );
    const calls = a
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l).numToolCalls as number);
    expect(calls.reduce((x, y) => x + y, 0)).toBeGreaterThan(0); // the comparison covers real tool calls
    const metrics = async (dir: string) =>
      (await readMetrics(path.join(dir, "metrics.jsonl"))).map((m) =>
        Object.fromEntries(Object.entries(m).filter(([k]) => !TIMING.test(k))),
      );
    expect(await metrics(mcp)).toEqual(await metrics(builtIn));
    const adapter = (dir: string) => fs.readFile(path.join(dir, "final", "adapter_model.safetensors"));
    expect(Buffer.compare(await adapter(mcp), await adapter(builtIn))).toBe(0);
  }, 300_000); // two short GRPO runs and a server start: minutes on a loaded 2-core machine
});
