/** The command lines of the project this one grew from: `--model_path RUN` (its SFT wrote the model
 *  into --output_dir) takes RUN/final, and `--model_path RUN/epoch_N` (its GRPO wrote epoch_N/)
 *  takes the run's last model or checkpoint-N, or is a usage error that lists what the run holds. */
import { describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { runFolderModel } from "../../src/run/policy.ts";

async function makeRun(steps: number, folders: Record<string, string>): Promise<string> {
  const run = await fs.mkdtemp(path.join(os.tmpdir(), "run-folder-"));
  await fs.writeFile(path.join(run, "run.json"), JSON.stringify({ runKind: "grpo", config: { max_steps: steps } }));
  for (const [dir, file] of Object.entries(folders)) {
    await fs.mkdir(path.join(run, dir));
    await fs.writeFile(path.join(run, dir, file), "{}");
  }
  return run;
}

describe("run folders as model paths", () => {
  it("a run folder is its final model; epoch_N is the last model or checkpoint-N", async () => {
    const run = await makeRun(3, {
      final: "adapter_config.json",
      "checkpoint-2": "adapter_config.json",
      "checkpoint-3": "adapter_config.json",
    });
    const notes: string[] = [];
    const note = (l: string) => notes.push(l);
    expect(await runFolderModel(run, "--model_path", note)).toBe(path.join(run, "final"));
    expect(await runFolderModel(path.join(run, "epoch_3"), "--model_path", note)).toBe(path.join(run, "final"));
    expect(await runFolderModel(path.join(run, "epoch_2"), "--model_path", note)).toBe(path.join(run, "checkpoint-2"));
    expect(notes[0]).toMatch(/is a training run's folder: using its final model/);
    expect(notes[1]).toMatch(
      /runs write checkpoint-<step>\/ and final\/ instead of epoch_N\/ \(--total_epochs counts RL steps\); using .*final$/,
    );
  });

  it("a missing epoch_N is a usage error naming what the run holds; other paths are left alone", async () => {
    const run = await makeRun(3, { final: "adapter_config.json", "checkpoint-3": "adapter_config.json" });
    const err = await runFolderModel(path.join(run, "epoch_1"), "--model_path", () => undefined).then(
      () => null,
      (e: Error) => e,
    );
    expect(err?.name).toBe("UsageError");
    expect(err!.message).toMatch(/epoch_1: no such folder; .* holds checkpoint-3\/, final\/$/);
    expect(await runFolderModel(path.join(run, "final"), "--model_path", () => undefined)).toBeNull(); // a model folder itself
    expect(await runFolderModel("Qwen/Qwen2.5-0.5B", "--model_path", () => undefined)).toBeNull();
    expect(await runFolderModel(path.join(os.tmpdir(), "no-run-here", "epoch_3"), "--model_path", () => undefined)).toBeNull();
  });
});
