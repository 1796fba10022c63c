/** The KV cache on webgpu: a decode step writes its position into the cache's own buffers (no copy
 *  of the cache, no buffers or shaders of a new size each step) and adds the mask and the q/k/v bias
 *  in their products, with the full-recompute logits across the cache's growth; the same suite as wasm's
 *  (test/model/kvcache-suite.ts). */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../../src/kernels/backend.ts";
import { decodeHeads, decodeHeadsInto } from "../../../src/kernels/heads.ts";
import { slotWrites } from "../../../src/kernels/slot-write.ts";
import { loadModel } from "../../../src/model/load.ts";
import type { Qwen2ForCausalLM } from "../../../src/model/qwen2.ts";
import { slotWriteTests } from "../../model/helpers/kvcache-suite.ts";
import { randn } from "../../model/helpers/lora-setup.ts";
import { webgpuForTests } from "./helpers/adapter.ts";

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

  it("decodeHeadsInto: decodeHeads' q, and its k and v written into the cache's slot, nothing else touched", async () => {
    const B = 2,
      nH = 4,
      nKv = 2,
      hd = 8,
      W = 6,
      pos = 3;
    const qkv = randn([B, (nH + 2 * nKv) * hd], 1) as tf.Tensor2D;
    const cos = randn([B, 1, 1, hd], 2) as tf.Tensor4D,
      sin = randn([B, 1, 1, hd], 3) as tf.Tensor4D;
    const kDst = tf.add(randn([B, nKv, hd, W], 4), 0) as tf.Tensor4D, // data of their own
      vDst = tf.add(randn([B, nKv, W, hd], 5), 0) as tf.Tensor4D;
    const k0 = (await kDst.array()) as number[][][][],
      v0 = (await vDst.array()) as number[][][][];
    const [q, k, v] = decodeHeads(qkv, cos, sin, nH, nKv, hd, 0.35)!;
    const qi = decodeHeadsInto(qkv, cos, sin, nH, nKv, hd, 0.35, kDst, vDst, pos)!;
    expect(qi.shape).toEqual(q.shape);
    expect(Array.from(await qi.data())).toEqual(Array.from(await q.data()));
    const [kn, vn] = [(await k.array()) as number[][][][], (await v.array()) as number[][][][]];
    const [kw, vw] = [(await kDst.array()) as number[][][][], (await vDst.array()) as number[][][][]];
    for (let b = 0; b < B; b++)
      for (let h = 0; h < nKv; h++)
        for (let j = 0; j < hd; j++)
          for (let w = 0; w < W; w++) {
            expect(kw[b][h][j][w]).toBe(w === pos ? kn[b][h][j][0] : k0[b][h][j][w]);
            expect(vw[b][h][w][j]).toBe(w === pos ? vn[b][h][0][j] : v0[b][h][w][j]);
          }
    tf.dispose([qkv, cos, sin, kDst, vDst, q, k, v, qi]);
  });

  slotWriteTests(() => model);
});
