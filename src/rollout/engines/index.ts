/** The rollout engines, keyed by --rollout_engine (verl's _ROLLOUT_REGISTRY): adding an engine is a
 *  file beside this one and a row here, or `registerRolloutEngine(def)` from outside the project.
 *  The scripts that take --rollout_engine (GRPO, eval, chat) list every engine in its help and take
 *  every engine's flags: a table is merged once (`withEngineFlags`) and follows later registrations. */
import { UsageError } from "../../util/errors.ts";
import { flag, parseChoice, type Flag, type FlagTable } from "../../util/flag.ts";
import { llamaEngine } from "./llama.ts";
import { localEngine } from "./local.ts";
import { openaiEngine } from "./openai.ts";
import { autoEngine, webgpuEngine } from "./webgpu.ts";
import type { EngineContext, EngineFlags, EngineFlagTable, RolloutEngine, RolloutEngineDef } from "./types.ts";

const BUILTIN = [autoEngine, localEngine, webgpuEngine, openaiEngine, llamaEngine] as const;

/** The table, in --help's order. */
export const ROLLOUT_ENGINES = new Map<string, RolloutEngineDef<any>>(BUILTIN.map((e) => [e.name, e]));
export type RolloutEngineName = (typeof BUILTIN)[number]["name"];
/** The names --rollout_engine accepts (live: a registered engine is added). */
export const ROLLOUT_ENGINE_NAMES: string[] = [...ROLLOUT_ENGINES.keys()];

export { EngineError, defineRolloutEngine } from "./types.ts";
export type { EngineContext, EngineFlags, RolloutEngine, RolloutEngineDef, StepRequest, StepRollouts } from "./types.ts";

/** The built-in engines' flags, typed (what a script's options hold). */
type BuiltinFlags = typeof llamaEngine.flags & typeof openaiEngine.flags;

/** The script tables that take every engine's flags, and whether each takes the training ones. */
const merged: { table: FlagTable; training: boolean }[] = [];

/** --rollout_engine, its help `intro` (what the engine generates in this script) followed by every
 *  engine of the table with its words. */
export function rolloutEngineFlag(intro: string): Flag<string> {
  const f = flag("--rollout_engine <kind>", "", parseChoice("rollout_engine", ROLLOUT_ENGINE_NAMES), "auto", { free: true });
  return Object.defineProperty(f, "help", {
    get: () => {
      const words = [...ROLLOUT_ENGINES.values()].map((e) => e.help);
      return `${intro}: ${words.slice(0, -1).join(", ")} or ${words[words.length - 1]}`;
    },
  });
}

/** A script's flag table with every engine's flags added (GRPO's: `training` ones too); an engine
 *  registered later adds its flags to it then. */
export function withEngineFlags<F extends FlagTable>(table: F, o: { training: boolean }): F & BuiltinFlags {
  merged.push({ table, training: o.training });
  for (const e of ROLLOUT_ENGINES.values()) addFlags(table, e.flags, o.training);
  return table as F & BuiltinFlags;
}

function addFlags(table: FlagTable, flags: EngineFlagTable, training: boolean): void {
  for (const [key, f] of Object.entries(flags)) if (training || !f.training) table[key] = f;
}

/** Adds an engine to the table: `--rollout_engine <def.name>` opens it, and its flags join the
 *  scripts' (GRPO, eval, chat). Its name and flag names must be new. */
export function registerRolloutEngine(def: RolloutEngineDef<any>): void {
  if (!/^[a-z][\w-]*$/.test(def.name)) throw new Error(`rollout engine name ${JSON.stringify(def.name)}: expected a lowercase word`);
  if (ROLLOUT_ENGINES.has(def.name)) throw new Error(`rollout engine ${def.name} is registered already`);
  for (const key of Object.keys(def.flags))
    for (const { table } of merged)
      if (key in table) throw new Error(`rollout engine ${def.name}: flag ${def.flags[key].spec} is a flag of its scripts already`);
  ROLLOUT_ENGINES.set(def.name, def);
  ROLLOUT_ENGINE_NAMES.push(def.name);
  for (const m of merged) addFlags(m.table, def.flags, m.training);
}

/** Checks the engine's flags, and that what it needs answers or loads, before anything is written;
 *  the function returned opens it on the trainer's model. Its flags absent from `f` take their
 *  defaults; another engine's flags given where they do nothing are refused. */
export async function prepareEngine(f: EngineFlags, log: (line: string) => void): Promise<(ctx: EngineContext) => Promise<RolloutEngine>> {
  const def = ROLLOUT_ENGINES.get(f.rollout_engine);
  if (!def) throw new UsageError(`--rollout_engine ${f.rollout_engine}: expected one of ${ROLLOUT_ENGINE_NAMES.join(", ")}`);
  const withDefaults = (e: RolloutEngineDef<any>) => {
    const o: Record<string, unknown> = { ...f };
    for (const [key, fl] of Object.entries(e.flags as EngineFlagTable)) if (o[key] === undefined) o[key] = fl.default;
    return o;
  };
  for (const other of ROLLOUT_ENGINES.values()) {
    const why = other === def ? null : other.refuseElsewhere?.(withDefaults(other), def.name);
    if (why) throw new UsageError(why);
  }
  return def.prepare(withDefaults(def) as EngineFlags, log);
}
