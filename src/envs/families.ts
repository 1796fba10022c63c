/** AgentGym's environment servers, one entry per family: the request shapes each `agentenv-*` server
 *  takes (its server.py / model.py and its client agentenv/envs/<env>.py, commit 3ef9235), how its
 *  client reads the action out of the model's turn, how it scores an episode, how many tasks it has,
 *  and the instruction turn it opens every episode with. Adding a family is one entry in FAMILIES.
 *
 *  What the servers differ in (and the generic `id` / `env_idx` dialects of before got wrong):
 *  - reset: TextCraft, BabyAI, SciWorld `{id, data_idx}`; ALFWorld `{id, game, world_type}`; SQLGym
 *    `{env_idx, item_id}`; WebShop `{env_idx, session_id}`. A missing field is FastAPI's 422.
 *  - first observation: the reset reply's `observation` (TextCraft, BabyAI), ALFWorld's with
 *    "AVAILABLE ACTIONS: …" after it, SciWorld's `task_description` + observation, and GET
 *    /observation for WebShop and SQLGym (their reset answers `[text, null]`).
 *  - episode score (AgentGym scores the last step's reward, not a sum): TextCraft, ALFWorld, WebShop,
 *    SQLGym the last `reward`; BabyAI and SciWorld the last `score` (BabyAI's success reward is
 *    1 − 0.9·steps/max_steps, below 1; SciWorld's score is 0–100, here divided by 100).
 *  Leaves out: WebArena, the tool environments and LMRL-Gym (not read), AgentGym's function-calling
 *  and code-as-action formats (ReAct only). */
import { AGENTGYM_INSTRUCTIONS } from "./agentgym-prompts.ts";

export type Reply = Record<string, unknown>;

/** An action read from a turn, or the observation the client answers without stepping the server. */
export type ParsedAction = { action: string } | { invalid: string };

export interface Family {
  /** --env_dialect value. */
  name: string;
  /** What GET / answers (for --env_dialect auto); none: only chosen by name. */
  banner?: RegExp;
  /** The field naming the instance in every request after /create. */
  key: "id" | "env_idx";
  /** The reset request's other fields. */
  resetBody(dataIdx: number): Reply;
  /** The first observation in reset's reply; null: ask GET /observation. */
  firstObservation(reply: unknown): string | null;
  /** The observation field of /step replies. */
  stepField: "observation" | "state";
  /** The action the family's client sends for the model's turn. */
  action(turn: string): ParsedAction;
  /** The episode's score after a step (the step's reply; `summed`: the rewards so far) and success. */
  score(reply: Reply, summed: number, done: boolean): { score: number; success: boolean };
  /** How many tasks the server has (data_idx 0 … size−1); `wraps`: larger ones are taken modulo size
   *  (TextCraft), else refused. */
  size?: number;
  wraps?: boolean;
  /** Where its own held-out split starts (SQLGym: BIRD's dev items); default: the upper half. */
  heldOutStart?: number;
  /** The instruction turn and its acknowledgement, before the first observation. */
  instruction?: { instruction: string; ack: string };
}

const text = (v: unknown): string | null => (typeof v === "string" ? v : null);
const num = (v: unknown): number => (typeof v === "number" && Number.isFinite(v) ? v : 0);

/** TextCraft's and BabyAI's client: the one "Action:" (the action may start on the next line), cut
 *  at the end of its line, then only letters, digits, commas and spaces (so "get 1 stick." sends
 *  "get 1 stick"; TextCraft answers "Could not find" to the period). Two "Action:" are refused. */
export function actionLine(turn: string): ParsedAction {
  const found = [...turn.matchAll(/Action:\s*(.*?)(?=\n|$)/gs)].map((m) => m[1]);
  if (found.length > 1) return { invalid: "Error: Only one 'Action' is allowed per response. Please adjust your response." };
  return {
    action: (found[0] ?? "")
      .replace(/[^A-Za-z0-9, ]+/g, "")
      .split(/\s+/)
      .filter(Boolean)
      .join(" "),
  };
}

/** AgentGym's ReAct parser (BaseAdapter.parse_react): everything after the last "Action:", trimmed;
 *  none: "" (WebShop: the whole turn when it holds search[ or click[). */
