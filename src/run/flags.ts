/** Flags are the config. A script's flags are one table (`FlagTable`): each entry is the flag, its help
 *  line, its parser and its default. The same table builds the commander command (so `--help` lists it)
 *  and types the parsed options (`OptionsOf`), and those options are the run's configuration as they
 *  are: run.json holds them under the flag names, and a resumed run compares them (less the entries
 *  marked `free`). Adding a flag is one entry. The entry's shape and the value parsers are util/flag.ts. */
import { Command, CommanderError, Option } from "commander";
import { UsageError } from "../util/errors.ts";
import type { FlagTable, OptionsOf } from "../util/flag.ts";

export { flag, optional, toggle, type Flag, type FlagTable, type OptionsOf } from "../util/flag.ts";

/** Add a table's flags to a command, in table order. Each key must be the name commander stores the
 *  flag under (--model_path → model_path, --no-tools_in_prompt → tools_in_prompt). */
export function addFlags(cmd: Command, table: FlagTable): Command {
  for (const [key, f] of Object.entries(table)) {
    const opt = new Option(f.spec, f.help);
    if (opt.attributeName() !== key) throw new Error(`flag table key ${key} does not match ${f.spec} (${opt.attributeName()})`);
    if (f.parse) opt.argParser(f.parse);
    if (f.default !== undefined) opt.default(f.default);
    cmd.addOption(opt);
    if (f.alias) {
      const alias = new Option(f.alias).hideHelp();
      if (f.parse) alias.argParser(f.parse);
      cmd.addOption(alias);
    }
  }
  return cmd;
}

/** A script's command: name, description, flags. Errors are thrown (parseFlags turns them into
 *  UsageError) rather than printed, so the script prints one line and exits 2. */
export function commandOf(name: string, description: string, table: FlagTable): Command {
  const cmd = new Command()
    .name(name)
    .description(description)
    .exitOverride()
    .configureOutput({ outputError: () => {} });
  return addFlags(cmd, table);
}

/** Parse argv into the table's options: commander errors become UsageError, --help exits 0, an alias
 *  given on the command line sets its flag, and a preset fills every flag the user did not give
 *  (commander's value source tells which), so explicit flags always win. */
export function parseFlags<F extends FlagTable, P extends string>(
  cmd: Command,
  table: F,
  argv: string[],
  presets: Partial<Record<P, Partial<OptionsOf<F>>>> = {},
): { preset: P | undefined; o: OptionsOf<F>; explicit: (key: string) => boolean } {
  try {
    cmd.parse(argv);
  } catch (err) {
    if (err instanceof CommanderError) {
      if (err.exitCode === 0) process.exit(0); // --help
      throw new UsageError(err.message.replace(/^error: /, ""));
    }
    throw err;
  }
  const given = (k: string) => !["default", undefined].includes(cmd.getOptionValueSource(k));
  for (const [key, f] of Object.entries(table)) {
    if (!f.alias) continue;
    const aliasKey = new Option(f.alias).attributeName();
    if (given(aliasKey)) {
      if (given(key)) throw new UsageError(`${f.alias.split(" ")[0]} is the older name of ${f.spec.split(" ")[0]}: give one of them`);
      cmd.setOptionValueWithSource(key, cmd.getOptionValue(aliasKey), "cli");
    }
  }
  const preset = cmd.getOptionValue("preset") as P | undefined;
  const values = preset ? presets[preset] : undefined;
  if (values) applyPreset(cmd, values);
  const o = { ...cmd.opts() };
  for (const f of Object.values(table)) if (f.alias) delete o[new Option(f.alias).attributeName()];
  return { preset, o: o as OptionsOf<F>, explicit: given };
}

/** Set every option still at its default to the preset's value. Unknown keys are a programming error. */
export function applyPreset(cmd: Command, values: Record<string, unknown>): void {
  const known = new Set(cmd.options.map((o: Option) => o.attributeName()));
  for (const [name, value] of Object.entries(values)) {
    if (!known.has(name)) throw new Error(`preset sets unknown option ${name}`);
    const source = cmd.getOptionValueSource(name);
    if (source === undefined || source === "default") cmd.setOptionValueWithSource(name, value, "config");
  }
}

/** The part of a run's options a resumed run must share with the run it continues: every flag not
 *  marked `free`. Keys outside the table (values the run adds) are left out too. */
export function runIdentity<F extends FlagTable>(table: F, o: Partial<OptionsOf<F>>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, f] of Object.entries(table)) if (!f.free && key in o) out[key] = (o as Record<string, unknown>)[key];
  return out;
}

/** Run `fn`, turning its error into a UsageError about `flag` (a flag's value checked past parsing). */
export function usage<T>(flag: string, fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    throw new UsageError(`${flag}: ${(err as Error).message}`);
  }
}

/** The options a command line with no flags gives: what a program calling a run starts from. */
export function defaultsOf<F extends FlagTable>(table: F): OptionsOf<F> {
  const out: Record<string, unknown> = {};
  for (const [key, f] of Object.entries(table)) out[key] = f.default ?? (/^--no-/.test(f.spec) ? true : undefined);
  return out as OptionsOf<F>;
}

/** A rollout's turn budget from a run's flags (snake_case) in the rollout's names: the one mapping
 *  GRPO, its closing evaluation, eval, SFT's evaluation and chat use. */
export function turnSettings(f: { max_new_tokens: number; max_turns: number; tools_in_prompt: boolean }): {
  maxNewTokens: number;
  maxTurns: number;
  toolsInPrompt: boolean;
} {
  return { maxNewTokens: f.max_new_tokens, maxTurns: f.max_turns, toolsInPrompt: f.tools_in_prompt };
}

/** How a run samples its rollouts, from its flags, in the rollout's names. */
export function samplingSettings(f: { samples_per_prompt: number; temperature: number; top_p: number; top_k: number }): {
  samplesPerPrompt: number;
  temperature: number;
  topP: number;
  topK: number;
} {
  return { samplesPerPrompt: f.samples_per_prompt, temperature: f.temperature, topP: f.top_p, topK: f.top_k };
}
