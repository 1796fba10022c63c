import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { LoraAdapter, moduleDims } from "../../src/model/lora.ts";
import { FUSED, type LoraTarget } from "../../src/model/types.ts";
import { cfg, randn } from "./helpers/lora-setup.ts";

const maxDiff = (a: tf.Tensor, b: tf.Tensor) => tf.tidy(() => tf.max(tf.abs(tf.sub(a, b))).dataSync()[0]);

/** An adapter on `targets` with B made non-zero (init leaves it zero), plus named access to A/B. */
function adapter(targets: LoraTarget[], dropout = 0, alpha = 8): { ad: LoraAdapter; v: (m: LoraTarget, w: "A" | "B") => tf.Variable } {
  const ad = LoraAdapter.init(cfg, { r: 4, alpha, dropout, targetModules: targets }, 3);
  const v = (m: LoraTarget, w: "A" | "B") => ad.variables().find((x) => x.name.includes(`.${m}.lora_${w}#`))!;
  targets.forEach((m, i) => v(m, "B").assign(randn(v(m, "B").shape, 10 + i)));
  return { ad, v };
}

describe("LoRA on fused modules", () => {
  it("one product pair per fused module gives the members' terms side by side, zeros where a member has none, with the same gradients", async () => {
    await initBackend("wasm");
    const { ad } = adapter(["q_proj", "v_proj", "gate_proj", "up_proj"]);
    const x = randn([6, cfg.hiddenSize], 1) as tf.Tensor2D;
    for (const f of ["qkv_proj", "gate_up_proj"] as const) {
      const members = FUSED[f],
        dims = members.map((m) => moduleDims(cfg, m)[1]);
      const perMember = () =>
        tf.concat(
          members.map((m, i) => ad.delta(0, m, x, true) ?? tf.zeros([6, dims[i]])),
          1,
        );
      const fused = () => ad.fusedDelta(0, members, dims, x, true)!;
      const weights = randn([6, dims.reduce((a, b) => a + b)], 2);
      const loss = (g: () => tf.Tensor) => () => tf.sum(tf.mul(g(), weights)) as tf.Scalar;
      const ref = tf.variableGrads(loss(perMember), ad.variables());
      const got = tf.variableGrads(loss(fused), ad.variables());
      const [a, b] = [tf.tidy(perMember), tf.tidy(fused)];
      expect(maxDiff(a, b), f).toBeLessThan(1e-5);
      expect(
        tf.tidy(() => tf.max(tf.abs(a)).dataSync()[0]),
        f,
      ).toBeGreaterThan(0.1);
      for (const [name, g] of Object.entries(ref.grads)) expect(maxDiff(g, got.grads[name]), `${f} ${name}`).toBeLessThan(1e-5);
      tf.dispose([a, b, weights, ref.value, got.value, ref.grads, got.grads]);
    }
    expect(ad.fusedDelta(0, FUSED.qkv_proj, [32, 16, 16], x, false)!.shape).toEqual([6, 64]);
    expect(
      LoraAdapter.init(cfg, { r: 4, alpha: 8, dropout: 0, targetModules: ["o_proj"] }).fusedDelta(
        0,
        FUSED.qkv_proj,
        [32, 16, 16],
        x,
        false,
      ),
    ).toBeNull();
    tf.dispose(x);
    ad.dispose();
  });

  it("keeps one dropout mask per member while training", async () => {
    await initBackend("wasm");
    // q_proj and k_proj with the same A and B (k's outputs are q's first 16): equal without dropout,
    // different masks (so different terms) with dropout in training.
    const { ad, v } = adapter(["q_proj", "k_proj"], 0.5);
    v("k_proj", "A").assign(v("q_proj", "A"));
    v("k_proj", "B").assign(tf.slice(v("q_proj", "B"), [0, 0], [4, 16]));
    const x = randn([6, cfg.hiddenSize], 1) as tf.Tensor2D;
    const split = (d: tf.Tensor) => tf.tidy(() => maxDiff(tf.slice(d, [0, 0], [6, 16]), tf.slice(d, [0, 32], [6, 16])));
    const evalD = ad.fusedDelta(0, FUSED.qkv_proj, [32, 16, 16], x, false)!;
    const trainD = ad.fusedDelta(0, FUSED.qkv_proj, [32, 16, 16], x, true)!;
    expect(split(evalD)).toBeLessThan(1e-6);
    expect(split(trainD)).toBeGreaterThan(1e-3);
    tf.dispose([x, evalD, trainD]);
    ad.dispose();
  });

  // scaling 2 goes into the held B (a power of two: exact), 1.5 stays a product
  it.each([8, 6])(
    "holds the fused factors for generation (alpha %d, r 4): the same bits, rebuilt after an assign, released without a leak",
    async (alpha) => {
      await initBackend("wasm");
      const { ad, v } = adapter(["q_proj", "v_proj", "o_proj"], 0, alpha);
      const x = randn([3, cfg.hiddenSize], 1) as tf.Tensor2D;
      const terms = () =>
        (["qkv_proj", "o_proj"] as const).map((f) => {
          const ms = FUSED[f];
          return tf.tidy(() =>
            ad.fusedDelta(
              0,
              ms,
              ms.map((m) => moduleDims(cfg, m)[1]),
              x,
              false,
            )!,
          );
        });
      const perMember = () => [
        tf.tidy(() => tf.concat([ad.delta(0, "q_proj", x, false)!, tf.zeros([3, 16]), ad.delta(0, "v_proj", x, false)!], 1)),
        tf.tidy(() => ad.delta(0, "o_proj", x, false)!),
      ];
      const before = tf.memory().numTensors;
      const unheld: Float32Array[][] = [];
      for (let round = 0; round < 2; round++) {
        const t = terms();
        unheld.push(t.map((x) => x.dataSync() as Float32Array));
        tf.dispose(t);
        tf.tidy(() => v("v_proj", "B").assign(tf.mul(v("v_proj", "B"), 2)));
        tf.tidy(() => v("o_proj", "A").assign(tf.mul(v("o_proj", "A"), -1)));
      }
      for (let round = 0; round < 2; round++) {
        tf.tidy(() => v("v_proj", "B").assign(tf.div(v("v_proj", "B"), 2))); // back to the first round's values
        tf.tidy(() => v("o_proj", "A").assign(tf.mul(v("o_proj", "A"), -1)));
      }
      const release = ad.holdFactors();
      for (let round = 0; round < 2; round++) {
        const [got, ref] = [terms(), perMember()];
        got.forEach((g, i) => expect(maxDiff(g, ref[i]), `round ${round} term ${i}`).toBeLessThan(1e-5));
        got.forEach((g, i) => expect(g.dataSync(), `round ${round} term ${i}: held and unheld bits`).toEqual(unheld[round][i]));
        tf.dispose([...got, ...ref]);
        tf.tidy(() => v("v_proj", "B").assign(tf.mul(v("v_proj", "B"), 2))); // the held factors must follow
        tf.tidy(() => v("o_proj", "A").assign(tf.mul(v("o_proj", "A"), -1)));
      }
      release();
      expect(tf.memory().numTensors).toBe(before);
      expect(v("o_proj", "A").isDisposed).toBe(false);
      tf.dispose(x);
      ad.dispose();
    },
  );
});
