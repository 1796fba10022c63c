/** Wrappers that pass every call on to a model or KV cache, for code that changes one part: the
 *  steering biases of the rollout bench and tests override prefill/decodeStep and keep per-row state
 *  beside the cache. Anything the wrapped model offers (unpackBase included) stays available. */
import type * as tf from "@tensorflow/tfjs";
import type { CausalLM, ForwardOptions, KVCache, UnpackOptions } from "../../src/model/types.ts";

export class DelegatingLM implements CausalLM {
  constructor(protected readonly inner: CausalLM) {}
  get config() {
    return this.inner.config;
  }
  get quantize() {
    return this.inner.quantize;
  }
  get lora() {
    return this.inner.lora;
  }
  get sharePrefixes() {
    return this.inner.sharePrefixes;
  }
  trainRowsFor(length: number): number {
    return this.inner.trainRowsFor?.(length) ?? Number.MAX_SAFE_INTEGER;
  }
  forward(...a: Parameters<CausalLM["forward"]>): tf.Tensor3D {
    return this.inner.forward(...a);
  }
  tokenLogprobs(...a: Parameters<CausalLM["tokenLogprobs"]>) {
    return this.inner.tokenLogprobs(...a);
  }
  prefill(ids: number[][], mask: number[][], o?: ForwardOptions): { logits: tf.Tensor2D; cache: KVCache } {
    return this.inner.prefill(ids, mask, o);
  }
  decodeStep(tokens: number[], cache: KVCache, o?: ForwardOptions): tf.Tensor2D {
    return this.inner.decodeStep(tokens, cache, o);
  }
  unpackBase(opts?: UnpackOptions): () => void {
    return this.inner.unpackBase?.(opts) ?? (() => {});
  }
  trainableVariables() {
    return this.inner.trainableVariables();
  }
  saveAdapter(dir: string) {
    return this.inner.saveAdapter(dir);
  }
  savePretrained(dir: string) {
    return this.inner.savePretrained(dir);
  }
  dispose() {
    this.inner.dispose();
  }
}

/** A KV cache with one piece of state per row that follows select(). */
export class RowStateCache<T> implements KVCache {
  constructor(
    readonly inner: KVCache,
    public rows: T[],
    private readonly onSelect: () => void = () => {},
  ) {}
  get batchSize() {
    return this.inner.batchSize;
  }
  get length() {
    return this.inner.length;
  }
  select(keep: number[]): void {
    this.inner.select(keep);
    this.rows = keep.map((k) => this.rows[k]);
    this.onSelect();
  }
  dispose(): void {
    this.inner.dispose();
  }
}
