/** One step's environments: for B tasks × G samples, B·G server instances created and reset in
 *  parallel, and each task's first observation (the same for its G instances: tasks are seeded).
 *  Used by the GRPO and eval runs with --env. Leaves out: reusing instances across steps. */
import { UsageError } from "../cli.ts";
import type { Task } from "../datasets/tasks.ts";
import { agentGymEnvironments, type Dialect } from "./agentgym.ts";
import type { Environment, EnvironmentFactory } from "./types.ts";

export const ENV_SYSTEM_PROMPT =
  'You act in an environment. Read each observation and answer with one action, on a last line "Action: <action>".';

/** An environment's first n tasks, data_idx 0..n-1: the id holds the index (the server has the task). */
export function environmentTasks(n: number): Task[] {
  return Array.from({ length: n }, (_, i) => ({ id: String(i), question: `task ${i}`, answer: "", gold: "" }));
}

export interface Episodes {
  envs: Environment[]; // envs[p·G + g]
  observations: string[]; // per task: its first observation
  close(): Promise<void>;
}

export async function openEpisodes(factory: EnvironmentFactory, dataIdxs: number[], G: number): Promise<Episodes> {
  const created = await Promise.allSettled(dataIdxs.flatMap(() => Array.from({ length: G }, () => factory.create())));
  const envs = created.flatMap((c) => (c.status === "fulfilled" ? [c.value] : []));
  const close = async () => void (await Promise.allSettled(envs.map((e) => e.close())));
  try {
    const failed = created.find((c) => c.status === "rejected");
    if (failed) throw (failed as PromiseRejectedResult).reason;
    const firsts = await Promise.all(envs.map((env, i) => env.reset(dataIdxs[Math.floor(i / G)])));
    const observations = dataIdxs.map((idx, p) => {
      const group = firsts.slice(p * G, (p + 1) * G);
      if (group.some((o) => o !== group[0]))
        throw new Error(`environment ${factory.label}: task ${idx} gave ${G} different first observations; its tasks must be seeded by data_idx`);
      return group[0];
    });
    return { envs, observations, close };
  } catch (err) {
    await close();
    throw err;
  }
}

/** --env URL and --env_dialect as a factory, checked by creating and closing one instance: a server
 *  that does not answer is a usage error before anything is written. */
export async function openEnvironmentServer(url: string, o: { dialect: Dialect; timeoutMs: number; maxChars: number }): Promise<EnvironmentFactory> {
  if (!/^https?:\/\/[^/]/.test(url)) throw new UsageError(`--env ${url}: expected an http(s) URL of an AgentGym environment server`);
  const factory = agentGymEnvironments(url, o);
  try {
    const env = await factory.create();
    await env.close();
  } catch (err) {
    throw new UsageError(`--env ${url}: ${(err as Error).message} (is the server running, and is --env_dialect ${o.dialect} its dialect?)`);
  }
  return factory;
}
