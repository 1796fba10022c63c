/** Audit log of rollouts: one JSONL line per trajectory with the decoded prompt and completion text,
 *  the token ids, loss mask and sampling log-probs, so any training sample can be read back exactly.
 *  Appended per step, like metrics.jsonl (util/jsonl.ts keeps it fit to continue after a crash or on
 *  resume). Leaves out: rotation and compression. */
import { promises as fs } from "node:fs";
import type { Tokenizer } from "../model/types.ts";
import { openStepLog } from "../util/jsonl.ts";
import type { Trajectory } from "./types.ts";

export interface TrajectoryRecord {
  step: number;
  promptIndex: number;
  sampleIndex: number;
  promptText: string;
  completionText: string;
  finishReason: Trajectory["finishReason"];
  truncated: boolean;
  reward: number | null;
  rewardComponents: Record<string, number> | null;
  numToolCalls: number;
  numToolErrors: number;
  numParseErrors: number;
  finalText: string;
  turns: Trajectory["turns"];
  promptIds: number[];
  completionIds: number[];
  lossMask: number[];
  sampleLogprobs: number[];
  [extra: string]: unknown;
}

export function trajectoryRecord(step: number, t: Trajectory, tokenizer: Tokenizer, extra?: Record<string, unknown>): TrajectoryRecord {
  return {
    step,
    promptIndex: t.promptIndex,
    sampleIndex: t.sampleIndex,
    ...extra,
    promptText: tokenizer.decode(t.promptIds),
    completionText: tokenizer.decode(t.completionIds),
    finishReason: t.finishReason,
    truncated: t.truncated,
    reward: t.reward ?? null,
    rewardComponents: t.rewardComponents ?? null,
    numToolCalls: t.numToolCalls,
    numToolErrors: t.numToolErrors,
    numParseErrors: t.numParseErrors,
    ...(t.envReward !== undefined ? { envReward: t.envReward } : {}),
    ...(t.envSuccess !== undefined ? { envSuccess: t.envSuccess } : {}),
    ...(t.envError !== undefined ? { envError: t.envError } : {}),
    finalText: t.finalText,
    turns: t.turns,
    promptIds: t.promptIds,
    completionIds: t.completionIds,
    lossMask: t.lossMask,
    sampleLogprobs: t.sampleLogprobs,
  };
}

/** trajectories.jsonl of a run: each step's lines appended in one write (the file is never rewritten
 *  per step). Opening it cuts a torn last line and, on resume, the steps after the checkpoint. */
export class TrajectoryLog {
  constructor(
    readonly file: string,
    opts: { resumeStep?: number } = {},
  ) {
    openStepLog(file, opts);
  }

  /** One line per trajectory. `extra` fields go on every line (e.g. the question id or the gold answer). */
  async append(step: number, trajectories: Trajectory[], tokenizer: Tokenizer, extra?: Record<string, unknown>): Promise<void> {
    if (!Number.isInteger(step) || step < 0) throw new Error(`step ${step} is invalid; accepted: an integer >= 0`);
    const lines = trajectories.map((t) => JSON.stringify(trajectoryRecord(step, t, tokenizer, extra)) + "\n").join("");
    await fs.appendFile(this.file, lines);
  }
}
