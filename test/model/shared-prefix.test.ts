/** A log-prob forward whose rows share a prefix (a GRPO group's prompt) runs the prefix once
 *  (Qwen2ForCausalLM.sharePrefixes): its log-probs, entropies and LoRA gradients equal the forward
 *  that runs every row whole, with layers recorded or checkpointed, f32 or NF4 base, spans that start
 *  inside the prefix, right padding and a repeated row. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { loadModel } from "../../src/model/load.ts";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { LORA_TARGETS, type Quantize } from "../../src/model/types.ts";

const FIX = "test/fixtures/qwen2-tiny";
const prompt = [5, 6, 7, 8, 9];
const rows = [
  [...prompt, 100, 101, 102, 103, 104, 105],
  [...prompt, 120, 121, 9, 9, 122, 0], // right-padded by one
  [...prompt, 100, 101, 102, 103, 104, 105], // the first row again
  [...prompt, 33, 0, 0, 0, 0, 0], // one token of its own
];
const attention = rows.map((_, b) => rows[b].map((_, t) => ((b === 1 && t === 10) || (b === 3 && t > 5) ? 0 : 1)));
const need = [
  [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1],
  [0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 0], // from inside the prompt (a span starting at position 3)
  [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
  [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0],
];

async function run(m: Qwen2ForCausalLM, share: boolean) {
  m.sharePrefixes = share;
  const vars = m.trainableVariables();
  const weights = tf.tensor2d(
    need.map((r) => r.map((x, t) => x * (1 + ((t * 7) % 3)))),
    [rows.length, rows[0].length],
  );
  const n0 = tf.memory().numTensors;
  const { value, grads } = tf.variableGrads(
    () => tf.sum(tf.mul(m.tokenLogprobs(rows, attention, { training: true, logprobMask: need }).logprobs, weights)) as tf.Scalar,
    vars,
  );
  const lp = m.tokenLogprobs(rows, attention, { withEntropy: true, logprobMask: need });
  const out = {
    loss: (await value.data())[0],
    grads: await Promise.all(vars.map(async (v) => Float32Array.from((await grads[v.name].data()) as Float32Array))),
    logprobs: (await lp.logprobs.data()) as Float32Array,
    entropy: (await lp.entropy!.data()) as Float32Array,
  };
  tf.dispose([value, grads, lp.logprobs, lp.entropy!]);
  expect(tf.memory().numTensors).toBe(n0); // nothing left behind either way
  weights.dispose();
  return out;
}

const close = (a: Float32Array, b: Float32Array, rel: number, what: string) => {
  const scale = Math.max(...Array.from(b, Math.abs));
  expect(scale, what).toBeGreaterThan(0);
  a.forEach((x, i) => expect(Math.abs(x - b[i]), what).toBeLessThanOrEqual(rel * scale));
};

describe("shared prefixes in log-prob forwards (wasm)", () => {
  beforeAll(async () => {
    await initBackend("wasm");
  });

  for (const quantize of ["none", "nf4"] as Quantize[])
    for (const ckpt of [false, true])
      it(`${quantize} base, layers ${ckpt ? "checkpointed" : "recorded"}: the same log-probs, entropies and LoRA gradients as whole rows`, async () => {
        const m = await loadModel(FIX, { lora: { r: 4, alpha: 8, dropout: 0, targetModules: [...LORA_TARGETS] }, quantize, seed: 5 });
        // B starts at 0, which would leave every A without a gradient: one step of noise first
        for (const v of m.trainableVariables()) v.assign(tf.mul(tf.randomNormal(v.shape, 0, 1, "float32", 9), 0.05));
        m.activationCheckpointing = ckpt;
        expect(m.sharedPrefix(rows, attention, { training: true })).toBe(prompt.length);
        const whole = await run(m, false),
          shared = await run(m, true);
        expect(Math.abs(shared.loss - whole.loss)).toBeLessThanOrEqual(1e-5 * Math.abs(whole.loss));
        close(shared.logprobs, whole.logprobs, 1e-5, "log-probs");
        close(shared.entropy, whole.entropy, 1e-5, "entropies");
        shared.grads.forEach((g, i) => close(g, whole.grads[i], 1e-4, m.trainableVariables()[i].name));
        m.dispose();
      });

  it("finds the prefix: stops at the first differing id or padded position, keeps a token per row, needs two rows", async () => {
    const m = await loadModel(FIX, { seed: 1 });
    const found = (ids: number[][], mask = ids.map((r) => r.map(() => 1))) => m.sharedPrefix(ids, mask, {});
    const [a, b] = [
      [1, 2, 3],
      [1, 2, 4],
    ];
    expect(found([a, b])).toBe(2);
    expect(found([a, a])).toBe(2); // one token of each row stays its own
    expect(
      found(
        [a, b],
        [
          [0, 1, 1],
          [1, 1, 1],
        ],
      ),
    ).toBe(0); // left padding
    expect(found([a])).toBe(0);
    m.sharePrefixes = false;
    expect(found([a, b])).toBe(0);
    m.dispose();
  });
});
