/** Golden parity with test/fixtures/qwen2-tiny (an independent float32 PyTorch Qwen2 + PEFT LoRA), as
 *  one suite every backend runs with the same thresholds (parity.test.ts: wasm; test/kernels/webgpu/). */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { readFileSync } from "node:fs";
import { initBackend } from "../../../src/kernels/backend.ts";
import { loadModel } from "../../../src/model/load.ts";
import { peftKey } from "../../../src/model/peft.ts";
import type { Qwen2ForCausalLM } from "../../../src/model/qwen2.ts";
import { LORA_TARGETS } from "../../../src/model/types.ts";

const FIX = "test/fixtures/qwen2-tiny";
const exp = JSON.parse(readFileSync(`${FIX}/expected.json`, "utf8"));
const { input_ids: ids, attention_mask: mask, valid_positions: valid, next_token_positions: nextPos } = exp.batch;

function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

async function checkLogits(model: Qwen2ForCausalLM, want: number[][][], adapters: boolean) {
  const logits = model.forward(ids, mask, { adapters });
  const got = (await logits.array()) as number[][][];
  logits.dispose();
  let worst = 0;
  valid.forEach((ps: number[], b: number) => ps.forEach((t, k) => (worst = Math.max(worst, maxAbsDiff(got[b][t], want[b][k])))));
  return worst;
}

/** Mean −log p over pairs with both positions real, as HF labels with −100 on pads. */
function lossFrom(lp: tf.Tensor2D): tf.Scalar {
  const w = mask.map((r: number[]) => r.map((m: number, t: number) => (t > 0 && m && r[t - 1] ? 1 : 0)));
  const wt = tf.tensor2d(w);
  const n = w.flat().reduce((a: number, b: number) => a + b, 0);
  return tf.div(tf.neg(tf.sum(tf.mul(lp, wt))), n) as tf.Scalar;
}

