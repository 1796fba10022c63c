/** Learning-rate schedules with linear warmup, as transformers' get_constant_schedule_with_warmup,
 *  get_linear_schedule_with_warmup and get_cosine_schedule_with_warmup (num_cycles 0.5) compute them.
 *  A pure function of the step, so a resumed run needs only the step count. */

export const SCHEDULES = ["constant", "linear", "cosine"] as const;
export type ScheduleType = (typeof SCHEDULES)[number];

export interface ScheduleConfig {
  type: ScheduleType;
  lr: number; // peak learning rate
  warmupSteps: number;
  totalSteps: number; // training steps; linear and cosine reach 0 here
}

/** Multiplier of the peak lr for the update at `step` (0-based: the first optimizer step is step 0,
 *  as in transformers, where scheduler.step() follows optimizer.step()). Note the first warmup step
 *  has lr 0, as there. */
export function lrLambda(step: number, cfg: Omit<ScheduleConfig, "lr">): number {
  if (!SCHEDULES.includes(cfg.type)) throw new Error(`schedule "${cfg.type}" is not one of ${SCHEDULES.join(", ")}`);
  if (!(Number.isInteger(step) && step >= 0)) throw new Error(`step ${step} must be a non-negative integer`);
  if (!(Number.isInteger(cfg.warmupSteps) && cfg.warmupSteps >= 0))
    throw new Error(`warmupSteps ${cfg.warmupSteps} must be a non-negative integer`);
  if (cfg.type !== "constant" && !(Number.isInteger(cfg.totalSteps) && cfg.totalSteps > 0))
    throw new Error(`totalSteps ${cfg.totalSteps} must be a positive integer for the ${cfg.type} schedule`);
  const w = cfg.warmupSteps;
  if (step < w) return step / Math.max(1, w);
  if (cfg.type === "constant") return 1;
  if (cfg.type === "linear") return Math.max(0, (cfg.totalSteps - step) / Math.max(1, cfg.totalSteps - w));
  const progress = (step - w) / Math.max(1, cfg.totalSteps - w);
  return Math.max(0, 0.5 * (1 + Math.cos(Math.PI * progress))); // 2·num_cycles = 1
}

/** The learning rate for the update at `step`. */
export function lrAt(step: number, cfg: ScheduleConfig): number {
  if (!(cfg.lr >= 0 && Number.isFinite(cfg.lr))) throw new Error(`lr ${cfg.lr} must be a finite number ≥ 0`);
  return cfg.lr * lrLambda(step, cfg);
}