export function reactAction(turn: string, bare = false): ParsedAction {
  const at = turn.lastIndexOf("Action:");
  if (at < 0) return { action: bare && /search\[|click\[/.test(turn) ? turn.trim() : "" };
  return { action: turn.slice(at + "Action:".length).trim() };
}

/** The shipped servers' (guess-number) rule: the first non-empty line after the last "Action:", or
 *  the whole turn when it has none; a trailing period dropped. */
export function genericAction(turn: string): ParsedAction {
  const at = turn.lastIndexOf("Action:");
  const rest = at < 0 ? turn : turn.slice(at + "Action:".length);
  const line =
    at < 0
      ? rest.trim()
      : (rest
          .split("\n")
          .map((l) => l.trim())
          .find((l) => l !== "") ?? "");
  return { action: line.replace(/\.$/, "").trim() };
}

const lastReward = (r: Reply) => ({ score: num(r.reward), success: num(r.reward) >= 1 });
const summedReward = (_: Reply, summed: number) => ({ score: summed, success: summed >= 1 });

export const FAMILIES: Record<string, Family> = {
  textcraft: {
    name: "textcraft",
    banner: /environment TextCraft/,
    key: "id",
    resetBody: (i) => ({ data_idx: i }),
    firstObservation: (r) => text((r as Reply)?.observation),
    stepField: "observation",
    action: actionLine,
    score: lastReward,
    size: 544,
    wraps: true, // its crafting tree's goals; data_idx wraps modulo 544 (environment.py reset)
    instruction: AGENTGYM_INSTRUCTIONS.textcraft,
  },
  babyai: {
    name: "babyai",
    banner: /environment BabyAI/,
    key: "id",
    resetBody: (i) => ({ data_idx: i }),
    firstObservation: (r) => text((r as Reply)?.observation),
    stepField: "observation",
    action: actionLine,
    // The client reports `score`; an episode ends (done) only when its goal is reached (reward > 0.5).
    score: (r, _s, done) => ({ score: Math.min(1, num(r.score)), success: done && num(r.score) > 0 }),
    instruction: AGENTGYM_INSTRUCTIONS.babyai,
  },
  sciworld: {
    name: "sciworld",
    banner: /environment ScienceWorld/,
    key: "id",
    resetBody: (i) => ({ data_idx: i }),
    firstObservation: (r) => {
      const o = r as Reply;
      return text(o?.task_description) !== null && text(o?.observation) !== null ? `${o.task_description}\n${o.observation}` : null;
    },
    stepField: "observation",
    action: (t) => reactAction(t),
    score: (r) => ({ score: num(r.score) / 100, success: num(r.score) >= 100 }),
    instruction: AGENTGYM_INSTRUCTIONS.sciworld,
  },
  alfworld: {
    name: "alfworld",
    banner: /environment AlfWorld/,
    key: "id",
    resetBody: (i) => ({ game: i, world_type: "Text" }),
    firstObservation: (r) => {
      const o = r as Reply;
      const acts = Array.isArray(o?.available_actions) ? o.available_actions.map(String).join(",") : "";
      return text(o?.observation) === null ? null : `${o.observation}\nAVAILABLE ACTIONS: ${acts}`;
    },
    stepField: "observation",
    action: (t) => reactAction(t),
    score: lastReward,
    instruction: AGENTGYM_INSTRUCTIONS.alfworld,
  },
  webshop: {
    name: "webshop",
    key: "env_idx",
    resetBody: (i) => ({ session_id: i }),
    firstObservation: () => null,
    stepField: "state",
    action: (t) => reactAction(t, true),
    score: lastReward,
    instruction: AGENTGYM_INSTRUCTIONS.webshop,
  },
  sqlgym: {
    name: "sqlgym",
    key: "env_idx",
    resetBody: (i) => ({ item_id: i }),
    firstObservation: () => null,
    stepField: "state",
    action: (t) => ({ action: t.split("```sql").at(-1)!.split("```")[0].trim() }),
    score: lastReward,
    size: 10962,
    heldOutStart: 9428, // item_id: BIRD train 0-9427, dev 9428-10961 (environment.py ITEM_RANGE)
    instruction: AGENTGYM_INSTRUCTIONS.sqlgym,
  },
  // The shipped guess-number server (and servers written to its shape): data_idx in reset, the summed
  // reward, success at 1.
  id: {
    name: "id",
    key: "id",
    resetBody: (i) => ({ data_idx: i }),
    firstObservation: (r) => (typeof r === "string" ? r : text((r as Reply)?.observation)),
    stepField: "observation",
    action: genericAction,
    score: summedReward,
  },
  env_idx: {
    name: "env_idx",
    key: "env_idx",
    resetBody: (i) => ({ data_idx: i }),
    firstObservation: (r) => (typeof r === "string" ? r : text((r as Reply)?.state)),
    stepField: "state",
    action: genericAction,
    score: summedReward,
  },
};

export const DIALECTS = [...Object.keys(FAMILIES), "auto"] as const;
export type Dialect = string;

/** The family whose banner GET / answered, or null. */
export function familyOfBanner(banner: string): Family | null {
  return Object.values(FAMILIES).find((f) => f.banner?.test(banner)) ?? null;
}
