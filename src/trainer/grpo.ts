/** One GRPO update over a batch of grouped rollouts (or numIterations updates on the same batch).
 *  The policy loss is one of policy-loss.ts's table (clipped surrogate, GSPO, MINIRL, …) with an
 *  optional k3 KL to the adapter-free base;
 *  micro-batched with gradients accumulated so the result equals one pass over the whole batch.
 *  Rollouts with zero advantage are skipped: with β = 0 they contribute exactly nothing, and their
 *  tokens still count in the denominators, so the loss is TRL's. With β > 0 this drops their KL pull
 *  (TRL keeps it); set skipZeroAdvantage false to keep it too. Leaves out advantage computation
 *  (advantages.ts) and sampling (rollout/). */
import * as tf from "@tensorflow/tfjs";
import type { CausalLM } from "../model/types.ts";
import { microBatchRows, rightPad, type PaddedBatch } from "./batch.ts";
import { NonFiniteError } from "./errors.ts";
import { accumulateGrads, stopGradient } from "./grads.ts";
import type { AdamW } from "./optimizer.ts";
import { checkPolicyLossConfig, policyLoss, readSums, statsFromSums, type LossNormalizer, type PolicyLossConfig } from "./policy-loss.ts";

/** One sampled rollout: prompt + completion ids, the loss mask aligned to ids (1 on tokens the policy
 *  sampled, 0 on prompt, tool output and template tokens) and its group-relative advantage. */
export interface GrpoRollout {
  ids: number[];
  lossMask: number[];
  advantage: number;
  truncated?: boolean; // stopped by the token or turn limit: weight 0 with maskTruncatedCompletions
}

export interface GrpoConfig extends PolicyLossConfig {
  numIterations: number; // optimizer updates on this batch (TRL's num_iterations, μ)
  maxGradNorm: number; // ≤ 0 or Infinity: no clipping
  lr: number;
  microBatchSize: number; // rollouts per forward/backward (fewer where model.trainRowsFor says so)
  padTokenId?: number; // any valid id (padding is masked); default 0
  skipZeroAdvantage?: boolean; // default true
  maskTruncatedCompletions?: boolean; // truncated rollouts train nothing and count no tokens (DAPO's overlong filtering, as TRL)
}

export interface GrpoStats {
  loss: number; // mean over iterations
  kl: number; // mean k3 KL per counted token (0 when β = 0)
  clipFrac: number; // tokens where the clipped branch was chosen, low + high
  clipFracLow: number;
  clipFracHigh: number;
  ratio: number; // mean ρ per counted token
  entropy: number; // mean policy entropy per counted token, before the first update (nats)
  gradNorm: number; // mean over iterations, before clipping
  tokens: number; // counted tokens in the rollouts trained on (per iteration)
  rollouts: number; // rollouts in the batch
  skipped: number; // rollouts skipped: zero advantage, or no token left to train
  maskedTruncated: number; // truncated rollouts given weight 0 (maskTruncatedCompletions)
}

/** The stats of a step that updates nothing (no rollout carries signal or a token to train). */
export function noUpdateStats(rollouts: number): GrpoStats {
  return { loss: 0, kl: 0, clipFrac: 0, clipFracLow: 0, clipFracHigh: 0, ratio: 1, entropy: 0, gradNorm: 0, tokens: 0, rollouts, skipped: rollouts, maskedTruncated: 0 };
}

