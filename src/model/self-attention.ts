/** Qwen2's grouped-query attention on tensors: the query, key and value heads of the fused q/k/v
 *  projection with RoPE (kernels/heads.ts' kernels where the backend has them), and the attention of
 *  stacked queries over keys and values with the additive bias. Without repeating K/V: the g query
 *  heads sharing a kv head are stacked along the rows. And a decoder layer's attention
 *  (layerAttention): a shared prefix's two paths and the plain one. The host-side tables are in attention.ts. */
import * as tf from "@tensorflow/tfjs";
import { decodeHeads, decodeHeadsInto, headsOut, seqHeads, sharedSeqHeads } from "../kernels/heads.ts";
import { bmm } from "../kernels/matmul.ts";
import { rope } from "../kernels/rope-swiglu.ts";
import { softmax, softmaxBiased } from "../kernels/softmax.ts";
import type { Qwen2KVCache } from "./kv-cache.ts";
import type { Qwen2Config } from "./types.ts";

/** Query, key and value heads of qkv [B·T, (nH + 2·nKv)·hd] with RoPE: queries stacked per kv head
 *  (B·nKv, g·T, hd), keys (B, nKv, hd, T), values (B, nKv, T, hd); with `slot` (a decode step, a
 *  cache layer writable in place) keys and values may be written into the cache at slot.pos
 *  instead (inSlot; webgpu), kT and v then the cache's tensors. */
export function attentionHeads(
  c: Qwen2Config,
  qkv: tf.Tensor2D,
  cos: tf.Tensor4D,
  sin: tf.Tensor4D,
  B: number,
  T: number,
  decode: boolean,
  slot: { k: tf.Tensor4D; v: tf.Tensor4D; pos: number } | null = null,
): { qg: tf.Tensor3D; kT: tf.Tensor; v: tf.Tensor; inSlot?: boolean } {
  const nH = c.numAttentionHeads,
    nKv = c.numKeyValueHeads,
    hd = c.headDim,
    g = nH / nKv;
  // webgpu: k and v computed straight into the cache's slot (then kT, v are the cache's own tensors)
  const into = decode && slot ? decodeHeadsInto(qkv, cos, sin, nH, nKv, hd, 1 / Math.sqrt(hd), slot.k, slot.v, slot.pos) : null;
  if (into && slot) return { qg: into, kT: slot.k, v: slot.v, inSlot: true };
  // With one position (a decode step) moving the T axis keeps the element order: a reshape does it.
  const perm = (t: tf.Tensor, p: number[]): tf.Tensor =>
    T === 1
      ? tf.reshape(
          t,
          p.map((a) => t.shape[a]),
        )
      : tf.transpose(t, p);
  // GQA without repeating K/V: the g query heads sharing a kv head are stacked along the rows, qg.
  const heads = decode ? decodeHeads(qkv, cos, sin, nH, nKv, hd, 1 / Math.sqrt(hd)) : null;
  if (heads) return { qg: heads[0], kT: heads[1], v: heads[2] };
  const seq = seqHeads(qkv, cos, sin, B, T, nH, nKv, hd, 1 / Math.sqrt(hd)); // wasm, cpu, webgpu: one kernel each way
  // (B, nKv, hd, T), (B, nKv, T, hd); (B, nH, T, hd) -> (B·nKv, g·T, hd)
  if (seq) return { qg: tf.reshape<tf.Rank.R3>(seq[0], [B * nKv, g * T, hd]), kT: seq[1], v: seq[2] };
  const [qk, vFlat] = tf.split(qkv, [(nH + nKv) * hd, nKv * hd], 1); // [N, (nH+nKv)·hd], [N, nKv·hd]
  const [qr, k] = tf.split(rope(tf.reshape(qk, [B, T, nH + nKv, hd]), cos, sin), [nH, nKv], 2); // (B, T, nH | nKv, hd)
  const q = perm(tf.mul(qr, 1 / Math.sqrt(hd)), [0, 2, 1, 3]); // (B, nH, T, hd)
  return {
    qg: tf.reshape<tf.Rank.R3>(q, [B * nKv, g * T, hd]),
    kT: perm(k, [0, 2, 3, 1]), // (B, nKv, hd, T)
    v: perm(tf.reshape(vFlat, [B, T, nKv, hd]), [0, 2, 1, 3]), // (B, nKv, T, hd)
  };
}

