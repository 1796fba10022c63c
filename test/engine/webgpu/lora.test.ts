/** LoRA on webgpu while generation holds the fused factors: y + the module's terms is the last
 *  product's epilogue (one dispatch, no Add), with the bits of the product and an Add, at a scaling
 *  folded into B (2) and one kept as a product (1.5). */
import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../../src/engine/backend.ts";
import { LoraAdapter, moduleDims } from "../../../src/model/lora.ts";
import { FUSED } from "../../../src/model/types.ts";
import { cfg, randn } from "../../model/helpers/lora-setup.ts";
import { webgpuForTests } from "./helpers/adapter.ts";

const gpu = await webgpuForTests();
describe.skipIf(!gpu)("LoRA terms on webgpu (held factors)", () => {
  it.each([8, 6])("alpha %d, r 4: y + terms in the product's epilogue, the bits of product + Add", async (alpha) => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    const ad = LoraAdapter.init(cfg, { r: 4, alpha, dropout: 0, targetModules: ["q_proj", "v_proj", "o_proj"] }, 3);
    ad.variables().forEach((v, i) => v.name.includes("lora_B") && v.assign(randn(v.shape, 10 + i)));
    const x = randn([3, cfg.hiddenSize], 1) as tf.Tensor2D;
    const release = ad.holdFactors([FUSED.qkv_proj, FUSED.o_proj], (m) => moduleDims(cfg, m)[1]); // built now
    const n0 = tf.memory().numTensors;
    for (const f of ["qkv_proj", "o_proj"] as const) {
      const ms = FUSED[f],
        outs = ms.map((m) => moduleDims(cfg, m)[1]);
      const y = randn([3, outs.reduce((a, b) => a + b, 0)], 2) as tf.Tensor2D;
      const ref = tf.tidy(() => tf.add(y, ad.fusedDelta(0, ms, outs, x, false)!));
      const prof = await tf.profile(() => tf.tidy(() => ad.addFusedDelta(0, ms, outs, x, false, y)));
      const got = prof.result as tf.Tensor;
      const names = prof.kernels.map((k) => k.name);
      expect(names, f).toContain("_FusedMatMul");
      expect(names, f).not.toContain("Add");
      expect(Array.from(await got.data()), f).toEqual(Array.from(await ref.data()));
      tf.dispose([y, ref, got]);
    }
    expect(tf.memory().numTensors).toBe(n0);
    release();
    tf.dispose(x);
    ad.dispose();
  });
});
