/** Flag tables (src/run/flags.ts): the parsed options are the config, an old flag name still works,
 *  presets fill only what was not given, and the resume identity leaves out the `free` flags. */
import { describe, expect, it } from "vitest";
import { UsageError } from "../../src/util/errors.ts";
import { TINY_BASE_DIR } from "../../src/presets/tiny.ts";
import { TINY_GRPO } from "../../src/run/grpo-flags.ts";
import { CHAT_FLAGS } from "../../src/run/chat-flags.ts";
import { parseChatArgs } from "../../src/run/chat.ts";
import { EVAL_FLAGS } from "../../src/run/eval-flags.ts";
import { parseEvalArgs } from "../../src/run/eval-run.ts";
import { commandOf, defaultsOf, parseFlags, runIdentity } from "../../src/run/flags.ts";
import { GRPO_FLAGS } from "../../src/run/grpo-flags.ts";
import { SFT_FLAGS } from "../../src/run/sft-flags.ts";

const grpo = (...args: string[]) => parseFlags(commandOf("t", "", GRPO_FLAGS), GRPO_FLAGS, ["node", "t", ...args], { tiny: TINY_GRPO });

describe("flag tables", () => {
  it("parse into options named as the flags, with the table's defaults", () => {
    const { o } = grpo("--beta", "0", "--no-tools_in_prompt");
    expect(o).toEqual({ ...defaultsOf(GRPO_FLAGS), beta: 0, tools_in_prompt: false });
    expect(defaultsOf(GRPO_FLAGS)).toMatchObject({
      max_steps: 100,
      loss_type: "grpo",
      tools_in_prompt: true,
      unpack_base: true,
      overwrite: false,
      epsilon_high: undefined,
    });
    expect(defaultsOf(SFT_FLAGS)).toMatchObject({ learning_rate: 2e-4, lr_scheduler: "cosine", full: false, quantize: "none" });
  });

  it("accept --total_epochs as the older name of --max_steps, and refuse both at once", () => {
    const { o } = grpo("--total_epochs", "7");
    expect(o.max_steps).toBe(7);
    expect(o).not.toHaveProperty("total_epochs");
    expect(grpo("--preset", "tiny", "--total_epochs", "3").o.max_steps).toBe(3); // the alias beats the preset
    expect(() => grpo("--max_steps", "3", "--total_epochs", "4")).toThrow(UsageError);
    expect(() => grpo("--total_epochs", "0")).toThrow(/--max_steps "0": expected a whole number >= 1/);
  });

  it("take --micro_batch_size as a whole number ≥ 1 or auto, refusing anything else in one line", () => {
    expect(grpo("--micro_batch_size", "auto").o.micro_batch_size).toBe("auto");
    expect(grpo("--micro_batch_size", "3").o.micro_batch_size).toBe(3);
    for (const bad of ["0", "2.5", "big"]) expect(() => grpo("--micro_batch_size", bad)).toThrow(/expected a whole number ≥ 1 or auto$/);
  });

  it("let explicit flags win over the preset", () => {
    const { o, preset } = grpo("--preset", "tiny", "--learning_rate", "0.1");
    expect(preset).toBe("tiny");
    expect(o).toMatchObject({ learning_rate: 0.1, max_steps: 24, loss_type: TINY_GRPO.loss_type, quantize: "nf4" });
  });

  it("leave the free flags out of the resume identity", () => {
    const a = runIdentity(GRPO_FLAGS, grpo("--max_steps", "5", "--save_steps", "1").o);
    const b = runIdentity(GRPO_FLAGS, grpo("--max_steps", "9", "--overwrite").o);
    expect(a).toEqual(b);
    expect(a).toHaveProperty("learning_rate");
    expect(a).not.toHaveProperty("max_steps");
    expect(runIdentity(GRPO_FLAGS, grpo("--learning_rate", "0.5").o)).not.toEqual(a);
  });
});

describe("eval and chat", () => {
  it("their configs are their parsed flags, plus only the values the flags leave open", async () => {
    const e = await parseEvalArgs([
      "node",
      "eval",
      "--model_path",
      TINY_BASE_DIR,
      "--dataset",
      "synthetic",
      "--max_samples",
      "3",
      "--no-tools_in_prompt",
      "--output_dir",
      "/tmp/x",
    ]);
    const { models, compare, skipped, synthetic, ...flags } = e;
    expect(flags).toEqual({
      ...defaultsOf(EVAL_FLAGS),
      model_path: TINY_BASE_DIR,
      dataset: "synthetic",
      max_samples: 3,
      tools_in_prompt: false,
      output_dir: "/tmp/x",
    });
    expect({ models, compare, skipped, synthetic }).toEqual({
      models: [{ name: "tiny", modelPath: TINY_BASE_DIR, quantize: "none" }],
      compare: [],
      skipped: [],
      synthetic: undefined,
    });
    const c = await parseChatArgs(["node", "chat", "--model_path", TINY_BASE_DIR, "--top_p", "0.9", "--tools", "calculator"]);
    expect(c).toEqual({ ...defaultsOf(CHAT_FLAGS), model_path: TINY_BASE_DIR, top_p: 0.9 });
  });
});