/** Attention of stacked queries qg (B·nKv, g·T, hd) over keys kT (B, nKv, hd, S) and values
 *  (B, nKv, S, hd) with bias [B, 1, T, S] → [B·T, nH·hd]. */
export function attend(...args: Parameters<typeof attendHeads>): tf.Tensor2D {
  const [c, , , , , B, T] = args,
    nH = c.numAttentionHeads,
    hd = c.headDim,
    ctxv = attendHeads(...args);
  return tf.reshape<tf.Rank.R2>(T === 1 ? ctxv : tf.transpose(tf.reshape(ctxv, [B, nH, T, hd]), [0, 2, 1, 3]), [B * T, nH * hd]);
}

/** attend's outputs per head, (B·nKv, g·T, hd), before they are laid out as rows. */
export function attendHeads(
  c: Qwen2Config,
  qg: tf.Tensor3D,
  kT: tf.Tensor,
  v: tf.Tensor,
  bias: tf.Tensor4D,
  B: number,
  T: number,
  kvBias: tf.Tensor3D | null = null,
): tf.Tensor3D {
  const nH = c.numAttentionHeads,
    nKv = c.numKeyValueHeads,
    hd = c.headDim,
    g = nH / nKv,
    S = bias.shape[3];
  const kT3 = tf.reshape<tf.Rank.R3>(kT, [B * nKv, hd, S]);
  const scores = kvBias
    ? tf.reshape<tf.Rank.R4>(tf.fused.matMul({ a: qg, b: kT3, bias: kvBias }), [B, nH, T, S]) // the mask in the product's epilogue
    : tf.reshape<tf.Rank.R4>(bmm(qg, kT3), [B, nH, T, S]); // (B, nH, T, S)
  // the mask added by the softmax kernel on webgpu, else an add (softmaxBiased)
  const masked = kvBias ? softmax(scores) : softmaxBiased(scores, bias);
  const probs = tf.reshape<tf.Rank.R3>(masked, [B * nKv, g * T, S]);
  return bmm(probs, tf.reshape(v, [B * nKv, S, hd])); // (B·nKv, g·T, hd)
}

/** What the attention of every layer of one forward shares: shapes, RoPE tables [B, T, 1, hd], the
 *  attention bias [B, 1, T, S] and the cache (null in training forwards). */
export interface AttentionInputs {
  B: number;
  T: number;
  cos: tf.Tensor4D;
  sin: tf.Tensor4D;
  bias: tf.Tensor4D;
  cache: Qwen2KVCache | null;
  /** A shared prefix (see Qwen2ForCausalLM.sharePrefixes): the layer's rows are the prefix's P tokens,
   *  then each of the B rows' T − P tokens after it; cos, sin and bias are the prefix's ([1, P, 1, hd],
   *  [1, 1, P, P]) and these the rest's ([B, T − P, 1, hd], [B, 1, T − P, T]). */
  shared: { P: number; cos: tf.Tensor4D; sin: tf.Tensor4D; bias: tf.Tensor4D } | null;
  /** A decode step on webgpu: the bias laid out per kv head [B·nKv, 1, S], added by the scores'
   *  product itself (its epilogue, one dispatch fewer per layer, the same bits); null elsewhere. */
  kvBias: tf.Tensor3D | null;
}

