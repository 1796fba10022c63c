/** A multi-turn, stateful environment the agent acts in (AgentGym / Gym style): reset to a task gives
 *  the first observation; each assistant turn is one action; step returns the next observation, a
 *  reward, whether the episode is over and the episode's score by the environment's own rule. The
 *  score becomes the rollout's `env` reward component. Implementations: agentgym.ts (HTTP servers).
 *  Leaves out: vectorised stepping. */
import type { Family } from "./families.ts";

export interface StepResult {
  /** The action sent, as the family's parser read it from the turn ("" when the turn had none). */
  action: string;
  observation: string;
  reward: number;
  done: boolean;
  /** The episode's score so far by its family's rule (families.ts), and whether that is a success. */
  score: number;
  success: boolean;
}

export interface Environment {
  /** Start the episode for task `dataIdx`; resolves to the first observation. */
  reset(dataIdx: number): Promise<string>;
  /** One assistant turn (the whole text): the environment's client reads the action out of it. */
  step(turn: string): Promise<StepResult>;
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
  /** The server's family (request shapes, action format, scoring, instruction); absent: generic. */
  family?: Family;
  create(): Promise<Environment>;
}

/** An environment's failure (HTTP error, time-out, malformed reply): it ends that rollout only. */
export class EnvError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "EnvError";
  }
}
