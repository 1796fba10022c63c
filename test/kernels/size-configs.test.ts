/** gpu-check's larger shapes are Qwen2.5's (their parameter counts as published), and its --config
 *  names them in its one-line refusal of an unknown one (exit 2, the bad-input code). */
import { describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import * as path from "node:path";
import { SIZE_CONFIGS } from "../../scripts/lib/bench.ts";
import { paramCount } from "../../src/model/load.ts";

describe("gpu-check --config sizes", () => {
  it("are Qwen2.5-1.5B, 3B and 7B by parameter count (without q/k/v biases and norms)", () => {
    // Hugging Face's model cards: 1.54B, 3.09B, 7.61B parameters
    expect(paramCount(SIZE_CONFIGS["1.5b"]) / 1.54e9).toBeCloseTo(1, 2);
    expect(paramCount(SIZE_CONFIGS["3b"]) / 3.09e9).toBeCloseTo(1, 2);
    expect(paramCount(SIZE_CONFIGS["7b"]) / 7.61e9).toBeCloseTo(1, 2);
  });

  it("refuses an unknown config in one line naming the accepted ones, exit 2", () => {
    const r = spawnSync(path.resolve("node_modules/.bin/tsx"), ["scripts/gpu-check.ts", "--config", "13b"], { encoding: "utf8" });
    expect(r.status).toBe(2);
    expect(r.stderr.trim()).toMatch(/--config must be one of 0\.5b, small, 1\.5b, 3b, 7b, got "13b"$/);
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
  });
});
