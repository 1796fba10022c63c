/** A flag as a script declares it, one entry of a flag table (run/flags.ts builds the commander
 *  command from the table and types the parsed options), and the value parsers that turn a flag's
 *  text into its value or a one-line UsageError. Here, below every folder that declares flags: the
 *  scripts' tables (run/) and each rollout engine's own (rollout/engines/). */
import { UsageError } from "./errors.ts";

export interface Flag<T> {
  spec: string; // "--max_steps <n>", "--overwrite", "--no-tools_in_prompt"
  help: string;
  parse?: (value: string) => T;
  default?: T; // shown by --help as "(default: …)"
  alias?: string; // an older name still accepted, hidden from --help, e.g. "--total_epochs <n>"
  free?: boolean; // may differ when a run is resumed (step count, saving, output, speed knobs)
  readonly type?: T; // carries T for OptionsOf; never set
}

export type FlagTable = Record<string, Flag<any>>;
export type OptionsOf<F extends FlagTable> = { [K in keyof F]: F[K] extends Flag<infer T> ? T : never };

type Extra = { alias?: string; free?: boolean };

/** A flag with a value and a default. */
export function flag<T>(spec: string, help: string, parse: ((value: string) => T) | undefined, def: T, extra: Extra = {}): Flag<T> {
  return { spec, help, parse, default: def, ...extra };
}

/** A flag with a value and no default: undefined when not given. */
export function optional<T = string>(spec: string, help: string, parse?: (value: string) => T, extra: Extra = {}): Flag<T | undefined> {
  return { spec, help, parse, ...extra };
}

/** A switch: `--x` (false unless given; `def` shown in --help when passed) or `--no-x` (true unless given). */
export function toggle(spec: string, help: string, def?: boolean, extra: Extra = {}): Flag<boolean> {
  return { spec, help, default: def, ...extra };
}

// ---------------------------------------------------------------- value parsers (commander argParser)

function rangeText(min?: number, max?: number): string {
  if (min !== undefined && max !== undefined) return `between ${min} and ${max}`;
  if (min !== undefined) return `>= ${min}`;
  if (max !== undefined) return `<= ${max}`;
  return "any value";
}

/** `--name` as a whole number in [min, max]. Accepts plain decimal integers only ("1e3", "12abc" fail). */
export function parseIntArg(name: string, min?: number, max?: number): (value: string) => number {
  return (value: string) => {
    const v = value.trim();
    const n = /^[+-]?\d+$/.test(v) ? Number(v) : NaN;
    if (!Number.isSafeInteger(n) || (min !== undefined && n < min) || (max !== undefined && n > max))
      throw new UsageError(`--${name} ${JSON.stringify(value)}: expected a whole number ${rangeText(min, max)}`);
    return n;
  };
}

/** `--name` as a finite number in [min, max] ("3e-5", "0.1", "-2" are fine). */
export function parseFloatArg(name: string, min?: number, max?: number): (value: string) => number {
  return (value: string) => {
    const v = value.trim();
    const n = v === "" ? NaN : Number(v);
    if (!Number.isFinite(n) || (min !== undefined && n < min) || (max !== undefined && n > max))
      throw new UsageError(`--${name} ${JSON.stringify(value)}: expected a number ${rangeText(min, max)}`);
    return n;
  };
}

/** `--name` as one of a fixed set of words. */
export function parseChoice<T extends string>(name: string, choices: readonly T[]): (value: string) => T {
  return (value: string) => {
    if (!(choices as readonly string[]).includes(value))
      throw new UsageError(`--${name} ${JSON.stringify(value)}: expected one of ${choices.join(", ")}`);
    return value as T;
  };
}

/** `--name a,b,c` as a list of non-empty items, each one of `allowed` when given. */
export function parseList(name: string, allowed?: readonly string[]): (value: string) => string[] {
  return (value: string) => {
    const items = value.split(",").map((s) => s.trim());
    const what = allowed ? `a comma-separated list of ${allowed.join(", ")}` : "a comma-separated list of non-empty items";
    if (items.some((s) => s === "")) throw new UsageError(`--${name} ${JSON.stringify(value)}: expected ${what}`);
    if (allowed) {
      const bad = items.filter((s) => !allowed.includes(s));
      if (bad.length > 0) throw new UsageError(`--${name} ${JSON.stringify(value)}: unknown ${bad.join(", ")}; expected ${what}`);
    }
    return items;
  };
}
