/** A test's own reward for a GRPO run, registered in the reward table (rollout/rewards.ts) where
 *  --reward_weights finds every component. Random weights never answer right, so every group would
 *  carry no signal: these rewards vary between samples instead. GRPO scores whole rollouts
 *  (rollout/types.ts Trajectory), so a test's reward may read their token ids and indices. Each test
 *  file runs in its own module graph (vitest isolates files), so a registration ends with its file. */
import { REWARD_COMPONENTS } from "../../../src/rollout/rewards.ts";
import type { Trajectory } from "../../../src/rollout/types.ts";

/** Register `reward` as the component `name`; returns the --reward_weights that train on it alone. */
export function registerReward(name: string, reward: (t: Trajectory) => number): string {
  REWARD_COMPONENTS[name] = (r) => reward(r as Trajectory);
  return `${name}=1`;
}

/** The share of even token ids among those the policy sampled. */
export function evenShare(t: Trajectory): number {
  const sampled = t.completionIds.filter((_, i) => t.lossMask[i] === 1);
  return sampled.filter((id) => id % 2 === 0).length / Math.max(1, sampled.length);
}
