/** One step's environments: for B tasks × G samples, B·G server instances created and reset in
 *  parallel, and each task's first observation (the same for its G instances: tasks are seeded); the
 *  episode's opening messages; the --env server opened by family with a probe that does one real
 *  reset; task ranges checked against the family's size. Used by the GRPO and eval runs with --env.
 *  Leaves out: reusing instances across steps, retrying a failed create or reset. */
import { toPrompt } from "../agents/prompts.ts";
import { UsageError } from "../util/errors.ts";
import type { Task } from "../datasets/tasks.ts";
import type { ChatMessage } from "../model/types.ts";
import { agentGymEnvironments, serverBanner } from "./agentgym.ts";
import { FAMILIES, familyOfBanner, type Dialect, type Family } from "./families.ts";
import { failedEnvironment, type Environment, type EnvironmentFactory } from "./types.ts";

/** The system prompt of the generic dialects (the shipped guess-number server), whose servers bring
 *  no instruction of their own. */
export const ENV_SYSTEM_PROMPT =
  'You act in an environment. Read each observation and answer with one action, on a last line "Action: <action>".';

/** An episode's opening messages: AgentGym's own for its families (its instruction turn, the
 *  assistant's acknowledgement, then the first observation, no system message: AgentGym's
 *  conversation_start), else ENV_SYSTEM_PROMPT and the observation. */
export function episodePrompt(factory: EnvironmentFactory, observation: string): ChatMessage[] {
  const ins = factory.family?.instruction;
  if (!ins) return toPrompt(observation, ENV_SYSTEM_PROMPT);
  return [
    { role: "user", content: ins.instruction },
    { role: "assistant", content: ins.ack },
    { role: "user", content: observation },
  ];
}

/** Tasks for the given data_idx values: the id holds the index (the server has the task). */
export function environmentTasks(idxs: number[]): Task[] {
  return idxs.map((i) => ({ id: String(i), question: `task ${i}`, answer: "", gold: "" }));
}

/** Where held-out data_idx start by default: GRPO's held-out evaluation and eval.ts --env use data_idx
 *  1000 on, so neither scores a model on the tasks GRPO trains on by default (0 to --max_samples - 1).
 *  A family with fewer tasks (TextCraft: 544, and it wraps larger data_idx onto them) holds out its
 *  upper half instead (heldOutStart). */
export const HELD_OUT_START = 1000;

/** The first held-out data_idx for a server with `size` tasks (undefined: unknown, unbounded). */
export function heldOutStart(size: number | undefined): number {
  return size !== undefined && size < 2 * HELD_OUT_START ? Math.floor(size / 2) : HELD_OUT_START;
}

/** The default task ranges: GRPO trains on 0…maxSamples−1 (never into the held-out part) and holds
 *  out the family's own split, else heldOutStart, on (1,000 of them at most); eval.ts evaluates
 *  maxSamples from there. */
export function defaultTaskRanges(family: Family | undefined, maxSamples: number): { train: string; heldOut: string; evaluate: string } {
  const size = family?.size;
  const start = family?.heldOutStart ?? heldOutStart(size);
  const end = Math.min(start + 999, (size ?? Infinity) - 1);
  return {
    train: `0-${Math.max(0, Math.min(maxSamples, start) - 1)}`,
    heldOut: `${start}-${end}`,
    evaluate: `${start}-${Math.max(start, Math.min(start + maxSamples - 1, end))}`,
  };
}

/** Ranges past the family's size are a usage error: the server would wrap them onto other tasks
 *  (TextCraft) or refuse them, and a held-out task could be a training task in disguise. */
export function checkTaskRange(family: Family | undefined, flag: string, spec: string): void {
  if (family?.size === undefined) return;
  const past = expandRanges(spec).filter((i) => i >= family.size!);
  if (past.length > 0)
    throw new UsageError(
      `${flag} ${spec}: the ${family.name} server has ${family.size} tasks (data_idx ` +
        `0-${family.size - 1}); data_idx ${formatRanges(past)} ` +
        (family.wraps ? `would repeat tasks ${past[0] % family.size}… (it wraps them modulo ${family.size})` : "are past its last"),
    );
}
const MAX_TASKS = 1_000_000;

/** data_idx ranges as `0-99,200-249,300` → the indices, in order, each once. */
export function expandRanges(spec: string): number[] {
  const seen = new Set<number>();
  for (const part of spec.split(",")) {
    const [a, b = a] = part.trim().split("-").map(Number);
    for (let i = a; i <= b; i++) seen.add(i);
  }
  return [...seen];
}

/** Indices as their shortest range list (`0-99,200-249`). */
export function formatRanges(idxs: number[]): string {
  const sorted = [...new Set(idxs)].sort((x, y) => x - y);
  const parts: string[] = [];
  for (let k = 0; k < sorted.length;) {
    let e = k;
    while (e + 1 < sorted.length && sorted[e + 1] === sorted[e] + 1) e++;
    parts.push(sorted[k] === sorted[e] ? String(sorted[k]) : `${sorted[k]}-${sorted[e]}`);
    k = e + 1;
  }
  return parts.join(",");
}

