/** The pieces of one GRPO step between the rollouts and the update, as pure functions: scoring
 *  (rewards and group-relative advantages, on copies: the engine's trajectories are not written to),
 *  the update's batch, and the step's metrics. grpo-run.ts holds the order. */
import type { Task } from "../datasets/tasks.ts";
import type { ChatMessage } from "../model/types.ts";
import { episodePrompt, openEpisodes } from "../envs/episodes.ts";
import type { EnvironmentFactory } from "../envs/types.ts";
import type { EngineSampling, RolloutEngine, StepRollouts } from "../rollout/engines/types.ts";
import { scoreRollout } from "../rollout/rewards.ts";
import { byGroup } from "../rollout/episode.ts";
import type { Trajectory } from "../rollout/types.ts";
import { countedGroupAdvantages, groupHasSignal } from "../trainer/advantages.ts";
import type { GrpoConfig, GrpoRollout, GrpoStats } from "../trainer/grpo.ts";
import { GRPO_LINE, meanStd, memoryFields } from "../trainer/metrics.ts";
import type { GrpoFlags } from "./grpo-flags.ts";
import { mean } from "../trainer/stats.ts";
import { samplingSettings, turnSettings } from "./flags.ts";

/** A step's rollouts on the engine. With an environment each task's prompt is its first observation
 *  and each row acts in its own instance, open for the step only. Step s draws from seed·1000003 + s. */
export async function rolloutsOf(
  e: RolloutEngine,
  o: {
    step: number;
    steps: number;
    batch: Task[];
    seed: number;
    samples: number;
    envs: EnvironmentFactory | null;
    promptsOf: (s: number) => ChatMessage[][];
  },
): Promise<StepRollouts> {
  const req = { step: o.step, steps: o.steps, prompts: o.promptsOf, seedOf: (s: number) => o.seed * 1_000_003 + s };
  if (!o.envs) return e.rollouts(req);
  const episodes = await openEpisodes(
    o.envs,
    o.batch.map((ex) => Number(ex.id)),
    o.samples,
  );
  try {
    return await e.rollouts({ ...req, prompts: () => episodes.observations.map((x) => episodePrompt(o.envs!, x)), envs: episodes.envs });
  } finally {
    await episodes.close();
  }
}

/** How the engine samples, from the run's flags. */
export function engineSampling(cfg: GrpoFlags): EngineSampling {
  return { ...samplingSettings(cfg), ...turnSettings(cfg) };
}

/** The update's configuration from the run's flags. */
export function grpoConfig(cfg: GrpoFlags & { epsilon_high: number }, lr: number, padTokenId: number, e: RolloutEngine): GrpoConfig {
  return {
    beta: cfg.beta,
    epsilon: cfg.epsilon,
    epsilonHigh: cfg.epsilon_high,
    lossType: cfg.loss_type,
    maxNewTokens: cfg.max_new_tokens,
    importanceSamplingLevel: cfg.importance_sampling_level,
    maskTruncatedCompletions: cfg.mask_truncated_completions,
    numIterations: cfg.num_iterations,
    maxGradNorm: cfg.max_grad_norm,
    lr,
    microBatchSize: cfg.micro_batch_size,
    padTokenId,
    offPolicy: e.offPolicy,
    tisCap: cfg.tis_cap,
  };
}

export interface ScoredStep {
  trajs: Trajectory[]; // copies of the rollouts with reward and rewardComponents
  rewards: number[][]; // per question, per counted rollout
  counted: boolean[][]; // per question, per rollout: false where the environment failed it
  advantages: number[][]; // per question, per rollout (0 where not counted)
}

/** A rollout the environment failed scores 0, is kept in the log, trains nothing and is left out of
 *  its group's advantages (advantages.ts countedGroupAdvantages). */
const envFailed = (t: Trajectory) => t.finishReason === "env_error";

