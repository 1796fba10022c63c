/** Adding a rollout engine from outside the project: a throwaway engine, defined in this file only,
 *  registered with a flag of its own. The flag joins the scripts that take --rollout_engine (GRPO,
 *  eval, chat: their tables were built before it registered), its help joins --rollout_engine's,
 *  and a 1-step tiny GRPO parsed from a command line runs through it with the flag's value. */
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { defineRolloutEngine, prepareEngine, registerRolloutEngine, type RolloutEngine } from "../../src/index.ts";
import { localGenerate, stepConfig } from "../../src/rollout/engines/local.ts";
import { chatCommand } from "../../src/run/chat.ts";
import { evalCommand } from "../../src/run/eval-run.ts";
import { flag, parseIntArg } from "../../src/util/flag.ts";
import { grpoCommand, parseGrpoArgs } from "../../src/run/grpo-flags.ts";
import { runGrpo } from "../../src/run/grpo-run.ts";
import { TINY_BASE_DIR } from "../../src/presets/tiny.ts";

/** What the engine saw: the flag's value at prepare, and the steps it rolled out. */
const seen = { stride: [] as number[], steps: [] as number[] };

/** The local engine's rollouts, reporting its flag in the step's metrics. */
const throwaway = defineRolloutEngine({
  name: "throwaway",
  help: "throwaway (a test's engine: the local engine's rollouts)",
  flags: {
    throwaway_stride: flag(
      "--throwaway_stride <n>",
      "with --rollout_engine throwaway: a number it reports",
      parseIntArg("throwaway_stride", 1),
      3,
    ),
  },
  async prepare(f) {
    seen.stride.push(f.throwaway_stride);
    return async (ctx): Promise<RolloutEngine> => ({
      name: "throwaway",
      behaviourLogprobs: false,
      offPolicy: false,
      generate: localGenerate(ctx.model, ctx.tokenizer),
      async rollouts(req) {
        seen.steps.push(req.step);
        const trajs = await localGenerate(ctx.model, ctx.tokenizer)(req.prompts(req.step), stepConfig(ctx, req));
        return { trajs, metrics: { throwaway_stride: f.throwaway_stride } };
      },
      async close() {},
    });
  },
});
registerRolloutEngine(throwaway);

const out = await fs.mkdtemp(path.join(os.tmpdir(), "register-engine-"));
afterAll(() => fs.rm(out, { recursive: true, force: true }));

describe("registerRolloutEngine", () => {
  it("adds the engine to --rollout_engine and its flag to GRPO, eval and chat", () => {
    for (const cmd of [grpoCommand(), evalCommand(), chatCommand()]) {
      const help = cmd.helpInformation().replace(/\s+/g, " ");
      expect(help).toContain("--throwaway_stride <n> with --rollout_engine throwaway: a number it reports (default: 3)");
      expect(help).toMatch(/--rollout_engine <kind> .* or throwaway \(a test's engine: the local engine's rollouts\)/);
    }
    expect(() => registerRolloutEngine(throwaway)).toThrow("rollout engine throwaway is registered already");
    expect(() => registerRolloutEngine({ ...throwaway, name: "other" })).toThrow(/flag --throwaway_stride <n> is a flag of its scripts/);
    expect(() => parseGrpoArgs(["node", "t", "--rollout_engine", "throwaway", "--throwaway_stride", "0"])).toThrow(
      '--throwaway_stride "0": expected a whole number >= 1',
    );
  });

  it("runs a 1-step tiny GRPO through it, with its flag from the command line", async () => {
    const argv = ["--preset", "tiny", "--model_path", TINY_BASE_DIR, "--max_steps", "1", "--prompts_per_step", "2"];
    argv.push("--samples_per_prompt", "2", "--max_new_tokens", "32", "--output_dir", out);
    const cfg = parseGrpoArgs(["node", "t", ...argv, "--rollout_engine", "throwaway", "--throwaway_stride", "7"]);
    expect(cfg).toMatchObject({ rollout_engine: "throwaway", throwaway_stride: 7 });
    const r = await runGrpo({ ...cfg, quiet: true });
    expect(r.steps).toBe(1);
    expect(seen).toEqual({ stride: [7], steps: [0] });
    const metrics = JSON.parse((await fs.readFile(path.join(out, "metrics.jsonl"), "utf8")).trim());
    expect(metrics).toMatchObject({ step: 1, throwaway_stride: 7 });
    expect(JSON.parse(await fs.readFile(path.join(out, "run.json"), "utf8"))).toMatchObject({ config: { throwaway_stride: 7 } });
  });

  it("fills the flag's default where a run does not give it", async () => {
    await prepareEngine({ rollout_engine: "throwaway" }, () => {});
    expect(seen.stride.at(-1)).toBe(3);
  });
});
