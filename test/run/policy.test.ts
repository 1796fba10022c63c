/** --no-unpack_base: the flag, the eval and chat configs built from it, and openPolicy setting it on the
 *  model that rollouts unpack. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import { Command } from "commander";
import * as path from "node:path";
import { parseChatArgs } from "../../src/run/chat.ts";
import { parseEvalArgs } from "../../src/run/eval-run.ts";
import { addModelOptions } from "../../src/run/options.ts";
import { openPolicy } from "../../src/run/policy.ts";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { makeTinyModelDir } from "./helpers/tiny-fixture.ts";

let dir: string;
beforeAll(async () => {
  dir = await makeTinyModelDir();
});
afterAll(() => fs.rm(dir, { recursive: true, force: true }));

describe("unpacking a quantized base for generation", () => {
  it("is on by default and off with --no-unpack_base", async () => {
    const parse = (...argv: string[]) =>
      addModelOptions(new Command(), { modelPath: "x", quantize: "nf4" }).parse(argv, { from: "user" }).opts();
    expect(parse().unpack_base).toBe(true);
    expect(parse("--no-unpack_base").unpack_base).toBe(false);
    const evalArgs = (...extra: string[]) =>
      parseEvalArgs(["node", "eval", "--model_path", dir, "--dataset", "synthetic", "--output_dir", path.join(dir, "eval"), ...extra]);
    expect((await evalArgs()).unpack_base).toBe(true);
    expect((await evalArgs("--no-unpack_base")).unpack_base).toBe(false);
    const chatArgs = (...extra: string[]) => parseChatArgs(["node", "chat", "--model_path", dir, ...extra]);
    expect((await chatArgs()).unpack_base).toBe(true);
    expect((await chatArgs("--no-unpack_base")).unpack_base).toBe(false);
    for (const unpackBase of [undefined, true, false]) {
      const policy = await openPolicy({ modelPath: dir, quantize: "nf4", backend: "wasm", unpackBase });
      expect((policy.model as Qwen2ForCausalLM).unpackForGeneration).toBe(unpackBase ?? true);
      policy.model.dispose();
    }
  });
});
