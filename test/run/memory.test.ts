/** Memory of a GRPO run stays flat from step to step: the same tensors and tensor bytes after every
 *  step, a wasm heap that does not grow once the (fixed) batch shape has been seen, and a JS heap that
 *  holds nothing per step. Every step asks the same question with the same limits, so growth would be
 *  a leak, not a larger batch. Checkpoints and logs are written every step, as in a real run. The
 *  long-run curve is measured outside the suite (scripts/bench-soak.ts). */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { shutdownCalculator } from "../../src/agents/calculator.ts";
import { defaultsOf } from "../../src/run/flags.ts";
import { GRPO_FLAGS } from "../../src/run/grpo-flags.ts";
import { runGrpo } from "../../src/run/grpo-run.ts";
import { readMetrics } from "../../src/trainer/metrics.ts";
import { collectGarbage } from "../../src/util/gc.ts";
import { registerReward } from "./helpers/reward.ts";
import { makeTinyModelDir } from "./helpers/tiny-fixture.ts";

let root: string;
let base: string;
beforeAll(async () => {
  base = await makeTinyModelDir();
  root = await fs.mkdtemp(path.join(os.tmpdir(), "marl-memory-"));
});
afterAll(async () => {
  await shutdownCalculator();
  await fs.rm(root, { recursive: true, force: true });
  await fs.rm(base, { recursive: true, force: true });
});

describe("GRPO run memory", () => {
  it("a full collection is available at step boundaries", () => {
    expect(collectGarbage()).toBe(true);
  });

  it("tensors, tensor bytes, wasm heap and live JS heap stay flat across steps", async () => {
    const data = path.join(root, "one-question.jsonl");
    const row = JSON.stringify({
      question: "Tom has 12 apples and buys 30 more. How many apples does he have?",
      answer: "12+30=<<12+30=42>>42 apples.\n#### 42",
    });
    await fs.writeFile(data, Array.from({ length: 4 }, () => row).join("\n") + "\n");
    const steps = 8;
    const out = path.join(root, "grpo");
    await runGrpo({
      ...defaultsOf(GRPO_FLAGS),
      model_path: base,
      dataset: data,
      eval_samples: 0,
      max_steps: steps,
      prompts_per_step: 2,
      samples_per_prompt: 4,
      max_new_tokens: 24,
      max_turns: 2,
      temperature: 1,
      beta: 0,
      lora_r: 4,
      lora_alpha: 8,
      quantize: "nf4",
      micro_batch_size: 4,
      save_steps: 1,
      save_total_limit: 2,
      tools_in_prompt: false,
      seed: 5,
      output_dir: out,
      backend: "wasm",
      quiet: true,
      // Random weights never answer right: reward even token ids, so every group carries a signal and trains.
      reward_weights: registerReward(
        "even",
        (t) => t.completionIds.filter((id) => id % 2 === 0).length / Math.max(1, t.completionIds.length),
      ),
    });
    const m = await readMetrics(path.join(out, "metrics.jsonl"));
    const col = (k: string) => m.filter((r) => typeof r[k] === "number").map((r) => r[k] as number);
    expect(col("tensors")).toHaveLength(steps);
    const show = ["tensors", "tensor_bytes", "wasm_bytes", "heap_bytes", "completion_len_max"]
      .map((k) => `${k}: ${col(k).join(" ")}`)
      .join("\n");
    expect(new Set(col("tensors")).size, show).toBe(1);
    expect(new Set(col("tensor_bytes")).size, show).toBe(1);
    // The wasm heap grows to the largest batch's peak and never shrinks. It may grow until the step
    // after the first one whose longest rollout is the run's longest (the first update leaves long-lived
    // blocks, AdamW's moments among them, between its freed buffers, so the next peak can need one more
    // growth), and must stay flat from there on: at least three steps of the same shapes.
    const heap = col("wasm_bytes");
    const longest = col("completion_len_max");
    const first = longest.indexOf(Math.max(...longest));
    expect(first, show).toBeLessThanOrEqual(steps - 4);
    expect(new Set(heap.slice(first + 1)).size, show).toBe(1);
    for (let i = 1; i <= first; i++) expect(heap[i], show).toBeGreaterThanOrEqual(heap[i - 1]);
    // The JS heap after each step's collection holds no per-step garbage: without the collection it
    // rose and fell by ~18 MB over these steps (a step's garbage is ~1.6 MB here, ~7 MB in the preset).
    const js = col("heap_bytes").slice(1);
    expect(Math.max(...js) - Math.min(...js), show).toBeLessThan(3 * 2 ** 20);
    expect((js[js.length - 1] - js[0]) / (js.length - 1), show).toBeLessThan(256 * 1024);
  }, 300_000);
});
