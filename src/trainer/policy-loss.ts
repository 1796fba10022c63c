/** GRPO-family policy losses on tensors, as one table (POLICY_LOSSES, in the spirit of verl's
 *  `register_policy_loss` + `agg_loss`): each entry is a per-token term and an aggregation, so adding a
 *  loss is one entry here. Shared by all: the importance ratio ρ (per token, or one per sequence as in
 *  GSPO), the optional k3 KL to the reference policy, and log-ratios clamped to [−20, 20] before every
 *  exp (verl's bound), so one outlier token cannot turn the loss into Inf/NaN. Pure tensor math, no
 *  model: the step that feeds it lives in grpo.ts. Leaves out entropy bonuses and value functions. */
import * as tf from "@tensorflow/tfjs";

/** ρ's log is clamped to this before exp: exp(20) ≈ 5e8 is finite in f32; the clamp passes no gradient. */
export const LOG_RATIO_BOUND = 20;

export const IMPORTANCE_SAMPLING_LEVELS = ["token", "sequence"] as const;
export type ImportanceSamplingLevel = (typeof IMPORTANCE_SAMPLING_LEVELS)[number];

export interface PolicyLossConfig {
  epsilon: number; // lower clip: ρ ≥ 1 − epsilon
  epsilonHigh: number; // upper clip: ρ ≤ 1 + epsilonHigh (DAPO's clip-higher; = epsilon for plain GRPO)
  beta: number; // KL weight; 0 = no reference policy needed
  lossType: LossType;
  maxNewTokens: number; // dr_grpo's constant denominator per sequence
  importanceSamplingLevel?: ImportanceSamplingLevel; // default token; gspo is always sequence
}

/** Totals of the whole batch. A micro-batch divides by these, so the micro-batch losses add up to the
 *  loss of the whole batch. Default: the totals of the tensors given. */
export interface LossNormalizer {
  numSequences: number; // sequences in the whole batch
  numTokens: number; // mask-1 tokens in the whole batch
}

/** What an aggregation divides by: a LossNormalizer, or a batch's own counts with the token count
 *  left on the device. */
type BatchCounts = { numSequences: number; numTokens: number | tf.Scalar };

export interface PolicyLossInputs {
  logp: tf.Tensor2D; // [N, T] current policy, differentiable
  oldLogp: tf.Tensor2D; // [N, T] policy that sampled the rollouts (no gradient flows into it)
  refLogp: tf.Tensor2D | null; // [N, T] reference policy, or null when beta = 0
  advantages: tf.Tensor1D; // [N]
  mask: tf.Tensor2D; // [N, T] 1 on tokens the policy wrote, 0 on prompt, tool output, padding
  /** [N, T] truncated importance-sampling weights min(π_trainer / π_engine, C), no gradient: the
   *  policy term of each token is multiplied by its weight (the KL term is not), as verl's and TRL's
   *  vLLM paths correct for an inference engine that samples a slightly different policy. */
  isWeights?: tf.Tensor2D;
}

/** What a per-token term sees: ρ and logp are 1 and 0 off the mask. */
interface TermInputs {
  ratio: tf.Tensor2D; // [N, T] ρ (a sequence's ρ repeated along T at sequence level)
  logp: tf.Tensor2D; // [N, T]
  adv: tf.Tensor2D; // [N, 1]
  low: tf.Tensor2D; // [N, T] bool: ρ < 1 − ε with A < 0
  high: tf.Tensor2D; // [N, T] bool: ρ > 1 + ε_high with A > 0
}

/** One registry entry: the policy term per token and how per-token losses become one number. */
export interface PolicyLossEntry {
  help: string;
  term: (x: TermInputs, cfg: PolicyLossConfig) => tf.Tensor2D; // [N, T]
  aggregate: (masked: tf.Tensor2D, mask: tf.Tensor2D, n: BatchCounts, cfg: PolicyLossConfig) => tf.Scalar;
  level?: ImportanceSamplingLevel; // forces the importance-sampling level (gspo)
  epsilonHigh?: (epsilon: number) => number; // default upper range when none is given (else ε)
}

