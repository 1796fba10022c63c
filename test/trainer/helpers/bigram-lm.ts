/** A differentiable stand-in CausalLM for trainer tests: p(next | prev) = softmax(base + delta)[prev],
 *  with a frozen [V, V] base table and a trainable [V, V] delta playing the adapter (adapters: false
 *  drops it, like LoRA switched off). Only tokenLogprobs and trainableVariables are real. */
import * as tf from "@tensorflow/tfjs";
import type { CausalLM, KVCache, LoraConfig, Quantize, Qwen2Config } from "../../../src/model/types.ts";

let uid = 0;

export class BigramLM implements CausalLM {
  readonly config: Qwen2Config;
  readonly quantize: Quantize = "none";
  readonly lora: LoraConfig | null = null;
  readonly base: tf.Variable; // [V, V] frozen
  readonly delta: tf.Variable; // [V, V] trainable

  constructor(
    readonly vocab: number,
    baseValues?: number[][],
    deltaValues?: number[][],
  ) {
    this.config = {
      modelType: "qwen2",
      vocabSize: vocab,
      hiddenSize: vocab,
      intermediateSize: vocab,
      numHiddenLayers: 0,
      numAttentionHeads: 1,
      numKeyValueHeads: 1,
      headDim: vocab,
      ropeTheta: 1e4,
      rmsNormEps: 1e-6,
      tieWordEmbeddings: false,
      maxPositionEmbeddings: 1 << 20,
    };
    const id = uid++;
    this.base = tf.variable(baseValues ? tf.tensor2d(baseValues) : tf.zeros([vocab, vocab]), false, `bigram_${id}.base`);
    this.delta = tf.variable(deltaValues ? tf.tensor2d(deltaValues) : tf.zeros([vocab, vocab]), true, `bigram_${id}.delta`);
  }

  tokenLogprobs(inputIds: number[][], attentionMask: number[][], opts: { adapters?: boolean; withEntropy?: boolean } = {}) {
    const B = inputIds.length,
      L = inputIds[0].length,
      V = this.vocab;
    const logprobs = tf.tidy(() => {
      const table = opts.adapters === false ? this.base : tf.add(this.base, this.delta);
      const logsm = tf.logSoftmax(table); // [V, V]
      if (L < 2) return tf.zeros([B, L]) as tf.Tensor2D;
      const prev = tf.tensor1d(
        inputIds.flatMap((r) => r.slice(0, -1)),
        "int32",
      ); // [B·(L−1)]
      const next = tf.oneHot(
        tf.tensor1d(
          inputIds.flatMap((r) => r.slice(1)),
          "int32",
        ),
        V,
      ); // [B·(L−1), V]
      const lp = tf.reshape(tf.sum(tf.mul(tf.gather(logsm, prev), next), 1), [B, L - 1]); // [B, L−1]
      return tf.concat([tf.zeros([B, 1]), lp], 1) as tf.Tensor2D; // out[b][0] = 0
    });
    if (!opts.withEntropy) return { logprobs };
    const entropy = tf.tidy(() => {
      const table = opts.adapters === false ? this.base : tf.add(this.base, this.delta);
      const logsm = tf.logSoftmax(table);
      const h = tf.neg(tf.sum(tf.mul(tf.exp(logsm), logsm), 1)); // [V] entropy of each row
      if (L < 2) return tf.zeros([B, L]) as tf.Tensor2D;
      const prev = tf.tensor1d(
        inputIds.flatMap((r) => r.slice(0, -1)),
        "int32",
      );
      return tf.concat([tf.zeros([B, 1]), tf.reshape(tf.gather(h, prev), [B, L - 1])], 1) as tf.Tensor2D;
    });
    void attentionMask; // a bigram never looks past one token, so padding cannot leak into real rows
    return { logprobs, entropy };
  }

  /** Sum of log-probs of the tokens under `mask`, per row, in float64 from the current tables. */
  seqLogprob(ids: number[], mask: number[]): number {
    const lp = this.tokenLogprobs([ids], [ids.map(() => 1)]).logprobs;
    const v = lp.dataSync();
    lp.dispose();
    return mask.reduce((s, m, t) => s + (t > 0 && m ? v[t] : 0), 0);
  }

  trainableVariables(): tf.Variable[] {
    return [this.delta];
  }

  forward(): tf.Tensor3D {
    throw new Error("BigramLM implements only tokenLogprobs");
  }
  prefill(): { logits: tf.Tensor2D; cache: KVCache } {
    throw new Error("BigramLM implements only tokenLogprobs");
  }
  decodeStep(): tf.Tensor2D {
    throw new Error("BigramLM implements only tokenLogprobs");
  }
  async saveAdapter(): Promise<void> {
    throw new Error("BigramLM implements only tokenLogprobs");
  }
  async savePretrained(): Promise<void> {
    throw new Error("BigramLM implements only tokenLogprobs");
  }
  dispose(): void {
    tf.dispose([this.base, this.delta]);
  }
}
