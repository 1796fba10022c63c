/** --no-unpack_base: from the flag through openPolicy to the model rollouts unpack. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import { Command } from "commander";
import { addModelOptions } from "../../src/run/options.ts";
import { openPolicy } from "../../src/run/policy.ts";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { makeTinyModelDir } from "./tiny-fixture.ts";

let dir: string;
beforeAll(async () => {
  dir = await makeTinyModelDir();
});
afterAll(() => fs.rm(dir, { recursive: true, force: true }));

describe("unpacking a quantized base for generation", () => {
  it("is on by default and off with --no-unpack_base", async () => {
    const parse = (...argv: string[]) => addModelOptions(new Command(), { modelPath: "x", quantize: "nf4" }).parse(argv, { from: "user" }).opts();
    expect(parse().unpack_base).toBe(true);
    expect(parse("--no-unpack_base").unpack_base).toBe(false);
    for (const unpackBase of [undefined, true, false]) {
      const policy = await openPolicy({ modelPath: dir, quantize: "nf4", backend: "wasm", unpackBase });
      expect((policy.model as Qwen2ForCausalLM).unpackForGeneration).toBe(unpackBase ?? true);
      policy.model.dispose();
    }
  });
});