/** PPO's clipped surrogate −min(ρ·A, clip(ρ, 1−ε, 1+ε_high)·A). Unclipped first: tf.minimum sends the
 *  gradient of a tie to its first argument, so at ρ = 1 the gradient is the plain policy gradient −A. */
const clipped: PolicyLossEntry["term"] = (x, cfg) =>
  tf.neg(tf.minimum(tf.mul(x.ratio, x.adv), tf.mul(tf.clipByValue(x.ratio, 1 - cfg.epsilon, 1 + cfg.epsilonHigh), x.adv))) as tf.Tensor2D;

/** AgentRL's MINIRL: −sg(ρ)·A·logp, a REINFORCE term weighted by the detached ratio, no min and no
 *  clip; instead a token whose ρ left the window [1−ε, 1+ε_high] in the direction A pushes is dropped
 *  (its `strict_in_bound`). A ρ exactly on the bound is kept. One custom-gradient op: the window test
 *  is boolean math tfjs cannot differentiate through, and ρ must pass no gradient anyway. */
const minirl: PolicyLossEntry["term"] = (x, cfg) => {
  const op = tf.customGrad((logp, ratio, adv, save) => {
    const r = ratio as tf.Tensor2D,
      a = adv as tf.Tensor2D;
    const out = tf.logicalOr(
      tf.logicalAnd(tf.greater(r, 1 + cfg.epsilonHigh), tf.greater(a, 0)),
      tf.logicalAnd(tf.less(r, 1 - cfg.epsilon), tf.less(a, 0)),
    );
    const w = tf.where(out, tf.zerosLike(r), tf.neg(tf.mul(r, a))); // [N, T] −ρ·A inside the window, 0 outside
    (save as tf.GradSaveFunc)([w]);
    return {
      value: tf.mul(w, logp as tf.Tensor),
      gradFunc: (dy: tf.Tensor, saved: tf.Tensor[]) => [tf.mul(dy, saved[0]), tf.zeros(r.shape), tf.zeros(a.shape)],
    };
  });
  return op(x.logp, x.ratio, x.adv) as tf.Tensor2D;
};

/** Aggregations, with verl's names. `masked` is ℓ·m; N and Σ m are the whole batch's (`n`). */
const seqMeanTokenMean: PolicyLossEntry["aggregate"] = (masked, mask, n) =>
  tf.div(tf.sum(tf.div(tf.sum(masked, 1), tf.maximum(tf.sum(mask, 1), 1))), Math.max(1, n.numSequences)) as tf.Scalar;
const tokenMean: PolicyLossEntry["aggregate"] = (masked, _mask, n) => tf.div(tf.sum(masked), tf.maximum(n.numTokens, 1)) as tf.Scalar;
const seqMeanTokenSum: PolicyLossEntry["aggregate"] = (masked, _mask, n) =>
  tf.div(tf.sum(masked), Math.max(1, n.numSequences)) as tf.Scalar;
const seqMeanTokenSumNorm: PolicyLossEntry["aggregate"] = (masked, _mask, n, cfg) =>
  tf.div(tf.sum(masked), Math.max(1, n.numSequences) * cfg.maxNewTokens) as tf.Scalar;

