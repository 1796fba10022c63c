/** One scalar reward per rollout, as a weighted sum of named components; every component is returned
 *  for logging, whatever its weight. Correctness and format come from judgeRollout (scorers.ts), the
 *  same function evaluation uses: the answer is read only in the task's answer schema (`\boxed{}` by
 *  default, the one agents/prompts.ts asks for), so a right number written any other way earns no
 *  correctness and the policy is pushed towards the format the evaluator reads. No length penalty. */
import { judgeRollout, type TaskSpec } from "../datasets/scorers.ts";

/** What scoring needs from a finished rollout (the rollout engine fills it in). */
export interface RolloutForReward {
  finalText: string; // the assistant's last turn (or all of its text): the answer is its last \boxed{}
  numToolCalls: number; // well-formed tool calls that were executed
  numToolErrors: number; // of those, calls whose tool reported an error (e.g. the calculator could not evaluate)
  numParseErrors: number; // malformed <tool_call> blocks (bad JSON, missing name or arguments)
  numUnknownTools?: number; // well-formed calls naming a tool the run does not have
  truncated: boolean; // stopped by the token or turn limit before the model ended its reply
  envReward?: number; // the environment's summed reward, when the rollout ran against one
}

/** A component's value, or undefined when it does not apply to the rollout (then it is not reported). */
type Component = (r: RolloutForReward, task: TaskSpec) => number | undefined;

/** The components, each in [0, 1] except tool_use in [-1, 1]. */
export const REWARD_COMPONENTS: Record<string, Component> = {
  /** The task's scorer on the answer in the task's schema (default: numeric match of the last \boxed{}). */
  correctness: (r, task) => judgeRollout(r, task).correct,
  /** 1 when the rollout is well formed: every <tool_call> parsed and naming a known tool, an answer in
   *  the task's schema is present, and the model ended on its own (not truncated); else 0. */
  format: (r, task) => (judgeRollout(r, task).formatValid ? 1 : 0),
  /** Using the tool, and using it well: 1 for at least one call, minus the fraction of calls that
   *  failed (malformed blocks count as failed calls). 0 without any call. Default weight 0. */
  tool_use: (r) => {
    const attempts = r.numToolCalls + r.numParseErrors;
    if (attempts === 0) return 0;
    return (r.numToolCalls > 0 ? 1 : 0) - (r.numToolErrors + r.numParseErrors) / attempts;
  },
  /** The environment's reward summed over the episode (envs/); only for rollouts run against one. */
  env: (r) => r.envReward,
};

export const DEFAULT_REWARD_WEIGHTS: Record<string, number> = { correctness: 1, format: 0.1, tool_use: 0 };

/** Weighted sum of the components. Unknown weight names are an error (a typo would silently zero a term).
 *  `task` is the gold answer, or the task with its own scorer and answer schema. */
export function scoreRollout(
  r: RolloutForReward,
  task: string | TaskSpec,
  weights: Record<string, number> = DEFAULT_REWARD_WEIGHTS,
): { reward: number; components: Record<string, number> } {
  for (const name of Object.keys(weights)) checkName(name);
  const spec: TaskSpec = typeof task === "string" ? { gold: task } : task;
  const components: Record<string, number> = {};
  let reward = 0;
  for (const [name, fn] of Object.entries(REWARD_COMPONENTS)) {
    const value = fn(r, spec);
    if (value === undefined) continue;
    components[name] = value;
    reward += (weights[name] ?? 0) * value;
  }
  return { reward, components };
}

/** "correctness=1,format=0.1" -> a weight for every component; components not named get weight 0. */
export function parseRewardWeights(spec: string): Record<string, number> {
  const weights: Record<string, number> = Object.fromEntries(Object.keys(REWARD_COMPONENTS).map((n) => [n, 0]));
  const seen = new Set<string>();
  for (const part of spec
    .split(",")
    .map((p) => p.trim())
    .filter(Boolean)) {
    const m = /^([A-Za-z_]+)\s*=\s*(\S+)$/.exec(part);
    if (!m) throw new Error(`reward weight "${part}" is not NAME=NUMBER (e.g. "correctness=1,format=0.1")`);
    const [, name, value] = m;
    checkName(name);
    if (seen.has(name)) throw new Error(`reward weight "${name}" is given twice in "${spec}"`);
    const w = Number(value);
    if (!Number.isFinite(w)) throw new Error(`reward weight ${name}="${value}" is not a finite number`);
    weights[name] = w;
    seen.add(name);
  }
  if (seen.size === 0) throw new Error(`reward weights "${spec}" name no component; expected e.g. "correctness=1,format=0.1"`);
  return weights;
}

function checkName(name: string): void {
  if (!Object.hasOwn(REWARD_COMPONENTS, name))
    throw new Error(`unknown reward component "${name}", expected one of ${Object.keys(REWARD_COMPONENTS).join(", ")}`);
}