export function scoreStep(
  rolled: Trajectory[],
  batch: Task[],
  o: { rewardWeights: Record<string, number>; scale: "group" | "none" },
): ScoredStep {
  const groups = byGroup(rolled, batch.length).map((g, p) =>
    g.map((t) => {
      const s = scoreRollout(t, batch[p], o.rewardWeights);
      return { ...t, reward: envFailed(t) ? 0 : s.reward, rewardComponents: s.components };
    }),
  );
  const trajs = rolled.map((t) => groups[t.promptIndex][t.sampleIndex]); // in the engine's order, for the log
  const counted = groups.map((g) => g.map((t) => !envFailed(t)));
  const all = groups.map((g) => g.map((t) => t.reward));
  const advantages = countedGroupAdvantages(all, counted, o.scale);
  const rewards = all.map((g, p) => g.filter((_, i) => counted[p][i]));
  return { trajs, rewards, counted, advantages };
}

/** The update's rollouts: prompt + completion ids, the loss mask over both, the advantage, and, from
 *  an engine whose log-probs are not the trainer's, the behaviour log-probs of its sampled tokens. */
export function grpoRollouts(s: ScoredStep, behaviour: boolean): GrpoRollout[] {
  return s.trajs.flatMap((t) => {
    const [p, g] = [t.promptIndex, t.sampleIndex];
    if (!s.counted[p][g]) return [];
    const ids = [...t.promptIds, ...t.completionIds];
    const lossMask = [...t.promptIds.map(() => 0), ...t.lossMask];
    const truncated = t.finishReason === "length" || t.finishReason === "max_turns";
    const behaviourLogprobs = behaviour
      ? [...t.promptIds.map(() => NaN), ...t.sampleLogprobs.map((x, k) => (t.lossMask[k] ? x : NaN))]
      : undefined;
    return [{ ids, lossMask, group: p, advantage: s.advantages[p][g], truncated, behaviourLogprobs }];
  });
}

/** The loss a run trains with and its hyper-parameters, as metrics.jsonl holds them. */
export function lossFields(cfg: GrpoFlags & { epsilon_high: number }): Record<string, string | number | boolean> {
  return {
    loss_type: cfg.loss_type,
    importance_sampling_level: cfg.importance_sampling_level,
    epsilon: cfg.epsilon,
    epsilon_high: cfg.epsilon_high,
    beta: cfg.beta,
    mask_truncated_completions: cfg.mask_truncated_completions,
  };
}

/** "minirl (ε 0.2, ε_high 0.3, β 0, token-level ratios, truncated rollouts trained)": the report's line. */
export function describeLoss(f: ReturnType<typeof lossFields>): string {
  const truncated = f.mask_truncated_completions ? "masked" : "trained";
  const ratios = `${f.importance_sampling_level}-level ratios`;
  return `${f.loss_type} (ε ${f.epsilon}, ε_high ${f.epsilon_high}, β ${f.beta}, ${ratios}, truncated rollouts ${truncated})`;
}

/** The step line of a run against an environment: the GRPO line with the share of rollouts the
 *  environment failed. */
export const ENV_LINE = [...GRPO_LINE.slice(0, -1), { key: "env_error_rate", label: "env err" }, ...GRPO_LINE.slice(-1)];