/** One layer's attention: qkv [N, (nH + 2·nKv)·hd] → [N, nH·hd], with the layer's keys
 *  (B, nKv, hd, S) and values (B, nKv, S, hd) after the cache (if any). Three paths: a shared prefix
 *  by the backend's kernels (webgpu), a shared prefix by ops, and the plain one (a decode step may write
 *  its key and value straight into the cache's slot). With a shared prefix (ctx.shared) qkv holds the
 *  prefix's rows, then every row's rest: the prefix attends over itself, each row's rest over the
 *  prefix's keys and values followed by its own (the keys it would see unshared, in the same order);
 *  the keys and values returned are then the rest's own. */
export function layerAttention(
  c: Qwen2Config,
  l: number,
  qkv: tf.Tensor2D,
  ctx: AttentionInputs,
): { att: tf.Tensor2D; kT: tf.Tensor4D; v: tf.Tensor4D } {
  const { B, T, cos, sin, bias, cache, shared } = ctx;
  const S = bias.shape[3];
  let att: tf.Tensor2D, kT: tf.Tensor, v: tf.Tensor;
  const sh = shared
    ? sharedSeqHeads(qkv, shared.cos, shared.sin, cos, sin, {
        P: shared.P,
        B,
        T,
        nH: c.numAttentionHeads,
        nKv: c.numKeyValueHeads,
        hd: c.headDim,
        scale: 1 / Math.sqrt(c.headDim),
      })
    : null;
  if (shared && sh) {
    // one kernel each way (webgpu): the prefix's heads, the rows' queries, and the keys and values
    // each row attends over, the prefix's written into every row's
    const [qP, kTP, vP, qO, keys, values] = sh,
      g = c.numAttentionHeads / c.numKeyValueHeads;
    [kT, v] = [keys, values];
    const ctxs = [
      attendHeads(c, tf.reshape(qP, [c.numKeyValueHeads, g * shared.P, c.headDim]), kTP, vP, shared.bias, 1, shared.P),
      attendHeads(c, tf.reshape(qO, [B * c.numKeyValueHeads, g * T, c.headDim]), keys, values, bias, B, T),
    ];
    // both parts' rows laid out by one kernel (the op path: a transpose each and a concatenation)
    att = headsOut(
      ctxs,
      [
        { B: 1, T: shared.P },
        { B, T },
      ],
      c.numAttentionHeads,
      c.headDim,
    )!;
  } else if (shared) {
    const P = shared.P,
      W = qkv.shape[1];
    const pre = attentionHeads(c, tf.slice(qkv, [0, 0], [P, W]), shared.cos, shared.sin, 1, P, false);
    const own = attentionHeads(c, tf.slice(qkv, [P, 0], [B * T, W]), cos, sin, B, T, false);
    ({ kT, v } = own);
    const keys = tf.concat([tf.tile(pre.kT, [B, 1, 1, 1]), own.kT], 3), // (B, nKv, hd, P + T)
      values = tf.concat([tf.tile(pre.v, [B, 1, 1, 1]), own.v], 2); // (B, nKv, P + T, hd)
    att = tf.concat([attend(c, pre.qg, pre.kT, pre.v, shared.bias, 1, P), attend(c, own.qg, keys, values, bias, B, T)], 0);
  } else {
    // a decode step into a cache with room: its new key and value may go straight into the slot
    const slot = T === 1 && cache && cache.length && cache.writesInPlace(l, S) ? { k: cache.k[l], v: cache.v[l], pos: cache.length } : null;
    const h = attentionHeads(c, qkv, cos, sin, B, T, T === 1 && cache !== null, slot);
    ({ kT, v } = h);
    // (B, nKv, hd, S), (B, nKv, S, hd)
    if (cache && cache.length && !h.inSlot) [kT, v] = cache.extend(l, kT as tf.Tensor4D, v as tf.Tensor4D, S);
    att = attend(c, h.qg, kT, v, bias, B, T, ctx.kvBias);
  }
  return { att, kT: kT as tf.Tensor4D, v: v as tf.Tensor4D };
}
