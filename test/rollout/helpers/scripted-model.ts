/** A CausalLM stand-in for rollout tests: every row follows a script of assistant turns. Each step it
 *  puts all probability on the next token of the row's script for the current turn (then the stop
 *  token), where the turn is the number of `<|im_start|>assistant\n` headers the row has read so far.
 *  So forced tokens (tool responses and the next header) move it to the next turn exactly as they
 *  would a real model's context. Or, with `fixed`, every step returns the same distribution. */
import * as tf from "@tensorflow/tfjs";
import type { CausalLM, ForwardOptions, KVCache, Qwen2Config } from "../../../src/model/types.ts";

class ScriptedCache implements KVCache {
  constructor(
    public rows: number[],
    public contexts: number[][],
    public length: number,
  ) {}
  get batchSize() {
    return this.rows.length;
  }
  selects: number[][] = [];
  disposed = false;
  select(keep: number[]): void {
    for (const k of keep) if (!(k >= 0 && k < this.rows.length)) throw new Error(`select: row ${k} out of range ${this.rows.length}`);
    this.rows = keep.map((k) => this.rows[k]);
    this.contexts = keep.map((k) => this.contexts[k]);
    this.selects.push(keep);
  }
  dispose(): void {
    this.disposed = true;
  }
}

export interface ScriptedOptions {
  vocabSize: number;
  eosTokenId: number;
  /** ids of "<|im_start|>assistant\n" */
  header: number[];
  /** scripts[row][turn] = the ids the row writes in that turn (the stop token is added). */
  scripts?: number[][][];
  /** Instead of scripts: the same log-probabilities every step, as { token: prob }. */
  fixed?: Map<number, number>;
}

export class ScriptedModel implements CausalLM {
  readonly config: Qwen2Config;
  readonly quantize = "none" as const;
  readonly lora = null;
  readonly decodeBatchSizes: number[] = [];
  lastCache: ScriptedCache | null = null;

  constructor(private readonly o: ScriptedOptions) {
    this.config = {
      modelType: "qwen2",
      vocabSize: o.vocabSize,
      hiddenSize: 8,
      intermediateSize: 8,
      numHiddenLayers: 1,
      numAttentionHeads: 1,
      numKeyValueHeads: 1,
      headDim: 8,
      ropeTheta: 1e4,
      rmsNormEps: 1e-6,
      tieWordEmbeddings: true,
      maxPositionEmbeddings: 4096,
    };
  }

  prefill(inputIds: number[][], attentionMask: number[][]): { logits: tf.Tensor2D; cache: KVCache } {
    const contexts = inputIds.map((ids, b) => ids.filter((_, t) => attentionMask[b][t] === 1));
    const cache = new ScriptedCache(
      inputIds.map((_, b) => b),
      contexts,
      inputIds[0].length,
    );
    this.lastCache = cache;
    return { logits: this.logits(cache), cache };
  }

  decodeStep(tokens: number[], cache: KVCache, o: ForwardOptions = {}): tf.Tensor2D {
    const c = cache as ScriptedCache;
    if (tokens.length !== c.rows.length) throw new Error(`decodeStep: ${tokens.length} tokens for ${c.rows.length} rows`);
    this.decodeBatchSizes.push(tokens.length);
    tokens.forEach((t, i) => o.hold?.[i] || c.contexts[i].push(t)); // a held row reads nothing (ForwardOptions.hold)
    c.length++;
    return this.logits(c);
  }

  private logits(c: ScriptedCache): tf.Tensor2D {
    const V = this.o.vocabSize;
    const out = new Float32Array(c.rows.length * V).fill(-1e9);
    c.rows.forEach((row, i) => {
      if (this.o.fixed) {
        for (const [tok, p] of this.o.fixed) out[i * V + tok] = Math.log(p);
        return;
      }
      const { turn, pos } = this.where(c.contexts[i]);
      const script = this.o.scripts![row];
      const turnIds = [...script[Math.min(turn, script.length - 1)], this.o.eosTokenId];
      out[i * V + (turnIds[pos] ?? this.o.eosTokenId)] = 0;
    });
    return tf.tensor2d(out, [c.rows.length, V]);
  }

  /** Turn = headers read - 1; pos = tokens since the last header. */
  private where(ctx: number[]): { turn: number; pos: number } {
    const h = this.o.header;
    let turn = -1,
      last = 0;
    for (let t = h.length; t <= ctx.length; t++) {
      let match = true;
      for (let j = 0; j < h.length && match; j++) match = ctx[t - h.length + j] === h[j];
      if (match) {
        turn++;
        last = t;
      }
    }
    return { turn: Math.max(turn, 0), pos: ctx.length - last };
  }

  forward(): tf.Tensor3D {
    throw new Error("forward is not part of the scripted stand-in");
  }
  tokenLogprobs(): { logprobs: tf.Tensor2D } {
    throw new Error("tokenLogprobs is not part of the scripted stand-in");
  }
  trainableVariables(): tf.Variable[] {
    return [];
  }
  async saveAdapter(): Promise<void> {
    throw new Error("saveAdapter is not part of the scripted stand-in");
  }
  async savePretrained(): Promise<void> {
    throw new Error("savePretrained is not part of the scripted stand-in");
  }
  dispose(): void {}
}