/** Everything a step logs, with the names the step line and the report know. */
export function stepMetrics(
  trajs: Trajectory[],
  rewards: number[][],
  s: GrpoStats,
  t: { lr: number; rolloutSeconds: number; trainSeconds: number; stepSeconds: number },
): Record<string, number> {
  const r = meanStd(trajs.map((x) => x.reward!));
  const components: Record<string, number> = {};
  for (const name of Object.keys(trajs[0]?.rewardComponents ?? {}))
    components[`reward_${name}`] = mean(
      trajs.map((x) => x.rewardComponents![name]),
      0,
    );
  const calls = trajs.reduce((a, x) => a + x.numToolCalls + x.numParseErrors, 0);
  const failed = trajs.reduce((a, x) => a + x.numToolErrors + x.numParseErrors, 0);
  const rolloutTokens = trajs.reduce((a, x) => a + x.completionIds.length, 0);
  return {
    reward: r.mean,
    reward_std: r.std,
    accuracy: components.reward_correctness ?? NaN,
    ...components,
    kl: s.kl,
    clip_ratio: s.clipFrac,
    clip_ratio_low: s.clipFracLow,
    clip_ratio_high: s.clipFracHigh,
    entropy: s.entropy,
    loss: s.loss,
    grad_norm: s.gradNorm,
    lr: t.lr,
    completion_len: mean(
      trajs.map((x) => x.completionIds.length),
      0,
    ),
    completion_len_max: Math.max(0, ...trajs.map((x) => x.completionIds.length)),
    sampled_len: mean(
      trajs.map((x) => x.lossMask.reduce((a, b) => a + b, 0)),
      0,
    ),
    tool_calls: mean(
      trajs.map((x) => x.numToolCalls),
      0,
    ),
    tool_error_rate: calls ? failed / calls : 0,
    // Runs against an environment only, so a tool run's metrics stay as they were.
    ...(trajs[0]?.envReward !== undefined
      ? {
          env_error_rate: mean(
            trajs.map((x) => (x.finishReason === "env_error" ? 1 : 0)),
            0,
          ),
        }
      : {}),
    truncated: mean(
      trajs.map((x) => (x.truncated ? 1 : 0)),
      0,
    ),
    zero_signal_groups: mean(
      rewards.map((g) => (groupHasSignal(g) ? 0 : 1)),
      0,
    ),
    masked_truncated: s.maskedTruncated / Math.max(1, s.rollouts),
    rollout_tokens_per_s: rolloutTokens / t.rolloutSeconds,
    train_tokens_per_s: s.tokens / Math.max(t.trainSeconds, 1e-9),
    rollout_time: t.rolloutSeconds,
    train_time: t.trainSeconds,
    step_time: t.stepSeconds,
    ...memoryFields(),
  };
}

/** --micro_batch_size auto: what the step's update chose, as metrics.jsonl holds it (0 where the step
 *  updated nothing). */
export function autoMicroBatchFields(s: GrpoStats): Record<string, number> {
  const mb = s.microBatch;
  return { micro_batches: mb?.count ?? 0, micro_batch_rows: mb?.rows ?? 0, micro_batch_out_of_memory: mb?.outOfMemory ?? 0 };
}

/** The line --micro_batch_size auto prints: what it chose at the run's first update, and again at a
 *  step whose split ran out of device memory and was halved (smaller from then on). null otherwise. */
export function autoMicroBatchNote(s: GrpoStats, first: boolean): string | null {
  const mb = s.microBatch;
  if (!mb || (!first && mb.outOfMemory === 0)) return null;
  const chose = `${mb.count} micro-batch${mb.count === 1 ? "" : "es"} of up to ${mb.rows} rollout${mb.rows === 1 ? "" : "s"}`;
  if (mb.outOfMemory === 0) return `--micro_batch_size auto: ${chose}`;
  const times = mb.outOfMemory === 1 ? "once" : `${mb.outOfMemory} times`;
  return `--micro_batch_size auto: out of device memory ${times}, halved; now ${chose}`;
}

/** The engine's own figures, and where its log-probs are not the trainer's, their gap to the
 *  trainer's and the share of tokens whose TIS weight was capped. */
export function engineMetrics(own: Record<string, number>, s: GrpoStats, e: RolloutEngine): Record<string, number> {
  if (!e.behaviourLogprobs) return own;
  return { ...own, engine_logprob_gap: s.behaviourGap, engine_logprob_delta: s.behaviourDelta, tis_clipped_fraction: s.tisClipped };
}

/** Rollouts the environment failed: a note per step, and a stop after `maxSteps` steps in a row in
 *  which every rollout failed (0: never). */
export class EnvFailures {
  private inARow = 0;
  constructor(private readonly maxSteps: number) {}

  see(trajs: Trajectory[]): { note?: string; stop?: string } {
    const failures = trajs.filter(envFailed);
    const last = (failures[0]?.envError ?? "").replace(/\s+/g, " ");
    this.inARow = failures.length === trajs.length ? this.inARow + 1 : 0;
    return {
      note: failures.length > 0 ? `${failures.length} of ${trajs.length} rollouts failed on the environment: ${last}` : undefined,
      stop:
        this.maxSteps > 0 && this.inARow >= this.maxSteps
          ? `every rollout failed in ${this.inARow} steps in a row (last: ${last})`
          : undefined,
    };
  }
}
