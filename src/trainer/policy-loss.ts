/** The GRPO per-token loss on tensors: clipped importance-ratio surrogate plus an optional k3 KL to the
 *  reference policy, then one of the aggregations TRL offers. Pure tensor math, no model: the step that
 *  feeds it lives in grpo.ts. Leaves out entropy bonuses and sequence-level importance sampling. */
import * as tf from "@tensorflow/tfjs";

export const LOSS_TYPES = ["grpo", "bnpo", "dapo", "dr_grpo"] as const;
export type LossType = (typeof LOSS_TYPES)[number];

export interface PolicyLossConfig {
  epsilon: number; // lower clip: ρ ≥ 1 − epsilon
  epsilonHigh: number; // upper clip: ρ ≤ 1 + epsilonHigh (DAPO's clip-higher; = epsilon for plain GRPO)
  beta: number; // KL weight; 0 = no reference policy needed
  lossType: LossType;
  maxNewTokens: number; // dr_grpo's constant denominator per sequence
}

/** Totals of the whole batch. A micro-batch divides by these, so the micro-batch losses add up to the
 *  loss of the whole batch. Default: the totals of the tensors given. */
export interface LossNormalizer {
  numSequences: number; // sequences in the whole batch
  numTokens: number; // mask-1 tokens in the whole batch
}

export interface PolicyLossInputs {
  logp: tf.Tensor2D; // [N, T] current policy, differentiable
  oldLogp: tf.Tensor2D; // [N, T] policy that sampled the rollouts (no gradient flows into it)
  refLogp: tf.Tensor2D | null; // [N, T] reference policy, or null when beta = 0
  advantages: tf.Tensor1D; // [N]
  mask: tf.Tensor2D; // [N, T] 1 on tokens the policy wrote, 0 on prompt, tool output, padding
}

/** Sums over the mask-1 tokens (not means), so micro-batches combine by adding. */
export type PolicyLossSums = {
  tokens: tf.Scalar;
  lowClipped: tf.Scalar; // ρ < 1 − ε with A < 0: the clipped branch was taken from below
  highClipped: tf.Scalar; // ρ > 1 + ε_high with A > 0: the clipped branch was taken from above
  kl: tf.Scalar; // Σ k3 KL (0 when refLogp is null)
  ratio: tf.Scalar; // Σ ρ
};

export function checkPolicyLossConfig(cfg: PolicyLossConfig): void {
  if (!LOSS_TYPES.includes(cfg.lossType)) throw new Error(`lossType "${cfg.lossType}" is not one of ${LOSS_TYPES.join(", ")}`);
  if (!(cfg.epsilon > 0 && cfg.epsilon < 1)) throw new Error(`epsilon ${cfg.epsilon} must be in (0, 1)`);
  if (!(cfg.epsilonHigh > 0)) throw new Error(`epsilonHigh ${cfg.epsilonHigh} must be > 0`);
  if (!(cfg.beta >= 0)) throw new Error(`beta ${cfg.beta} must be ≥ 0`);
  if (cfg.lossType === "dr_grpo" && !(Number.isInteger(cfg.maxNewTokens) && cfg.maxNewTokens > 0))
    throw new Error(`maxNewTokens ${cfg.maxNewTokens} must be a positive integer for lossType dr_grpo`);
}

/** ℓ[n,t] = −min(ρ·A, clip(ρ, 1−ε, 1+ε_high)·A) + β·(exp(ref−logp) − (ref−logp) − 1), ρ = exp(logp − old).
 *  Masked positions are 0 and pass no gradient (tf.where, so a stray ±Inf there cannot turn into NaN). */
export function perTokenLoss(x: PolicyLossInputs, cfg: PolicyLossConfig): { loss: tf.Tensor2D; ratio: tf.Tensor2D; kl: tf.Tensor2D | null } {
  const on = tf.greater(x.mask, 0); // [N, T] bool
  const zeros = tf.zerosLike(x.logp);
  const ratio = tf.exp(tf.where(on, tf.sub(x.logp, x.oldLogp), zeros)) as tf.Tensor2D; // [N, T], 1 off-mask
  const adv = tf.expandDims(x.advantages, 1); // [N, 1]
  const unclipped = tf.mul(ratio, adv);
  const clipped = tf.mul(tf.clipByValue(ratio, 1 - cfg.epsilon, 1 + cfg.epsilonHigh), adv);
  // Unclipped first: tf.minimum sends the gradient of a tie to its first argument, so at ρ = 1 the
  // gradient is the plain policy gradient −A.
  let loss = tf.neg(tf.minimum(unclipped, clipped)) as tf.Tensor2D;
  let kl: tf.Tensor2D | null = null;
  if (x.refLogp !== null && cfg.beta > 0) {
    const d = tf.where(on, tf.sub(x.refLogp, x.logp), zeros); // [N, T] ref − logp
    kl = tf.sub(tf.sub(tf.exp(d), d), 1) as tf.Tensor2D; // k3: unbiased, always ≥ 0
    loss = tf.add(loss, tf.mul(kl, cfg.beta)) as tf.Tensor2D;
  }
  return { loss: tf.where(on, loss, zeros) as tf.Tensor2D, ratio, kl };
}

