/** Group-relative advantages for GRPO: each rollout's reward against the other rollouts of the same
 *  question. Pure numbers in, numbers out; no tensors. Leaves out reward shaping (rollout/rewards). */
import { mean } from "./stats.ts";

/** A_i = (r_i − mean r) / (std r + eps) per group, or r_i − mean r with scale "none" (Dr. GRPO).
 *  std is torch's default, the unbiased one (÷ n−1), as TRL uses. A group whose rewards are all equal
 *  gets zeros: it carries no signal. A group of one rollout also gets [0] (nothing to compare against;
 *  torch would give NaN). */
export function groupAdvantages(rewards: number[][], scale: "group" | "none", eps = 1e-4): number[][] {
  if (scale !== "group" && scale !== "none") throw new Error(`scale "${scale}" is not one of "group", "none"`);
  return rewards.map((group, gi) => {
    if (group.length === 0) throw new Error(`reward group ${gi} is empty; each group needs at least one reward`);
    group.forEach((r, i) => {
      if (!Number.isFinite(r)) throw new Error(`reward ${gi}.${i} is ${r}; rewards must be finite numbers`);
    });
    // Said explicitly: a float mean of equal numbers need not equal them (0.1·3/3), which would leave
    // tiny nonzero advantages blown up by a tiny std.
    if (!groupHasSignal(group)) return group.map(() => 0);
    const mu = mean(group);
    const sd = Math.sqrt(group.reduce((s, r) => s + (r - mu) ** 2, 0) / (group.length - 1));
    return group.map((r) => (scale === "group" ? (r - mu) / (sd + eps) : r - mu));
  });
}

/** groupAdvantages over the rollouts marked `counted` only; the others get 0 and leave the group's
 *  mean and std alone. A rollout the environment failed (env_error) is neither the policy's success
 *  nor its fault, so it must not make its siblings look better. With every rollout counted this is
 *  groupAdvantages. */
export function countedGroupAdvantages(rewards: number[][], counted: boolean[][], scale: "group" | "none", eps = 1e-4): number[][] {
  return rewards.map((group, gi) => {
    const idx = group.map((_, i) => i).filter((i) => counted[gi][i]);
    const out = group.map(() => 0);
    if (idx.length === 0) return out;
    const a = groupAdvantages([idx.map((i) => group[i])], scale, eps)[0];
    idx.forEach((i, k) => (out[i] = a[k]));
    return out;
  });
}

/** Whether a group can move the policy at all: false when every reward is the same. */
export function groupHasSignal(rewards: number[]): boolean {
  return rewards.some((r) => r !== rewards[0]);
}
