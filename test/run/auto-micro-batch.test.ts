/** --micro_batch_size auto says what it chose: once at the first update (micro-batches, rollouts in
 *  each), again at a step whose split ran out of device memory and was halved; run.json keeps the
 *  first choice and metrics.jsonl every step's. The out-of-memory error is simulated: the device
 *  check reports one at the second step's trial (wasm has no such error to give). */
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { shutdownCalculator } from "../../src/agents/calculator.ts";
import { defaultsOf } from "../../src/run/flags.ts";
import { GRPO_FLAGS } from "../../src/run/grpo-flags.ts";
import { runGrpo } from "../../src/run/grpo-run.ts";
import { autoMicroBatchFields, autoMicroBatchNote } from "../../src/run/grpo-step.ts";
import { noUpdateStats, type GrpoStats } from "../../src/trainer/grpo.ts";
import { readMetrics } from "../../src/trainer/metrics.ts";
import { registerReward } from "./helpers/reward.ts";
import { makeTinyModelDir } from "./helpers/tiny-fixture.ts";

const device = vi.hoisted(() => ({ outOfMemoryNext: false }));
vi.mock("../../src/kernels/webgpu/device.ts", async (original) => ({
  ...(await original<typeof import("../../src/kernels/webgpu/device.ts")>()),
  deviceOutOfMemory: async (f: () => Promise<void>) => {
    if (device.outOfMemoryNext) return !(device.outOfMemoryNext = false);
    await f();
    return false;
  },
}));

const stats = (count: number, rows: number, outOfMemory: number): GrpoStats => ({
  ...noUpdateStats(8),
  microBatch: { count, rows, outOfMemory },
});

describe("autoMicroBatchNote", () => {
  it("says the choice at the first update, and again only after running out of memory", () => {
    expect(autoMicroBatchNote(stats(1, 8, 0), true)).toBe("--micro_batch_size auto: 1 micro-batch of up to 8 rollouts");
    expect(autoMicroBatchNote(stats(3, 3, 0), false)).toBeNull();
    expect(autoMicroBatchNote(stats(2, 4, 1), false)).toBe(
      "--micro_batch_size auto: out of device memory once, halved; now 2 micro-batches of up to 4 rollouts",
    );
    expect(autoMicroBatchNote(stats(8, 1, 3), true)).toBe(
      "--micro_batch_size auto: out of device memory 3 times, halved; now 8 micro-batches of up to 1 rollout",
    );
    expect(autoMicroBatchNote(noUpdateStats(8), true)).toBeNull(); // nothing updated: nothing chosen yet
    expect(autoMicroBatchFields(stats(2, 4, 1))).toEqual({ micro_batches: 2, micro_batch_rows: 4, micro_batch_out_of_memory: 1 });
  });
});

let root: string, base: string;
beforeAll(async () => {
  base = await makeTinyModelDir();
  root = await fs.mkdtemp(path.join(os.tmpdir(), "marl-auto-mb-"));
});
afterAll(async () => {
  await shutdownCalculator();
  await fs.rm(root, { recursive: true, force: true });
  await fs.rm(base, { recursive: true, force: true });
});

describe("a GRPO run with --micro_batch_size auto", () => {
  it("prints its choice once, and again when an out-of-memory error halves it; run.json and metrics.jsonl keep it", async () => {
    const data = path.join(root, "questions.jsonl");
    const row = JSON.stringify({ question: "Tom has 12 apples and buys 30 more. How many?", answer: "12+30=<<12+30=42>>42\n#### 42" });
    await fs.writeFile(data, Array.from({ length: 4 }, () => row).join("\n") + "\n");
    const out = path.join(root, "grpo");
    const lines: string[] = [];
    const write = vi.spyOn(process.stderr, "write").mockImplementation((chunk) => (lines.push(...String(chunk).split("\n")), true));
    let scored = 0;
    try {
      await runGrpo({
        ...defaultsOf(GRPO_FLAGS),
        model_path: base,
        dataset: data,
        eval_samples: 0,
        max_steps: 3,
        prompts_per_step: 2,
        samples_per_prompt: 4,
        max_new_tokens: 12,
        max_turns: 1,
        temperature: 1,
        beta: 0,
        lora_r: 4,
        lora_alpha: 8,
        micro_batch_size: "auto",
        tools_in_prompt: false,
        seed: 5,
        output_dir: out,
        backend: "wasm",
        // Every rollout a distinct reward, so every one trains; the second step's scoring arms the error.
        reward_weights: registerReward("distinct", (t) => {
          if (++scored === 9) device.outOfMemoryNext = true;
          return t.completionIds.reduce((a, id) => a + id, 0) + scored / 100;
        }),
      });
    } finally {
      write.mockRestore();
    }
    const notes = lines.filter((l) => l.includes("--micro_batch_size auto"));
    expect(notes).toEqual([
      "step 1: --micro_batch_size auto: 1 micro-batch of up to 8 rollouts",
      "step 2: --micro_batch_size auto: out of device memory once, halved; now 2 micro-batches of up to 4 rollouts",
    ]);
    const run = JSON.parse(await fs.readFile(path.join(out, "run.json"), "utf8"));
    expect(run.micro_batch_auto).toEqual({ step: 1, micro_batches: 1, micro_batch_rows: 8, micro_batch_out_of_memory: 0 });
    expect(run.config.micro_batch_size).toBe("auto");
    const m = await readMetrics(path.join(out, "metrics.jsonl"));
    expect(m.map((r) => [r.micro_batches, r.micro_batch_rows, r.micro_batch_out_of_memory])).toEqual([
      [1, 8, 0],
      [2, 4, 1],
      [2, 4, 0],
    ]);
  });
});