/** Flag parser for data_idx ranges: checks the syntax and returns the list normalised. */
export function parseTaskRanges(name: string): (value: string) => string {
  return (value: string) => {
    const bad = (why: string) =>
      new UsageError(
        `--${name} ${JSON.stringify(value)}: ${why}; expected data_idx ranges like 0-99,200-249 (whole numbers >= 0, start <= end)`,
      );
    let total = 0;
    for (const part of value.split(",")) {
      const m = /^\s*(\d+)(?:\s*-\s*(\d+))?\s*$/.exec(part);
      if (!m) throw bad(`${JSON.stringify(part)} is not a number or a range`);
      const a = Number(m[1]);
      const b = m[2] === undefined ? a : Number(m[2]);
      if (a > b) throw bad(`${part.trim()} ends before it starts`);
      total += b - a + 1;
      if (total > MAX_TASKS) throw bad(`more than ${MAX_TASKS} tasks`);
    }
    return formatRanges(expandRanges(value));
  };
}

export interface Episodes {
  /** envs[p·G + g]; a row whose instance could not be created or reset holds a failedEnvironment. */
  envs: Environment[];
  /** Per task: its first observation (a placeholder when none of its G instances started). */
  observations: string[];
  /** How many rows failed to start. */
  failed: number;
  close(): Promise<void>;
}

/** Create and reset every row's instance, each on its own: a create or reset that fails (an HTTP
 *  error, a malformed reply, the client's time limit) fails that row only, whose rollout then ends at
 *  once with env_error. A task whose started instances disagree on the first observation is a broken
 *  server (tasks must be seeded by data_idx), not a passing failure: that throws. */
export async function openEpisodes(factory: EnvironmentFactory, dataIdxs: number[], G: number): Promise<Episodes> {
  const started: Environment[] = [];
  const close = async () => void (await Promise.allSettled(started.map((e) => e.close())));
  const rows = await Promise.all(
    dataIdxs.flatMap((idx) =>
      Array.from({ length: G }, async (): Promise<{ env: Environment; observation?: string }> => {
        try {
          const env = await factory.create();
          started.push(env);
          return { env, observation: await env.reset(idx) };
        } catch (err) {
          return { env: failedEnvironment((err as Error).message) };
        }
      }),
    ),
  );
  try {
    const observations = dataIdxs.map((idx, p) => {
      const firsts = rows.slice(p * G, (p + 1) * G).flatMap((r) => (r.observation === undefined ? [] : [r.observation]));
      if (firsts.some((o) => o !== firsts[0]))
        throw new Error(
          `environment ${factory.label}: task ${idx} gave ${G} different first observations; its tasks must be seeded by data_idx`,
        );
      return firsts[0] ?? `(task ${idx}: the environment did not start)`;
    });
    return { envs: rows.map((r) => r.env), observations, failed: rows.filter((r) => r.env.failure !== undefined).length, close };
  } catch (err) {
    await close();
    throw err;
  }
}

/** --env URL and --env_dialect as a factory, checked by one real episode start (create, reset to
 *  `probeIdx`, close): a server that does not answer, or does not take the family's request shapes,
 *  is a usage error before anything is written, naming the field the server wanted. "auto" picks the
 *  family from the server's GET / banner (TextCraft, BabyAI, SciWorld, ALFWorld name themselves),
 *  else the generic `id` dialect. */
export async function openEnvironmentServer(
  url: string,
  o: { dialect: Dialect; timeoutMs: number; maxChars: number; probeIdx?: number },
): Promise<EnvironmentFactory> {
  if (!/^https?:\/\/[^/]/.test(url)) throw new UsageError(`--env ${url}: expected an http(s) URL of an AgentGym environment server`);
  let family = Object.hasOwn(FAMILIES, o.dialect) ? FAMILIES[o.dialect] : undefined;
  if (o.dialect === "auto") {
    const banner = await serverBanner(url, o.timeoutMs).catch((err: Error) => {
      throw new UsageError(`--env ${url}: ${err.message} (is the server running?)`);
    });
    family = familyOfBanner(banner) ?? FAMILIES.id;
  }
  if (!family) throw new UsageError(`--env_dialect ${o.dialect}: expected one of ${Object.keys(FAMILIES).join(", ")}, auto`);
  const factory = agentGymEnvironments(url, { family, timeoutMs: o.timeoutMs, maxChars: o.maxChars });
  let env: Environment | null = null;
  try {
    env = await factory.create();
    await env.reset(o.probeIdx ?? 0);
  } catch (err) {
    throw new UsageError(
      `--env ${url}: ${(err as Error).message} (is the server running, and is --env_dialect ` +
        `${family.name}${o.dialect === "auto" ? ", picked from its banner," : ""} its family?)`,
    );
  } finally {
    await env?.close();
  }
  return factory;
}
