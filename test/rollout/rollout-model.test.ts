/** Rollouts on the real Qwen2 forward (random weights, tiny shape) with a real byte-level BPE tokenizer
 *  that carries Qwen's special tokens and chat template. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { DelegatingLM, RowStateCache } from "../../scripts/lib/delegate.ts";
import { createModel } from "../../src/model/load.ts";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { buildTinyTokenizer, saveTinyTokenizer } from "../../scripts/lib/tiny-tokenizer.ts";
import { loadTokenizerFromDir } from "../../src/model/tokenizer.ts";
import type { CausalLM, ChatMessage, KVCache, Tokenizer, UnpackOptions } from "../../src/model/types.ts";
import type { Tool } from "../../src/agents/types.ts";
import { rolloutGroups, type RolloutConfig } from "../../src/rollout/rollout.ts";
import { Rng } from "../../src/util/rng.ts";

let tok: Tokenizer;
let model: Qwen2ForCausalLM;
beforeAll(async () => {
  await initBackend("wasm");
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "rollout-tiny-tok-"));
  const corpus = ["Janet has 16 eggs and sells 3 of them.", "How many apples are left? The answer is 9.", "user assistant system"];
  await saveTinyTokenizer(dir, buildTinyTokenizer(corpus, { vocabSize: 300 }));
  tok = await loadTokenizerFromDir(dir);
  model = await createModel(
    {
      modelType: "qwen2",
      vocabSize: tok.vocabSize,
      hiddenSize: 64,
      intermediateSize: 176,
      numHiddenLayers: 2,
      numAttentionHeads: 4,
      numKeyValueHeads: 2,
      headDim: 16,
      ropeTheta: 1e6,
      rmsNormEps: 1e-6,
      tieWordEmbeddings: true,
      maxPositionEmbeddings: 512,
    },
    { seed: 7 },
  );
});
afterAll(() => model?.dispose());

const prompts: ChatMessage[][] = [
  [{ role: "user", content: "Janet has 16 eggs." }],
  [
    { role: "system", content: "Be brief." },
    { role: "user", content: "How many apples are left after she sells 3 of them?" },
  ],
  [{ role: "user", content: "9?" }],
];
const cfg = (over: Partial<RolloutConfig>): RolloutConfig => ({
  samplesPerPrompt: 1,
  maxNewTokens: 12,
  maxTurns: 2,
  temperature: 0,
  topP: 1,
  topK: 0,
  rng: new Rng(1),
  tools: [],
  toolsInPrompt: false,
  ...over,
});

describe("rolloutGroups on Qwen2", () => {
  it("greedy rollouts do not depend on batch company or padding, match a full forward, and leak no tensors", async () => {
    const before = tf.memory().numTensors;
    const batch = await rolloutGroups(model, tok, prompts, cfg({ samplesPerPrompt: 2 }));
    expect(tf.memory().numTensors).toBe(before);
    const lens = new Set(batch.map((t) => t.promptIds.length));
    expect(lens.size).toBe(3); // different lengths, so rows were left-padded differently
    for (let p = 0; p < prompts.length; p++) {
      const alone = await rolloutGroups(model, tok, [prompts[p]], cfg({}));
      expect(batch[2 * p].completionIds).toEqual(alone[0].completionIds);
      expect(batch[2 * p + 1].completionIds).toEqual(alone[0].completionIds);
      expect(alone[0].completionIds.length).toBeGreaterThan(0);
    }
    // Each sampled token is the argmax of a full, cache-free forward over everything before it.
    const t = batch[2];
    const ids = [...t.promptIds, ...t.completionIds];
    const logits = model.forward([ids]); // [1, T, V]
    const argmax = tf.tidy(() => tf.argMax(logits, 2).arraySync() as number[][])[0];
    logits.dispose();
    t.completionIds.forEach((id, i) => {
      if (t.lossMask[i] === 1) expect(argmax[t.promptIds.length + i - 1]).toBe(id);
    });
    expect(tf.memory().numTensors).toBe(before);
  });

  it("stays batch-invariant through tool calls, forced tokens and rows leaving the cache", async () => {
    const steer = new Steered(model, tok);
    const before = tf.memory().numTensors;
    const batch = await rolloutGroups(steer, tok, prompts, cfg({ samplesPerPrompt: 2, maxNewTokens: 100, tools: [echo] }));
    expect(tf.memory().numTensors).toBe(before);
    expect(steer.selects).toBeGreaterThan(0); // rows finished at different steps and left the cache
    for (const t of batch) {
      expect(t.finishReason).toBe("stop");
      expect(t.numToolCalls).toBe(1);
      expect(t.turns[0].toolCalls[0].result).toBe(`echo ${t.promptIds.length}`);
      expect(t.lossMask).toContain(0);
      expect(t.turns[1].text.length).toBeGreaterThan(0); // the model's own greedy tokens after the tool
    }
    for (let p = 0; p < prompts.length; p++) {
      const alone = await rolloutGroups(steer, tok, [prompts[p]], cfg({ maxNewTokens: 100, tools: [echo] }));
      expect(batch[2 * p].completionIds).toEqual(alone[0].completionIds);
      expect(batch[2 * p + 1].completionIds).toEqual(alone[0].completionIds);
    }
  });

  it("sampling log-probs equal the model's token log-probs at temperature 1 (the GRPO old policy)", async () => {
    const out = await rolloutGroups(model, tok, prompts.slice(0, 2), cfg({ samplesPerPrompt: 2, temperature: 1, rng: new Rng(5) }));
    const rows = out.map((t) => [...t.promptIds, ...t.completionIds]);
    const T = Math.max(...rows.map((r) => r.length));
    const ids = rows.map((r) => [...new Array(T - r.length).fill(tok.padTokenId), ...r]);
    const mask = rows.map((r) => [...new Array(T - r.length).fill(0), ...r.map(() => 1)]);
    const { logprobs } = model.tokenLogprobs(ids, mask);
    const lp = logprobs.arraySync();
    logprobs.dispose();
    out.forEach((t, b) => {
      const start = T - t.completionIds.length;
      t.completionIds.forEach((_, i) => {
        if (t.lossMask[i] === 1) expect(Math.abs(t.sampleLogprobs[i] - lp[b][start + i])).toBeLessThan(1e-4);
      });
    });
  });
  it("merges the adapter into the unpacked base for generation (not with adapters off): the same greedy rollouts", async () => {
    const q = await createModel(model.config, {
      seed: 7,
      quantize: "nf4",
      lora: { r: 4, alpha: 8, dropout: 0, targetModules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] },
    });
    tf.tidy(() => q.trainableVariables().forEach((v) => v.assign(tf.mul(tf.randomNormal(v.shape, 0, 1, "float32", 5), 0.3))));
    const seen: (UnpackOptions | undefined)[] = [];
    class Spy extends DelegatingLM {
      unpackBase(o?: UnpackOptions) {
        seen.push(o);
        return super.unpackBase(o);
      }
    }
    class NoMerge extends DelegatingLM {
      unpackBase(o?: UnpackOptions) {
        return super.unpackBase({ ...o, mergeAdapter: false });
      }
    }
    const before = tf.memory().numTensors;
    const merged = await rolloutGroups(new Spy(q), tok, prompts, cfg({ samplesPerPrompt: 2 }));
    const plain = await rolloutGroups(new NoMerge(q), tok, prompts, cfg({ samplesPerPrompt: 2 }));
    expect(seen).toEqual([{ mergeAdapter: true }]);
    expect(merged.map((t) => t.completionIds)).toEqual(plain.map((t) => t.completionIds));
    merged.forEach((t, i) => t.sampleLogprobs.forEach((lp, j) => expect(lp).toBeCloseTo(plain[i].sampleLogprobs[j], 4)));
    await rolloutGroups(new Spy(q), tok, prompts, cfg({ adapters: false }));
    expect(seen[1]).toEqual({ mergeAdapter: false });
    expect(tf.memory().numTensors).toBe(before);
    q.dispose();
  });
});

/** Echoes its argument: lets the steered script's call show up in the forced tokens. */
const echo: Tool = {
  name: "echo",
  description: "echo",
  parameters: { type: "object" },
  async run(args) {
    return `echo ${String(args.n)}`;
  },
};

