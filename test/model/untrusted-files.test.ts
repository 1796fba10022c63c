/** Model, adapter and index files are user input: a shard index cannot reach outside its folder,
 *  overlapping tensor ranges are refused, a null adapter config is named, and error text quoting a
 *  file's bytes cannot drive the terminal. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { printable, runMain } from "../../src/run/cli.ts";
import { LoraAdapter } from "../../src/model/lora.ts";
import { Checkpoint, encodeSafetensors, SafetensorsFile } from "../../src/model/safetensors.ts";
import { sampleRow } from "../../src/rollout/sampler.ts";
import { checkModelSource } from "../../src/run/policy.ts";
import { NonFiniteError } from "../../src/util/errors.ts";
import { SMALL_MODEL_CONFIG } from "../run/helpers/tiny-fixture.ts";

let root: string;
beforeAll(async () => {
  root = await fs.mkdtemp(path.join(os.tmpdir(), "marl-untrusted-"));
});
afterAll(async () => {
  await fs.rm(root, { recursive: true, force: true });
});

const tensor = { shape: [2], data: new Float32Array([1, 2]) };

async function indexedModel(name: string, weightMap: Record<string, unknown>): Promise<string> {
  const dir = path.join(root, name, "model");
  await fs.mkdir(dir, { recursive: true });
  await fs.writeFile(path.join(dir, "model.safetensors.index.json"), JSON.stringify({ weight_map: weightMap }));
  return dir;
}

describe("a sharded index", () => {
  it("cannot name a file outside the model folder, nor a non-string", async () => {
    const other = path.join(root, "other");
    await fs.mkdir(other, { recursive: true });
    await fs.writeFile(path.join(other, "shard.safetensors"), encodeSafetensors({ w: tensor }));
    const passwd = await indexedModel("passwd", { w: "../../../../../../../../etc/passwd" });
    await expect(Checkpoint.open(passwd)).rejects.toThrow(
      /weight_map\["w"\] is "(\.\.\/)+etc\/passwd", which is outside .*; expected a file name inside the model folder/,
    );
    const sibling = await indexedModel("sibling", { w: "../../other/shard.safetensors" });
    await expect(Checkpoint.open(sibling)).rejects.toThrow(/which is outside/);
    const absolute = await indexedModel("absolute", { w: path.join(other, "shard.safetensors") });
    await expect(Checkpoint.open(absolute)).rejects.toThrow(/which is outside/);
    const numeric = await indexedModel("numeric", { w: 7 });
    await expect(Checkpoint.open(numeric)).rejects.toThrow(/weight_map\["w"\] is 7; expected a file name inside/);
    const inside = await indexedModel("inside", { w: "sub/../shard.safetensors" });
    await fs.writeFile(path.join(inside, "shard.safetensors"), encodeSafetensors({ w: tensor }));
    expect((await Checkpoint.open(inside)).keys()).toEqual(["w"]);
  });

  it("a header whose tensors overlap is corrupt", async () => {
    const header = Buffer.from(
      JSON.stringify({ a: { dtype: "F32", shape: [2], data_offsets: [0, 8] }, b: { dtype: "F32", shape: [2], data_offsets: [4, 12] } }),
    );
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(header.length));
    const file = path.join(root, "overlap.safetensors");
    await fs.writeFile(file, Buffer.concat([len, header, Buffer.alloc(12)]));
    await expect(SafetensorsFile.open(file)).rejects.toThrow(/tensors a and b overlap/);
  });
});

describe("adapter folders", () => {
  it("an adapter_config.json holding null is named, not a TypeError", async () => {
    const dir = path.join(root, "null-adapter");
    await fs.mkdir(dir);
    await fs.writeFile(path.join(dir, "adapter_config.json"), "null");
    await expect(LoraAdapter.load(dir, SMALL_MODEL_CONFIG)).rejects.toThrow(/adapter_config.json: holds null; expected a JSON object/);
  });

  it("--init_adapter errors name --init_adapter", async () => {
    const model = path.join(root, "m");
    await fs.mkdir(model);
    await fs.writeFile(path.join(model, "config.json"), "{}");
    await expect(checkModelSource(model, "--model_path", root, "--init_adapter")).rejects.toThrow(
      /^--init_adapter .*: no adapter_config.json there/,
    );
  });
});

describe("error text", () => {
  it("shows control characters escaped", async () => {
    expect(printable("bad \u001b[2J\u0000name\ttab")).toBe("bad \\x1b[2J\\x00name\ttab"); // a tab is harmless
    const lines: string[] = [];
    await runMain(
      async () => {
        throw new Error("tensor \u001b]0;owned\u0007 missing");
      },
      { exit: () => {}, stderr: (l) => lines.push(l), env: {} },
    );
    expect(lines).toEqual(["error: tensor \\x1b]0;owned\\x07 missing"]);
  });

  it("non-finite logits (weights blown up by the learning rate) are a NonFiniteError", () => {
    const row = new Float32Array([NaN, NaN, NaN]);
    expect(() => sampleRow(row, { temperature: 1, topP: 1, topK: 0 }, 0.5)).toThrow(NonFiniteError);
  });
});