/** The losses `--loss_type` offers. */
export const POLICY_LOSSES = {
  // Σ_n (Σ_t ℓ·m / max(1, Σ_t m)) / N: mean per sequence, then over sequences (TRL's grpo).
  grpo: { help: "clipped ratio, mean per sequence then over sequences", term: clipped, aggregate: seqMeanTokenMean },
  // Σ ℓ·m / max(1, Σ m): every token weighs the same (dapo is the same here: one process holds the batch).
  bnpo: { help: "clipped ratio, mean over all tokens", term: clipped, aggregate: tokenMean },
  dapo: { help: "clipped ratio, mean over all tokens", term: clipped, aggregate: tokenMean },
  // Σ ℓ·m / (N · maxNewTokens): a constant denominator, so no length bias (Dr. GRPO).
  dr_grpo: { help: "clipped ratio, sum ÷ (sequences × max_new_tokens)", term: clipped, aggregate: seqMeanTokenSumNorm },
  // GSPO: one ratio per sequence, exp(mean_t(logp − old)), clipped as GRPO clips; mean per sequence.
  gspo: { help: "grpo with one importance ratio per sequence (GSPO)", term: clipped, aggregate: seqMeanTokenMean, level: "sequence" },
  // AgentRL's recommended setting: token_level_loss=false, skip_length_normalization=true → Σ_t per
  // sequence, mean over sequences; its window [1−ε, 1+ε+0.1] by default (epsilon_higher 0.1 on top).
  minirl: {
    help: "AgentRL's −sg(ρ)·A·logp, out-of-window tokens dropped, sum per sequence",
    term: minirl,
    aggregate: seqMeanTokenSum,
    epsilonHigh: (eps: number) => eps + 0.1,
  },
} satisfies Record<string, PolicyLossEntry>;

export type LossType = keyof typeof POLICY_LOSSES;
export const LOSS_TYPES = Object.keys(POLICY_LOSSES) as LossType[];

/** The importance-sampling level a config trains with (gspo forces sequence). */
export function importanceLevel(cfg: Pick<PolicyLossConfig, "lossType" | "importanceSamplingLevel">): ImportanceSamplingLevel {
  return (POLICY_LOSSES[cfg.lossType] as PolicyLossEntry).level ?? cfg.importanceSamplingLevel ?? "token";
}

/** The upper clip range when none was given: the loss's own default, else ε. */
export function defaultEpsilonHigh(lossType: LossType, epsilon: number): number {
  return (POLICY_LOSSES[lossType] as PolicyLossEntry).epsilonHigh?.(epsilon) ?? epsilon;
}

/** Sums over the mask-1 tokens (not means), so micro-batches combine by adding. */
export type PolicyLossSums = {
  tokens: tf.Scalar;
  lowClipped: tf.Scalar; // ρ < 1 − ε with A < 0: clipped from below (minirl: dropped)
  highClipped: tf.Scalar; // ρ > 1 + ε_high with A > 0: clipped from above (minirl: dropped)
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
  const level = cfg.importanceSamplingLevel ?? "token";
  if (!IMPORTANCE_SAMPLING_LEVELS.includes(level))
    throw new Error(`importanceSamplingLevel "${level}" is not one of ${IMPORTANCE_SAMPLING_LEVELS.join(", ")}`);
}

/** log ρ per token [N, T], clamped to ±LOG_RATIO_BOUND, 0 off the mask; at sequence level every
 *  token of a sequence holds the sequence's mean (GSPO: log s = mean_t log ρ_t over mask-1 tokens). */
function logRatio(x: PolicyLossInputs, on: tf.Tensor2D, level: ImportanceSamplingLevel): tf.Tensor2D {
  const zeros = tf.zerosLike(x.logp);
  const lr = tf.clipByValue(tf.where(on, tf.sub(x.logp, x.oldLogp), zeros), -LOG_RATIO_BOUND, LOG_RATIO_BOUND) as tf.Tensor2D;
  if (level === "token") return lr;
  const seq = tf.div(tf.sum(lr, 1, true), tf.maximum(tf.sum(x.mask, 1, true), 1)); // [N, 1]
  return tf.where(on, tf.mul(seq, tf.onesLike(lr)), zeros) as tf.Tensor2D;
}

/** ℓ[n,t] = the entry's policy term + β·(exp(ref−logp) − (ref−logp) − 1), with ρ = exp(logp − old)
 *  (or the sequence's ρ). Masked positions are 0 and pass no gradient (tf.where, so a stray ±Inf there
 *  cannot turn into NaN). `low`/`high`: the tokens clipped (or, for minirl, dropped) from each side. */
