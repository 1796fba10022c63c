/** The KV cache on webgpu: a decode step writes its position into the cache's own buffers (no copy
 *  of the cache, no buffers or shaders of a new size each step) and adds the mask and the q/k/v bias
 *  in their products, with the full-recompute logits across the cache's growth; the same suite as wasm's
 *  (test/model/kvcache-suite.ts). */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../../src/engine/backend.ts";
import { slotWrites } from "../../../src/engine/slot-write.ts";
import { loadModel } from "../../../src/model/load.ts";
import type { Qwen2ForCausalLM } from "../../../src/model/qwen2.ts";
import { slotWriteTests } from "../../model/kvcache-suite.ts";
import { webgpuForTests } from "./adapter.ts";

const gpu = await webgpuForTests();
const FIX = "test/fixtures/qwen2-tiny";

describe.skipIf(!gpu)("KV cache (webgpu)", () => {
  let model: Qwen2ForCausalLM;
  beforeAll(async () => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    model = await loadModel(FIX, { adapter: `${FIX}/lora` });
  });

  it("writes in place on webgpu", () => {
    const t = tf.zeros([1, 2, 3, 4]);
    expect(slotWrites(t)).toBe(true);
    t.dispose();
  });

  it("a decode step adds the attention mask and the q/k/v bias in their products (no Add of either)", async () => {
    const { logits, cache } = model.prefill([[3, 4, 5, 6]], [[0, 1, 1, 1]]);
    const prof = await tf.profile(() => model.decodeStep([7], cache).dispose());
    const heads = model.config.numAttentionHeads;
    const scoreAdds = prof.kernels.filter((k) => k.name === "Add" && k.inputShapes.some((s) => s?.length === 4 && s[1] === heads));
    expect(scoreAdds).toEqual([]);
    const biasAdds = prof.kernels.filter((k) => k.name === "Add" && k.inputShapes.some((s) => s?.length === 1));
    expect(biasAdds).toEqual([]);
    expect(prof.kernels.filter((k) => k.name === "_FusedMatMul").length).toBeGreaterThanOrEqual(2 * model.config.numHiddenLayers);
    tf.dispose([logits]);
    cache.dispose();
  });

  slotWriteTests(() => model);
});
