/** The rollout engines, keyed by --rollout_engine (verl's _ROLLOUT_REGISTRY): adding an engine is a
 *  file beside this one and a row here. */
import { UsageError } from "../../util/errors.ts";
import { llamaEngine } from "./llama.ts";
import { localEngine } from "./local.ts";
import { openaiEngine } from "./openai.ts";
import { autoEngine, webgpuEngine } from "./webgpu.ts";
import type { EngineContext, EngineFlags, RolloutEngine } from "./types.ts";

export const ROLLOUT_ENGINES = { auto: autoEngine, local: localEngine, webgpu: webgpuEngine, openai: openaiEngine, llama: llamaEngine };
export { resolveEngineName } from "./webgpu.ts";
export type RolloutEngineName = keyof typeof ROLLOUT_ENGINES;
export const ROLLOUT_ENGINE_NAMES = Object.keys(ROLLOUT_ENGINES) as RolloutEngineName[];

export type { EngineContext, EngineFlags, RolloutEngine, StepRequest, StepRollouts } from "./types.ts";

/** Checks the engine's flags, and that what it needs answers or loads, before anything is written;
 *  the function returned opens it on the trainer's model. */
export function prepareEngine(f: EngineFlags, log: (line: string) => void): Promise<(ctx: EngineContext) => Promise<RolloutEngine>> {
  const entry = ROLLOUT_ENGINES[f.rollout_engine as RolloutEngineName];
  if (!entry) throw new UsageError(`--rollout_engine ${f.rollout_engine}: expected one of ${ROLLOUT_ENGINE_NAMES.join(", ")}`);
  return entry.prepare(f, log);
}