export async function grpoStep(model: CausalLM, optimizer: AdamW, batch: GrpoRollout[], cfg: GrpoConfig): Promise<GrpoStats> {
  checkConfig(cfg);
  checkBatch(batch);
  const padId = cfg.padTokenId ?? 0;
  // Position 0 has no logprob (nothing precedes it), so it can never be a trained token. A masked
  // truncated rollout still counts as a sequence (TRL: its mask is zeroed, the batch keeps its size).
  const masks: number[][] = batch.map((r) => r.lossMask.map((m, t) => (t > 0 && m && !(cfg.maskTruncatedCompletions && r.truncated) ? 1 : 0)));
  const norm: LossNormalizer = {
    numSequences: batch.length,
    numTokens: masks.reduce((s, m) => s + m.reduce((a, x) => a + x, 0), 0),
  };
  const maskedTruncated = cfg.maskTruncatedCompletions ? batch.filter((r) => r.truncated).length : 0;
  const skip = cfg.skipZeroAdvantage ?? true;
  const kept = batch.map((_, i) => i).filter((i) => (!skip || batch[i].advantage !== 0) && masks[i].some((m) => m === 1));
  const empty: GrpoStats = { ...noUpdateStats(batch.length), skipped: batch.length - kept.length, maskedTruncated };
  if (kept.length === 0 || norm.numTokens === 0) return empty; // no signal: no update, optimizer step not counted

  // Fewer rows per micro-batch where the backend's memory needs it (the losses are normalised over
  // the whole batch, so how it is split changes no gradient).
  const mbIdx = microBatchRows(kept.map((i) => batch[i].ids.length), cfg.microBatchSize, model.trainRowsFor?.bind(model)).map((rows) => rows.map((r) => kept[r]));
  const mbs: PaddedBatch[] = mbIdx.map((rows) => rightPad(rows.map((i) => batch[i].ids), rows.map((i) => masks[i]), padId));
  const advs = mbIdx.map((rows) => rows.map((i) => batch[i].advantage));

  // Fixed for all iterations: π_old (only needed when the policy moves between iterations) and π_ref.
  const oldLogp: (tf.Tensor2D | null)[] = [];
  const refLogp: (tf.Tensor2D | null)[] = [];
  const vars = model.trainableVariables();
  const totals = { loss: 0, gradNorm: 0, tokens: 0, lowClipped: 0, highClipped: 0, kl: 0, ratio: 0, entropy: 0, entropyTokens: 0 };
  try {
    for (const mb of mbs) {
      oldLogp.push(cfg.numIterations > 1 ? model.tokenLogprobs(mb.ids, mb.attentionMask, { training: false }).logprobs : null);
      refLogp.push(cfg.beta > 0 ? model.tokenLogprobs(mb.ids, mb.attentionMask, { adapters: false }).logprobs : null);
    }
    for (let it = 0; it < cfg.numIterations; it++) {
      let acc: tf.NamedTensorMap | null = null;
      let loss = 0;
      try {
        for (let i = 0; i < mbs.length; i++) {
          const mb = mbs[i];
          let sums: ReturnType<typeof policyLoss>["sums"] | null = null;
          let entropySum: tf.Scalar | null = null;
          const { value, grads } = tf.variableGrads(() => {
            const out = model.tokenLogprobs(mb.ids, mb.attentionMask, { training: true, withEntropy: it === 0 });
            const logp = out.logprobs; // [n, L]
            const mask = tf.tensor2d(mb.lossMask, [mb.lossMask.length, mb.lossMask[0].length], "float32"); // [n, L]
            // numIterations = 1: π_old is this very forward, detached, so ρ = 1 and the gradient is −A·∇logp.
            const old = oldLogp[i] ?? (stopGradient(logp) as tf.Tensor2D);
            const r = policyLoss(
              { logp, oldLogp: old, refLogp: refLogp[i], advantages: tf.tensor1d(advs[i], "float32"), mask },
              cfg,
              norm,
            );
            Object.values(r.sums).forEach((t) => tf.keep(t)); // read after the backward pass
            sums = r.sums;
            if (out.entropy) entropySum = tf.keep(tf.sum(tf.mul(out.entropy, mask)));
            return r.loss;
          }, vars);
          acc = accumulateGrads(acc, grads);
          loss += (await value.data())[0];
          value.dispose();
          const s = await readSums(sums!);
          totals.tokens += it === 0 ? s.tokens : 0;
          totals.lowClipped += s.lowClipped;
          totals.highClipped += s.highClipped;
          totals.kl += s.kl;
          totals.ratio += s.ratio;
          if (entropySum !== null) {
            totals.entropy += (await (entropySum as tf.Scalar).data())[0];
            totals.entropyTokens += s.tokens;
            (entropySum as tf.Scalar).dispose();
          }
        }
        if (!Number.isFinite(loss)) throw new NonFiniteError("GRPO loss", loss);
        const { gradNorm } = await optimizer.applyGradients(acc!, { lr: cfg.lr, maxGradNorm: cfg.maxGradNorm });
        totals.loss += loss;
        totals.gradNorm += gradNorm;
      } finally {
        if (acc) tf.dispose(Object.values(acc));
      }
    }
  } finally {
    tf.dispose([...oldLogp, ...refLogp].filter((t): t is tf.Tensor2D => t !== null));
  }

  const k = cfg.numIterations;
  const s = statsFromSums({ tokens: totals.tokens * k, lowClipped: totals.lowClipped, highClipped: totals.highClipped, kl: totals.kl, ratio: totals.ratio });
  return {
    loss: totals.loss / k,
    kl: s.kl,
    clipFrac: s.clipFrac,
    clipFracLow: s.clipFracLow,
    clipFracHigh: s.clipFracHigh,
    ratio: s.ratio,
    entropy: totals.entropyTokens > 0 ? totals.entropy / totals.entropyTokens : 0,
    gradNorm: totals.gradNorm / k,
    tokens: totals.tokens,
    rollouts: batch.length,
    skipped: empty.skipped,
    maskedTruncated,
  };
}

function checkConfig(cfg: GrpoConfig): void {
  checkPolicyLossConfig(cfg);
  if (!(Number.isInteger(cfg.numIterations) && cfg.numIterations >= 1)) throw new Error(`numIterations ${cfg.numIterations} must be an integer ≥ 1`);
  if (!(Number.isInteger(cfg.microBatchSize) && cfg.microBatchSize >= 1)) throw new Error(`microBatchSize ${cfg.microBatchSize} must be an integer ≥ 1`);
}

function checkBatch(batch: GrpoRollout[]): void {
  if (batch.length === 0) throw new Error("GRPO batch has no rollouts");
  batch.forEach((r, i) => {
    if (r.ids.length === 0) throw new Error(`rollout ${i} has no tokens`);
    if (r.lossMask.length !== r.ids.length) throw new Error(`rollout ${i} has ${r.ids.length} ids but a loss mask of ${r.lossMask.length}`);
    if (!Number.isFinite(r.advantage)) throw new Error(`rollout ${i} advantage is ${r.advantage}; must be finite`);
  });
}
