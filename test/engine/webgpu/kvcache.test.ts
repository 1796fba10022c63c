/** The KV cache on webgpu: a decode step writes its position into the cache's own buffers (no copy
 *  of the cache, no buffers or shaders of a new size each step), with the full-recompute logits
 *  across the cache's growth; the same suite as wasm's (test/model/kvcache-suite.ts). */
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

  slotWriteTests(() => model);
});
