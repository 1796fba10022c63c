/** Qwen2's grouped-query attention on tensors: the query, key and value heads of the fused q/k/v
 *  projection with RoPE (kernels/heads.ts' kernels where the backend has them), and the attention of
 *  stacked queries over keys and values with the additive bias. Without repeating K/V: the g query
 *  heads sharing a kv head are stacked along the rows. The host-side tables are in attention.ts. */
import * as tf from "@tensorflow/tfjs";
import { decodeHeads, decodeHeadsInto, seqHeads } from "../kernels/heads.ts";
import { bmm } from "../kernels/matmul.ts";
import { rope } from "../kernels/rope-swiglu.ts";
import { softmax, softmaxBiased } from "../kernels/softmax.ts";
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