/** The real model with a steering bias: in the first turn every row writes an echo call (carrying its
 *  prompt length), then the real model continues greedily after the forced tool response until a
 *  stop token is pushed at a step that depends on the prompt length (so rows finish at different
 *  times, alone or in a batch). Everything else — cache, padding, select — is the real model's. */
class Steered extends DelegatingLM {
  selects = 0;
  private readonly header: number[];
  constructor(
    m: CausalLM,
    private readonly tok: Tokenizer,
  ) {
    super(m);
    this.header = tok.encode("<|im_start|>assistant\n");
  }
  dispose() {} // the test owns the model

  prefill(ids: number[][], mask: number[][]) {
    const { logits, cache } = this.inner.prefill(ids, mask);
    const ctx = ids.map((r, b) => r.filter((_, t) => mask[b][t] === 1));
    const wrapped = new RowStateCache(cache, ctx, () => this.selects++);
    return { logits: this.bias(logits, wrapped.rows), cache: wrapped };
  }
  decodeStep(tokens: number[], cache: KVCache) {
    const c = cache as RowStateCache<number[]>;
    tokens.forEach((t, i) => c.rows[i].push(t));
    return this.bias(this.inner.decodeStep(tokens, c.inner), c.rows);
  }
  private bias(logits: tf.Tensor2D, ctx: number[][]): tf.Tensor2D {
    const [B, V] = logits.shape;
    const add = new Float32Array(B * V);
    ctx.forEach((c, b) => {
      const promptLen = this.promptLength(c);
      let headers = 0,
        last = 0;
      for (let t = this.header.length; t <= c.length; t++)
        if (this.header.every((h, j) => c[t - this.header.length + j] === h)) {
          headers++;
          last = t;
        }
      const pos = c.length - last;
      let want = -1;
      if (headers === 1) {
        const script = [
          ...this.tok.encode(`<tool_call>\n{"name": "echo", "arguments": {"n": ${promptLen}}}\n</tool_call>`),
          this.tok.eosTokenId,
        ];
        want = script[pos] ?? -1;
      } else if (pos === 2 + (promptLen % 5)) want = this.tok.eosTokenId;
      else if (this.tok.eosTokenId !== undefined) add[b * V + this.tok.eosTokenId] = -1e4; // no early stop
      if (want >= 0) add[b * V + want] = 1e4;
    });
    return tf.tidy(() => {
      const out = tf.add(logits, tf.tensor2d(add, [B, V])) as tf.Tensor2D;
      logits.dispose();
      return out;
    });
  }
  private promptLength(c: number[]): number {
    // The prompt ends at the first assistant header.
    for (let t = this.header.length; t <= c.length; t++) if (this.header.every((h, j) => c[t - this.header.length + j] === h)) return t;
    return c.length;
  }
}
