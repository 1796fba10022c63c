/** A short tiny-preset GRPO run for the rollout engines' tests (llama, webgpu): 2 steps of 2
 *  questions × 4 rollouts at temperature 1, LoRA r4 on an NF4 base, scored by a reward every group
 *  varies in (the base rarely solves a problem: the share of even ids it sampled), and the run's
 *  metrics lines. */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { TINY_BASE_DIR, TINY_PROBLEMS } from "../../../src/presets/tiny.ts";
import { defaultsOf } from "../../../src/run/flags.ts";
import { GRPO_FLAGS, type GrpoFlags } from "../../../src/run/grpo-flags.ts";
import { runGrpo } from "../../../src/run/grpo-run.ts";
import { evenShare, registerReward } from "../../run/helpers/reward.ts";

const EVEN = registerReward("even", evenShare);

export async function engineGrpoRun(out: string, flags: Partial<GrpoFlags>): Promise<{ steps: number; metrics: Record<string, number>[] }> {
  const r = await runGrpo({
    ...defaultsOf(GRPO_FLAGS),
    model_path: TINY_BASE_DIR,
    dataset: "synthetic",
    synthetic: TINY_PROBLEMS,
    max_steps: 2,
    prompts_per_step: 2,
    samples_per_prompt: 4,
    max_new_tokens: 64,
    max_turns: 3,
    temperature: 1,
    learning_rate: 5e-3,
    lora_r: 4,
    lora_alpha: 8,
    quantize: "nf4",
    tools_in_prompt: false,
    eval_samples: 0,
    reward_weights: EVEN,
    output_dir: out,
    quiet: true,
    ...flags,
  });
  const metrics = (await fs.readFile(path.join(out, "metrics.jsonl"), "utf8"))
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as Record<string, number>);
  return { steps: r.steps, metrics };
}
