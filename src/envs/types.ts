/** A multi-turn, stateful environment the agent acts in (AgentGym / Gym style): reset to a task gives
 *  the first observation; each assistant turn is one action; step returns the next observation, a
 *  reward and whether the episode is over. The environment's reward becomes the rollout's `env`
 *  reward component. Implementations: agentgym.ts (HTTP servers). Leaves out: vectorised stepping. */

export interface StepResult {
  observation: string;
  reward: number;
  done: boolean;
}

export interface Environment {
  /** Start the episode for task `dataIdx`; resolves to the first observation. */
  reset(dataIdx: number): Promise<string>;
  step(action: string): Promise<StepResult>;
  close(): Promise<void>;
  /** Set when this row's instance could not be created or reset: its rollout ends at once with
   *  finishReason "env_error" and this message (failedEnvironment). */
  readonly failure?: string;
}

/** Stands in for an instance that could not be created or reset, so the step goes on with the
 *  other rows; the message is cut to 500 characters (it may quote a server's reply). */
export function failedEnvironment(message: string): Environment {
  const failure = message.length > 500 ? message.slice(0, 500) + "…" : message;
  const fail = async (): Promise<never> => {
    throw new EnvError(failure);
  };
  return { failure, reset: fail, step: fail, close: async () => {} };
}

/** Makes one Environment per rollout row (a server instance each). */
export interface EnvironmentFactory {
  /** What the environment is called in messages (its URL). */
  label: string;
  create(): Promise<Environment>;
}

/** An environment's failure (HTTP error, time-out, malformed reply): it ends that rollout only. */
export class EnvError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "EnvError";
  }
}

/** The action in an assistant turn: the text after the last line starting with "Action:" (AgentGym's
 *  ReAct format, "Thought: … Action: …"), or the whole turn when it has no such line; trimmed. */
export function actionOf(turnText: string): string {
  const lines = turnText.split("\n");
  for (let i = lines.length - 1; i >= 0; i--) {
    const m = /^\s*Action:\s*(.*)$/i.exec(lines[i]);
    if (m) return m[1].trim();
  }
  return turnText.trim();
}
