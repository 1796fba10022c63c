/** An adapter names its base relative to its own folder (PEFT's base_model_name_or_path may be a
 *  path), so a run folder moved or shared together with its base still opens, and the grading server
 *  finds the base inside the workspace the two were copied into. */
import { afterAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { adapterBaseName } from "../../src/model/peft.ts";
import { adapterBaseOf, openPolicy, savePolicy } from "../../src/run/policy.ts";
import { inspectModelFolder } from "../../src/serve/workspace.ts";
import { TINY_BASE_DIR } from "../../src/presets/tiny.ts";
import { UsageError } from "../../src/util/errors.ts";
import { makeTinyModelDir } from "./helpers/tiny-fixture.ts";

const dirs: string[] = [];
afterAll(async () => {
  for (const d of dirs) await fs.rm(d, { recursive: true, force: true });
});

describe("an adapter's base_model_name_or_path", () => {
  it("is stored relative to the adapter folder and resolved from there after the folders move", async () => {
    const root = await fs.mkdtemp(path.join(os.tmpdir(), "marl-base-"));
    dirs.push(root);
    const made = await makeTinyModelDir();
    await fs.mkdir(path.join(root, "models"));
    await fs.cp(made, path.join(root, "models", "base"), { recursive: true });
    await fs.rm(made, { recursive: true, force: true });
    const policy = await openPolicy({
      modelPath: path.join(root, "models", "base"),
      quantize: "none",
      lora: { r: 2, alpha: 4, dropout: 0, targetModules: ["q_proj", "v_proj"] },
      trainable: "lora",
      backend: "wasm",
    });
    const final = path.join(root, "runs", "grpo", "final");
    await savePolicy(policy, final, false);
    policy.model.dispose();
    const cfg = JSON.parse(await fs.readFile(path.join(final, "adapter_config.json"), "utf8"));
    expect(cfg.base_model_name_or_path).toBe(path.join("..", "..", "..", "models", "base"));

    // The whole tree moves (another machine, a shared folder, a grading workspace).
    const moved = root + "-moved";
    dirs.push(moved);
    await fs.rename(root, moved);
    const movedFinal = path.join(moved, "runs", "grpo", "final");
    expect(await adapterBaseOf(movedFinal)).toBe(path.join(moved, "models", "base"));
    const reopened = await openPolicy({ modelPath: movedFinal, quantize: "none", backend: "wasm" });
    expect([reopened.base, reopened.adapterDir]).toEqual([path.join(moved, "models", "base"), movedFinal]);
    reopened.model.dispose();
    // The grading server, with the moved tree as its workspace, takes the adapter and its base.
    const ws = await fs.realpath(moved);
    const folder = await inspectModelFolder(path.join(ws, "runs", "grpo", "final"), {
      workspace: ws,
      scenarioBase: TINY_BASE_DIR,
      scenarioBaseDir: await fs.realpath(TINY_BASE_DIR),
      maxBytes: 2 ** 30,
    });
    expect([folder.kind, folder.base]).toEqual(["adapter", path.join(ws, "models", "base")]);
  });

  it("copied without its base: says the name is the adapter's base, where it was looked for, and how to give it", async () => {
    const root = await fs.mkdtemp(path.join(os.tmpdir(), "marl-nobase-"));
    dirs.push(root);
    await fs.cp(TINY_BASE_DIR, path.join(root, "sft", "final"), { recursive: true });
    const policy = await openPolicy({
      modelPath: path.join(root, "sft", "final"),
      quantize: "none",
      lora: { r: 2, alpha: 4, dropout: 0, targetModules: ["q_proj", "v_proj"] },
      trainable: "lora",
      backend: "wasm",
    });
    await savePolicy(policy, path.join(root, "grpo", "final"), false);
    policy.model.dispose();
    // Only the adapter is copied elsewhere; its base_model_name_or_path is "../../sft/final".
    const copy = path.join(root, "elsewhere", "a", "b", "final");
    await fs.cp(path.join(root, "grpo", "final"), copy, { recursive: true });
    const file = path.join(copy, "adapter_config.json");
    expect(JSON.parse(await fs.readFile(file, "utf8")).base_model_name_or_path).toBe(path.join("..", "..", "sft", "final"));
    const err = await openPolicy({ modelPath: copy, quantize: "none", backend: "wasm" }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UsageError);
    expect((err as Error).message).toBe(
      `${file}: the adapter's base "../../sft/final" is not there (looked for ${path.join(root, "elsewhere", "a", "sft", "final")}, relative to the adapter folder); copy the base there, or pass the base with --model_path and this folder with --adapter`,
    );
    // The way out it names works.
    const given = await openPolicy({ modelPath: path.join(root, "sft", "final"), adapter: copy, quantize: "none", backend: "wasm" });
    expect(given.adapterDir).toBe(copy);
    given.model.dispose();
  });

  it("keeps a hub id (no such local folder) as given", () => {
    expect(adapterBaseName("/tmp/anywhere/final", "Qwen/Qwen2.5-0.5B-no-such-folder")).toBe("Qwen/Qwen2.5-0.5B-no-such-folder");
    expect(adapterBaseName("/a/runs/final", "")).toBe("");
  });
});