export function perTokenLoss(
  x: PolicyLossInputs,
  cfg: PolicyLossConfig,
): { loss: tf.Tensor2D; ratio: tf.Tensor2D; kl: tf.Tensor2D | null; low: tf.Tensor2D; high: tf.Tensor2D } {
  const on = tf.greater(x.mask, 0) as tf.Tensor2D; // [N, T] bool
  const zeros = tf.zerosLike(x.logp);
  const ratio = tf.exp(logRatio(x, on, importanceLevel(cfg))) as tf.Tensor2D; // [N, T], 1 off-mask
  const adv = tf.expandDims(x.advantages, 1) as tf.Tensor2D; // [N, 1]
  const low = tf.logicalAnd(tf.less(ratio, 1 - cfg.epsilon), tf.less(adv, 0)) as tf.Tensor2D;
  const high = tf.logicalAnd(tf.greater(ratio, 1 + cfg.epsilonHigh), tf.greater(adv, 0)) as tf.Tensor2D;
  const entry = POLICY_LOSSES[cfg.lossType] as PolicyLossEntry;
  let loss = entry.term({ ratio, logp: tf.where(on, x.logp, zeros) as tf.Tensor2D, adv, low, high }, cfg);
  if (x.isWeights) loss = tf.mul(loss, x.isWeights) as tf.Tensor2D;
  let kl: tf.Tensor2D | null = null;
  if (x.refLogp !== null && cfg.beta > 0) {
    const d = tf.clipByValue(tf.where(on, tf.sub(x.refLogp, x.logp), zeros), -LOG_RATIO_BOUND, LOG_RATIO_BOUND); // [N, T] ref − logp
    kl = tf.sub(tf.sub(tf.exp(d), d), 1) as tf.Tensor2D; // k3: unbiased, always ≥ 0
    loss = tf.add(loss, tf.mul(kl, cfg.beta)) as tf.Tensor2D;
  }
  return { loss: tf.where(on, loss, zeros) as tf.Tensor2D, ratio, kl, low, high };
}

/** Per-token losses [N, T] → scalar by the entry's aggregation. N and Σ m are the whole batch's
 *  (`norm`), so micro-batch losses add up to the batch loss. */
export function aggregateLoss(perToken: tf.Tensor2D, mask: tf.Tensor2D, cfg: PolicyLossConfig, norm?: LossNormalizer): tf.Scalar {
  return tf.tidy(() => {
    // Without a batch normalizer: this batch's own counts (token count kept on the device, no read).
    const n = norm ?? { numSequences: perToken.shape[0], numTokens: tf.sum(mask) as tf.Scalar };
    return (POLICY_LOSSES[cfg.lossType] as PolicyLossEntry).aggregate(tf.mul(perToken, mask) as tf.Tensor2D, mask, n, cfg);
  });
}

/** The aggregated loss (differentiable w.r.t. logp) and token sums for clip fraction, KL and ratio
 *  (not meant to be differentiated; keep or dispose them). */
export function policyLoss(x: PolicyLossInputs, cfg: PolicyLossConfig, norm?: LossNormalizer): { loss: tf.Scalar; sums: PolicyLossSums } {
  checkShapes(x);
  return tf.tidy(() => {
    const { loss: perTok, ratio, kl, low, high } = perTokenLoss(x, cfg);
    const loss = aggregateLoss(perTok, x.mask, cfg, norm);
    const m = x.mask;
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
export async function readSums(
  s: PolicyLossSums,
): Promise<{ tokens: number; lowClipped: number; highClipped: number; kl: number; ratio: number }> {
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
  if (x.isWeights) same("isWeights", x.isWeights.shape);
  if (x.advantages.shape.length !== 1 || x.advantages.shape[0] !== n)
    throw new Error(`advantages has shape [${x.advantages.shape}]; expected [${n}], one per sequence`);
}