export function goldenSuite(backend: "wasm" | "webgpu") {
  describe(`qwen2-tiny golden parity (${backend})`, () => {
    let base: Qwen2ForCausalLM;
    let lora: Qwen2ForCausalLM;
    beforeAll(async () => {
      expect(await initBackend(backend)).toBe(backend);
      base = await loadModel(FIX);
      lora = await loadModel(FIX, { adapter: `${FIX}/lora` });
    });
    afterAll(() => {
      base?.dispose();
      lora?.dispose();
    });

    it("base logits match to 1e-4", async () => {
      const d = await checkLogits(base, exp.base.logits, true);
      console.log(`base logits max |Δ| ${d.toExponential(2)}`);
      expect(d).toBeLessThanOrEqual(1e-4);
    });

    it("LoRA logits match to 1e-4, and adapters:false gives the base logits", async () => {
      const d = await checkLogits(lora, exp.lora.logits, true);
      console.log(`lora logits max |Δ| ${d.toExponential(2)}`);
      expect(d).toBeLessThanOrEqual(1e-4);
      expect(await checkLogits(lora, exp.base.logits, false)).toBeLessThanOrEqual(1e-4);
    });

    it("token log-probs, loss and every LoRA gradient match", async () => {
      for (const [model, ref] of [
        [base, exp.base],
        [lora, exp.lora],
      ] as const) {
        const { logprobs } = model.tokenLogprobs(ids, mask);
        const got = (await logprobs.array()) as number[][];
        logprobs.dispose();
        let worst = 0;
        nextPos.forEach((ps: number[], b: number) =>
          ps.forEach((t, k) => (worst = Math.max(worst, Math.abs(got[b][t + 1] - ref.next_token_logprobs[b][k])))),
        );
        expect(worst).toBeLessThanOrEqual(1e-4);
      }
      const before = tf.memory().numTensors;
      expect(lora.trainableVariables().length).toBe(2 * LORA_TARGETS.length * 2);
      const { loss, worstRel } = await lossAndGradients(lora);
      console.log(`lora loss ${loss} (ref ${exp.lora.loss}); worst gradient error ${worstRel.toExponential(2)} of max-abs`);
      expect(Math.abs(loss - exp.lora.loss) / exp.lora.loss).toBeLessThanOrEqual(1e-5);
      expect(worstRel).toBeLessThanOrEqual(1e-3);
      expect(tf.memory().numTensors).toBe(before);
    });

    it("greedy 8-token decode matches, by full forward and by KV cache", async () => {
      for (const [model, ref] of [
        [base, exp.greedy.base],
        [lora, exp.greedy.lora],
      ] as const) {
        const seq = [...exp.greedy.prompt];
        for (let s = 0; s < 8; s++) {
          const l = model.forward([seq], undefined);
          const last = tf.tidy(() => tf.squeeze(tf.slice(l, [0, seq.length - 1, 0], [1, 1, -1])));
          expect(maxAbsDiff(await last.data(), ref.step_logits[s])).toBeLessThanOrEqual(1e-4);
          seq.push((await tf.argMax(last).data())[0]);
          tf.dispose([l, last]);
        }
        expect(seq.slice(5)).toEqual(ref.new_tokens);
        expect(await greedyByCache(model, exp.greedy.prompt, 8)).toEqual(ref.new_tokens);
      }
    });

    it("large-model layout (frozen weights as the left operand) gives the same logits, loss, gradients and decode", async () => {
      const left = await loadModel(FIX, { adapter: `${FIX}/lora`, frozenLeft: true });
      expect(left.weights.layers[0].proj.qkv_proj.left).not.toBeNull();
      expect(await checkLogits(left, exp.lora.logits, true)).toBeLessThanOrEqual(1e-4);
      const { loss, worstRel } = await lossAndGradients(left);
      expect(Math.abs(loss - exp.lora.loss) / exp.lora.loss).toBeLessThanOrEqual(1e-5);
      expect(worstRel).toBeLessThanOrEqual(1e-3);
      expect(await greedyByCache(left, exp.greedy.prompt, 8)).toEqual(exp.greedy.lora.new_tokens);
      left.dispose();
    });
  });
}

/** n greedy tokens after the prompt, by prefill and KV-cache decode steps. */
async function greedyByCache(model: Qwen2ForCausalLM, prompt: number[], n: number): Promise<number[]> {
  const { logits, cache } = model.prefill([prompt], [prompt.map(() => 1)]);
  let lg = logits;
  const out: number[] = [];
  for (let s = 0; s < n; s++) {
    const best = tf.argMax(lg, 1);
    out.push((await best.data())[0]);
    tf.dispose([lg, best]);
    if (s < n - 1) lg = model.decodeStep([out[s]], cache);
  }
  cache.dispose();
  return out;
}

/** The LoRA model's loss on the fixture batch and its worst gradient error against the golden
 *  gradients (every layer, module, A and B), relative to each gradient's max-abs. */
async function lossAndGradients(model: Qwen2ForCausalLM): Promise<{ loss: number; worstRel: number }> {
  const vars = model.trainableVariables();
  const { value, grads } = tf.variableGrads(() => lossFrom(model.tokenLogprobs(ids, mask).logprobs), vars);
  const loss = (await value.data())[0];
  let worstRel = 0;
  for (let l = 0; l < 2; l++)
    for (const m of LORA_TARGETS)
      for (const which of ["A", "B"] as const) {
        const key = peftKey(l, m, which);
        const v = vars.find((x) => x.name.startsWith(key.replace(".weight", "")))!;
        const g = tf.transpose(grads[v.name]); // held transposed; PEFT layout for comparison
        const want = (exp.lora.grads[key] as number[][]).flat();
        worstRel = Math.max(worstRel, maxAbsDiff(await g.data(), want) / Math.max(...want.map(Math.abs)));
        g.dispose();
      }
  tf.dispose([value, grads]);
  return { loss, worstRel };
}
