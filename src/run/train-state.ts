/** Optimizer state under names that survive a restart. tfjs variable names are process-global, so
 *  the model suffixes them (`…lora_A.weight#3`); checkpoints store them without the suffix and map
 *  them back onto the variables of the model that resumes. */
import type { AdamW } from "../trainer/optimizer.ts";
import type { OptimizerState } from "../trainer/checkpoint.ts";

const stable = (name: string) => name.replace(/#\d+(?=\.exp_avg(_sq)?$|$)/, "");

export async function exportOptimizer(opt: AdamW): Promise<OptimizerState> {
  const out: OptimizerState = {};
  for (const [k, data] of Object.entries(await opt.exportState())) out[stable(k)] = { shape: [data.length], data };
  return out;
}

export function importOptimizer(opt: AdamW, state: OptimizerState): void {
  const byStable = new Map(opt.variableNames().map((n) => [stable(n), n]));
  const out: Record<string, Float32Array> = {};
  for (const [k, t] of Object.entries(state)) {
    const m = /^(.*?)(\.exp_avg(?:_sq)?)$/.exec(k);
    out[m ? `${byStable.get(m[1]) ?? m[1]}${m[2]}` : k] = t.data;
  }
  opt.importState(out);
}