/** Per-token losses [N, T] → scalar, following TRL:
 *  grpo     Σ_n (Σ_t ℓ·m / max(1, Σ_t m)) / N          mean per sequence, then over sequences
 *  bnpo     Σ ℓ·m / max(1, Σ m)                         every token weighs the same (dapo: same here,
 *  dapo                                                  one process holds the whole batch)
 *  dr_grpo  Σ ℓ·m / (N · maxNewTokens)                  constant denominator: no length bias
 *  N and Σ m are the whole batch's (`norm`), so micro-batch losses add up to the batch loss. */
export function aggregateLoss(perToken: tf.Tensor2D, mask: tf.Tensor2D, cfg: PolicyLossConfig, norm?: LossNormalizer): tf.Scalar {
  return tf.tidy(() => {
    // Without a batch normalizer: this batch's own counts (token count kept on the device, no read).
    const n = norm ?? { numSequences: perToken.shape[0], numTokens: tf.sum(mask) };
    const masked = tf.mul(perToken, mask); // [N, T]
    switch (cfg.lossType) {
      case "grpo": {
        const perSeq = tf.div(tf.sum(masked, 1), tf.maximum(tf.sum(mask, 1), 1)); // [N]
        return tf.div(tf.sum(perSeq), Math.max(1, n.numSequences)) as tf.Scalar;
      }
      case "bnpo":
      case "dapo":
        return tf.div(tf.sum(masked), tf.maximum(n.numTokens, 1)) as tf.Scalar;
      case "dr_grpo":
        return tf.div(tf.sum(masked), Math.max(1, n.numSequences) * cfg.maxNewTokens) as tf.Scalar;
    }
  });
}

/** The aggregated loss (differentiable w.r.t. logp) and token sums for clip fraction, KL and ratio
 *  (not meant to be differentiated; keep or dispose them). */
export function policyLoss(x: PolicyLossInputs, cfg: PolicyLossConfig, norm?: LossNormalizer): { loss: tf.Scalar; sums: PolicyLossSums } {
  checkShapes(x);
  return tf.tidy(() => {
    const { loss: perTok, ratio, kl } = perTokenLoss(x, cfg);
    const loss = aggregateLoss(perTok, x.mask, cfg, norm);
    const adv = tf.expandDims(x.advantages, 1); // [N, 1]
    const m = x.mask;
    const low = tf.logicalAnd(tf.less(ratio, 1 - cfg.epsilon), tf.less(adv, 0)); // [N, T]
    const high = tf.logicalAnd(tf.greater(ratio, 1 + cfg.epsilonHigh), tf.greater(adv, 0));
    const sums: PolicyLossSums = {
      tokens: tf.sum(m),
      lowClipped: tf.sum(tf.mul(tf.cast(low, "float32"), m)),
      highClipped: tf.sum(tf.mul(tf.cast(high, "float32"), m)),
      kl: kl === null ? tf.scalar(0) : tf.sum(tf.mul(kl, m)),
      ratio: tf.sum(tf.mul(ratio, m)),
    };
    return { loss, sums };
  });
}

/** Means over the mask-1 tokens, as numbers: what a log line shows. */
export interface PolicyLossStats {
  clipFracLow: number;
  clipFracHigh: number;
  clipFrac: number; // low + high: tokens where the clipped branch was chosen
  kl: number;
  ratio: number;
  tokens: number;
}

/** Turn (possibly accumulated) token sums into means. */
export function statsFromSums(s: { tokens: number; lowClipped: number; highClipped: number; kl: number; ratio: number }): PolicyLossStats {
  const t = Math.max(1, s.tokens);
  return {
    clipFracLow: s.lowClipped / t,
    clipFracHigh: s.highClipped / t,
    clipFrac: (s.lowClipped + s.highClipped) / t,
    kl: s.kl / t,
    ratio: s.ratio / t,
    tokens: s.tokens,
  };
}

/** Read a PolicyLossSums into numbers and dispose it. */
export async function readSums(s: PolicyLossSums): Promise<{ tokens: number; lowClipped: number; highClipped: number; kl: number; ratio: number }> {
  const all = tf.tidy(() => tf.stack([s.tokens, s.lowClipped, s.highClipped, s.kl, s.ratio]));
  const [tokens, lowClipped, highClipped, kl, ratio] = await all.data(); // one read for the five
  all.dispose();
  const out = { tokens, lowClipped, highClipped, kl, ratio };
  tf.dispose(Object.values(s));
  return out;
}

function checkShapes(x: PolicyLossInputs): void {
  const [n, t] = x.logp.shape;
  const same = (name: string, s: number[]) => {
    if (s.length !== 2 || s[0] !== n || s[1] !== t) throw new Error(`${name} has shape [${s}]; expected [${n}, ${t}] like logp`);
  };
  same("oldLogp", x.oldLogp.shape);
  same("mask", x.mask.shape);
  if (x.refLogp !== null) same("refLogp", x.refLogp.shape);
  if (x.advantages.shape.length !== 1 || x.advantages.shape[0] !== n)
    throw new Error(`advantages has shape [${x.advantages.shape}]; expected [${n}], one per sequence`);
}
