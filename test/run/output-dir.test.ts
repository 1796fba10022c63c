import { describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { prepareOutputDir, readRunConfig, writeRunConfig } from "../../src/run/output-dir.ts";
import { UsageError } from "../../src/util/errors.ts";

const tmp = () => fs.mkdtemp(path.join(os.tmpdir(), "marl-out-"));

describe("prepareOutputDir", () => {
  it("creates a new folder and accepts an empty one", async () => {
    const root = await tmp();
    expect(await prepareOutputDir(path.join(root, "a", "b"), { runKind: "grpo" })).toEqual({ resumed: false });
    expect((await fs.stat(path.join(root, "a", "b"))).isDirectory()).toBe(true);
    expect(await prepareOutputDir(path.join(root, "a", "b"), { runKind: "grpo" })).toEqual({ resumed: false });
  });

  it("refuses a folder holding a run unless --overwrite or --resume, writing nothing", async () => {
    const dir = path.join(await tmp(), "run");
    await prepareOutputDir(dir, { runKind: "grpo" });
    await writeRunConfig(dir, { lr: 1e-5 }, "grpo");
    await fs.writeFile(path.join(dir, "metrics.jsonl"), '{"step":1}\n');
    const before = (await fs.readdir(dir)).sort();
    await expect(prepareOutputDir(dir, { runKind: "grpo" })).rejects.toThrow(/already holds a run; pass --resume .* or --overwrite/);
    // A run kind that cannot be continued (an evaluation) is not told to pass --resume.
    await expect(prepareOutputDir(dir, { runKind: "eval", resumable: false })).rejects.toThrow(
      /^--output_dir \S+ already holds a run; pass --overwrite to replace it or pick another --output_dir$/,
    );
    await expect(prepareOutputDir(dir, { runKind: "grpo", overwrite: true, resume: true })).rejects.toThrow(UsageError);
    await expect(prepareOutputDir(dir, { runKind: "sft", resume: true })).rejects.toThrow(/holds a grpo run, not sft/);
    expect((await fs.readdir(dir)).sort()).toEqual(before);

    expect(await prepareOutputDir(dir, { runKind: "grpo", resume: true })).toEqual({ resumed: true });
    expect((await readRunConfig(dir)).config).toEqual({ lr: 1e-5 });
    expect(await prepareOutputDir(dir, { runKind: "grpo", overwrite: true })).toEqual({ resumed: false });
    expect(await fs.readdir(dir)).toEqual([".lock"]); // emptied, and locked by this run
  });

  it("refuses a place where no folder can be made instead of hanging (/proc)", async () => {
    await expect(prepareOutputDir("/proc/self/out", { runKind: "grpo" })).rejects.toThrow(
      /^--output_dir \/proc\/self\/out: cannot create the folder/,
    );
  });

  it("on --resume, removes temp files of interrupted writes and puts back a folder moved aside", async () => {
    const dir = path.join(await tmp(), "run");
    await prepareOutputDir(dir, { runKind: "grpo" });
    await writeRunConfig(dir, {}, "grpo");
    for (const d of ["checkpoint-1", ".checkpoint-2.11.22.tmp", ".final.11.22.tmp", ".checkpoint-1.11.22.old", ".checkpoint-3.11.22.old"])
      await fs.mkdir(path.join(dir, d));
    await fs.writeFile(path.join(dir, "latest.11.22.tmp"), "checkpoint-2\n");
    await prepareOutputDir(dir, { runKind: "grpo", resume: true });
    expect((await fs.readdir(dir)).sort()).toEqual([".lock", "checkpoint-1", "checkpoint-3", "run.json"]);
  });

  it("never empties a folder that does not look like a run, and refuses --resume without a run", async () => {
    const dir = await tmp();
    await fs.writeFile(path.join(dir, "notes.txt"), "mine");
    await expect(prepareOutputDir(dir, { runKind: "grpo", overwrite: true })).rejects.toThrow(/not empty and does not hold a run/);
    await expect(prepareOutputDir(dir, { runKind: "grpo", resume: true })).rejects.toThrow(/holds no run to continue/);
    expect(await fs.readFile(path.join(dir, "notes.txt"), "utf8")).toBe("mine");
    await expect(prepareOutputDir(path.join(dir, "notes.txt"), { runKind: "grpo", flag: "--out" })).rejects.toThrow(
      /^--out .*notes.txt is a file/,
    );
  });
});
