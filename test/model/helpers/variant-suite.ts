/** Golden logits for a Qwen2 unlike the main fixture in every way a loader can get wrong (untied
 *  lm_head, MHA, F16 weights, a PEFT adapter on q_proj and v_proj only), from the independent PyTorch
 *  reference (test/fixtures/qwen2-variant/make.py). One suite for every backend. */
import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { readFileSync } from "node:fs";
import { initBackend } from "../../../src/kernels/backend.ts";
import { loadModel } from "../../../src/model/load.ts";

const DIR = "test/fixtures/qwen2-variant";
const exp = JSON.parse(readFileSync(`${DIR}/expected.json`, "utf8"));

export function variantSuite(backend: "wasm" | "webgpu") {
  describe(`qwen2 variant: untied head, MHA, F16, LoRA on q/v (${backend})`, () => {
    it("base and LoRA logits match the PyTorch reference to 1e-4", async () => {
      expect(await initBackend(backend)).toBe(backend);
      for (const [adapter, want] of [
        [undefined, exp.base_logits],
        [`${DIR}/lora`, exp.lora_logits],
      ] as const) {
        const m = await loadModel(DIR, { adapter });
        expect(m.weights.lmHeadT).not.toBeNull();
        if (adapter) expect(m.lora!.targetModules).toEqual(["q_proj", "v_proj"]);
        const logits = m.forward(exp.input_ids, exp.attention_mask);
        const got = (await logits.array()) as number[][][];
        tf.dispose(logits);
        m.dispose();
        let worst = 0;
        exp.valid_positions.forEach((ps: number[], b: number) =>
          ps.forEach((t, k) => got[b][t].forEach((v, j) => (worst = Math.max(worst, Math.abs(v - want[b][k][j]))))),
        );
        console.log(`${backend} ${adapter ? "lora" : "base"} logits max |Δ| ${worst.toExponential(2)}`);
        expect(worst).toBeLessThanOrEqual(1e-4);
      }
    });
  });
}
