/** The GRPO configuration the environment tests run: the shipped tiny base (wasm, unquantized, a
 *  rank-2 adapter), two tasks × two rollouts per step, short episodes, nothing written but the run
 *  folder under a fresh temp directory. Modules load on first use, so a test file that only talks
 *  HTTP does not pay for the model code. */
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import type { Dialect } from "../../../src/envs/families.ts";
import type { GrpoRunConfig } from "../../../src/run/grpo-run.ts";

export async function tinyEnvRunConfig(env: string, dialect: Dialect, overrides: Partial<GrpoRunConfig> = {}) {
  const { initBackend } = await import("../../../src/kernels/backend.ts");
  const { TINY_BASE_DIR } = await import("../../../src/presets/tiny.ts");
  const { defaultsOf } = await import("../../../src/run/flags.ts");
  const { GRPO_FLAGS } = await import("../../../src/run/grpo-flags.ts");
  await initBackend("wasm");
  const output_dir = path.join(await fs.mkdtemp(path.join(os.tmpdir(), "env-grpo-")), "run");
  const cfg: GrpoRunConfig & { output_dir: string } = {
    ...defaultsOf(GRPO_FLAGS),
    model_path: TINY_BASE_DIR,
    dataset: "synthetic",
    max_samples: 4,
    max_steps: 1,
    prompts_per_step: 2,
    samples_per_prompt: 2,
    max_new_tokens: 128,
    max_turns: 2,
    temperature: 1,
    beta: 0,
    learning_rate: 1e-3,
    micro_batch_size: 4,
    lora_r: 2,
    lora_alpha: 4,
    quantize: "none",
    tools_in_prompt: false,
    save_steps: 0,
    save_total_limit: 2,
    seed: 1,
    backend: "wasm",
    quiet: true,
    env,
    env_dialect: dialect,
    ...overrides,
    output_dir,
  };
  return cfg;
}

/** A guess-the-number run's trajectories.jsonl, checked for what every such run holds: 4 episodes of
 *  the task's prompt, each ended turn an action with an observation (one cut by the token budget not),
 *  the reward the environment's. Returns the lines for further checks. */
export async function guessEpisodes(outputDir: string, expect: typeof import("vitest").expect): Promise<Record<string, any>[]> {
  const lines = (await fs.readFile(path.join(outputDir, "trajectories.jsonl"), "utf8"))
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l));
  expect(lines).toHaveLength(4);
  for (const t of lines) {
    expect(t.promptText).toContain("Guess the secret whole number between 1 and 100");
    for (const turn of t.turns) expect("observation" in turn).toBe(turn.ended);
    expect(t.reward).toBe(t.envReward);
  }
  expect(lines.some((t) => t.turns[0].ended)).toBe(true); // the tiny base ends its turns
  return lines;
}
