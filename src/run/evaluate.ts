/** Accuracy of a policy on held-out questions: k rollouts per question (greedy when temperature is
 *  0), strict accuracy (the answer in the task's schema, \boxed{} by default, as SFT teaches) and
 *  lenient accuracy (the last number of the final text) separately — most early gains on GSM8K are
 *  format learning — plus pass@k, tool-call statistics and the format validity of the rollouts.
 *  Correct and well formed mean what they mean for the reward: both come from judgeRollout.
 *  Against an environment (--env) each task is an episode: strict = success (the episode's reward
 *  reaches 1, AgentGym's success rate), lenient = any reward, well formed = ended by the environment;
 *  the mean episode reward is reported beside them. */
import * as path from "node:path";
import type { Tool } from "../agents/types.ts";
import { systemPromptFor, toPrompt } from "../agents/prompts.ts";
import type { AnswerSchema } from "../datasets/answer.ts";
import type { Task } from "../datasets/tasks.ts";
import { episodePrompt, openEpisodes } from "../envs/episodes.ts";
import type { EnvironmentFactory } from "../envs/types.ts";
import type { CausalLM, Tokenizer } from "../model/types.ts";
import type { Trajectory } from "../rollout/rollout.ts";
import { localGenerate } from "../rollout/engines/local.ts";
import { byGroup } from "../rollout/episode.ts";
import type { TurnRecord } from "../rollout/types.ts";
import type { RolloutEngine } from "../rollout/engines/types.ts";
import { judgeRollout } from "../datasets/scorers.ts";
import { passAtK, wilsonInterval, type Interval, mean } from "../trainer/stats.ts";
import type { MetricsLogger } from "../trainer/metrics.ts";
import { writeFileAtomic } from "../util/fs.ts";
import { Rng } from "../util/rng.ts";

export interface EvalOptions {
  samplesPerPrompt: number; // k
  temperature: number;
  topP?: number;
  batchSize: number; // questions per rollout batch (×k rows)
  maxNewTokens: number;
  maxTurns: number;
  toolsInPrompt: boolean;
  seed: number;
  /** Default answer schema for tasks that name none (default boxed). */
  answerSchema?: AnswerSchema;
  tools: Tool[];
  /** Roll out against this environment instead: each task's id is its data_idx. */
  envs?: EnvironmentFactory;
  onProgress?: (done: number, total: number) => void;
  /** The rollout engine's generate (rollout/engines/); default: the local engine's, on `model`. */
  generate?: RolloutEngine["generate"];
  /** Stops the evaluation at its next decode step (what is summarized then is partial). */
  signal?: AbortSignal;
}

export interface EvalSample {
  finalText: string;
  text: string; // every assistant turn, with tool results, as a person would read it
  strict: boolean;
  lenient: boolean;
  formatValid: boolean; // every tool call well-formed, a final answer in the strict format, not truncated
  toolCalls: number;
  toolErrors: number;
  parseErrors: number;
  truncated: boolean;
  turns: TurnRecord[]; // the same conversation, structured (the reports draw it)
  envReward?: number; // the episode's summed reward (with an environment)
  envError?: string; // why the environment ended the episode early
}

export interface EvalQuestion {
  id: string;
  question: string;
  gold: string;
  samples: EvalSample[];
}

export interface EvalResult {
  n: number; // questions
  k: number;
  strict: Interval & { correct: number; total: number }; // pass@1 over all n·k samples
  lenient: Interval & { correct: number; total: number };
  passAtK: number; // strict, unbiased estimator
  formatValid: number; // share of samples
  toolCallsPerRollout: number;
  toolErrorRate: number; // failed calls / calls
  truncatedRate: number;
  envReward?: number; // mean episode reward (with an environment)
  envErrorRate?: number; // share of episodes the environment failed (with an environment)
  seconds: number;
  questions: EvalQuestion[];
}

export function transcript(t: Trajectory): string {
  return t.turns
    .map((turn) =>
      [turn.text, ...turn.toolCalls.map((c) => `[${c.name} → ${c.result}]`), ...turn.parseErrors.map((e) => `[parse error: ${e}]`)].join(
        "\n",
      ),
    )
    .join("\n");
}

/** A sample counts as correct when the task's scorer gives it 1. */
export function judge(t: Trajectory, task: Task, defaultSchema: AnswerSchema = "boxed"): EvalSample {
  const j = judgeRollout(t, { ...task, answerSchema: task.answerSchema ?? defaultSchema });
  return {
    finalText: t.finalText,
    text: transcript(t),
    strict: j.correct === 1,
    lenient: j.lenient === 1,
    formatValid: j.formatValid,
    toolCalls: t.numToolCalls,
    toolErrors: t.numToolErrors,
    parseErrors: t.numParseErrors,
    truncated: t.truncated,
    turns: t.turns,
  };
}

/** An episode against an environment: success and score by the environment's own rule (envs/families.ts). */
export function judgeEpisode(t: Trajectory): EvalSample {
  const reward = t.envReward ?? 0;
  return {
    finalText: t.finalText,
    text: t.turns
      .map((turn) => [turn.text, ...(turn.observation !== undefined ? [`[observation → ${turn.observation}]`] : [])].join("\n"))
      .join("\n"),
    strict: t.envSuccess ?? reward >= 1,
    lenient: reward > 0,
    formatValid: t.finishReason === "stop",
    toolCalls: 0,
    toolErrors: 0,
    parseErrors: 0,
    truncated: t.truncated,
    turns: t.turns,
    envReward: reward,
    ...(t.envError ? { envError: t.envError } : {}),
  };
}

export async function evaluate(model: CausalLM, tokenizer: Tokenizer, examples: Task[], o: EvalOptions): Promise<EvalResult> {
  const t0 = Date.now();
  const schema = o.answerSchema ?? "boxed";
  const questions: EvalQuestion[] = [];
  for (let i = 0; i < examples.length && !o.signal?.aborted; i += o.batchSize) {
    const batch = examples.slice(i, i + o.batchSize);
    // With an environment, a task's prompt is its first observation and each row acts in its own instance.
    const episodes = o.envs
      ? await openEpisodes(
          o.envs,
          batch.map((ex) => Number(ex.id)),
          o.samplesPerPrompt,
        )
      : null;
    let trajs: Trajectory[];
    try {
      const prompts = episodes
        ? episodes.observations.map((obs) => episodePrompt(o.envs!, obs))
        : batch.map((ex) => toPrompt(ex.question, systemPromptFor(o.tools, ex.answerSchema ?? schema)));
      const generate = o.generate ?? localGenerate(model, tokenizer);
      trajs = await generate(prompts, {
        samplesPerPrompt: o.samplesPerPrompt,
        maxNewTokens: o.maxNewTokens,
        maxTurns: o.maxTurns,
        temperature: o.temperature,
        topP: o.topP ?? 1,
        topK: 0,
        rng: new Rng(o.seed + i), // per batch: the same question gets the same draws however batches run
        tools: episodes ? [] : o.tools,
        toolsInPrompt: o.toolsInPrompt,
        envs: episodes?.envs,
        signal: o.signal,
      });
    } finally {
      await episodes?.close();
    }
    const groups = byGroup(trajs, batch.length);
    batch.forEach((ex, b) => {
      const samples = groups[b].map((t) => (episodes ? judgeEpisode(t) : judge(t, ex, schema)));
      const question = episodes ? episodes.observations[b] : ex.question;
      questions.push({ id: ex.id, question, gold: ex.gold, samples });
    });
    o.onProgress?.(Math.min(i + o.batchSize, examples.length), examples.length);
  }
  return summarize(questions, o.samplesPerPrompt, (Date.now() - t0) / 1000);
}

export function summarize(questions: EvalQuestion[], k: number, seconds: number): EvalResult {
  const all = questions.flatMap((q) => q.samples);
  const count = (f: (s: EvalSample) => boolean) => all.filter(f).length;
  const strictCorrect = count((s) => s.strict);
  const lenientCorrect = count((s) => s.lenient);
  const calls = all.reduce((a, s) => a + s.toolCalls, 0);
  const errors = all.reduce((a, s) => a + s.toolErrors, 0);
  return {
    n: questions.length,
    k,
    strict: { ...wilsonInterval(strictCorrect, all.length), correct: strictCorrect, total: all.length },
    lenient: { ...wilsonInterval(lenientCorrect, all.length), correct: lenientCorrect, total: all.length },
    passAtK: mean(
      questions.map((q) => passAtK(q.samples.length, q.samples.filter((s) => s.strict).length, Math.min(k, q.samples.length))),
      0,
    ),
    formatValid: all.length ? count((s) => s.formatValid) / all.length : 0,
    toolCallsPerRollout: all.length ? calls / all.length : 0,
    toolErrorRate: calls ? errors / calls : 0,
    truncatedRate: all.length ? count((s) => s.truncated) / all.length : 0,
    ...(all.some((s) => s.envReward !== undefined)
      ? {
          envReward: mean(
            all.map((s) => s.envReward ?? 0),
            0,
          ),
          envErrorRate: mean(
            all.map((s) => (s.envError ? 1 : 0)),
            0,
          ),
        }
      : {}),
    seconds,
    questions,
  };
}

/** One line for logs: `strict 0.412 [0.37, 0.46] | lenient 0.45 | format 0.97 | tools 2.1/rollout`. */
export function formatEvalLine(r: EvalResult): string {
  const pct = (x: number) => x.toFixed(3);
  return (
    `strict ${pct(r.strict.value)} [${pct(r.strict.lo)}, ${pct(r.strict.hi)}] | lenient ${pct(r.lenient.value)} | ` +
    `format ${pct(r.formatValid)} | ` +
    (r.envReward !== undefined
      ? `env reward ${pct(r.envReward)} | env errors ${pct(r.envErrorRate ?? 0)}`
      : `tools ${r.toolCallsPerRollout.toFixed(2)}/rollout | tool errors ${pct(r.toolErrorRate)}`) +
    " | " +
    `n ${r.n}×${r.k} | ${r.seconds.toFixed(1)} s`
  );
}

/** A training run's closing evaluation: greedy on the held-out questions, one log line, the eval_*
 *  metrics at the last step, and eval.json (summary + the first 50 questions) in the run folder.
 *  Stopped by `signal` (Ctrl-C), it records nothing and returns null: a partial evaluation is not
 *  passed off as the run's. */
export async function finalEvaluation(
  model: CausalLM,
  tokenizer: Tokenizer,
  heldOut: Task[],
  o: {
    maxNewTokens: number;
    maxTurns: number;
    toolsInPrompt: boolean;
    seed: number;
    tools: Tool[];
    envs?: EnvironmentFactory;
    generate?: RolloutEngine["generate"];
    signal?: AbortSignal;
    outputDir: string;
    metrics: MetricsLogger;
    step: number;
    log: (line: string) => void;
  },
): Promise<EvalResult | null> {
  if (heldOut.length === 0) return null;
  const r = await evaluate(model, tokenizer, heldOut, {
    samplesPerPrompt: 1,
    temperature: 0,
    batchSize: 64,
    maxNewTokens: o.maxNewTokens,
    maxTurns: o.maxTurns,
    toolsInPrompt: o.toolsInPrompt,
    seed: o.seed,
    tools: o.tools,
    envs: o.envs,
    generate: o.generate,
    signal: o.signal,
  });
  if (o.signal?.aborted) return null;
  o.log(`eval (held-out, greedy): ${formatEvalLine(r)}`);
  o.metrics.log(o.step, {
    eval_accuracy: r.strict.value,
    eval_lenient_accuracy: r.lenient.value,
    eval_format_valid: r.formatValid,
    eval_tool_calls: r.toolCallsPerRollout,
  });
  const { questions, ...summary } = r;
  await writeFileAtomic(
    path.join(o.outputDir, "eval.json"),
    JSON.stringify({ ...summary, samples: questions.slice(0, 50) }, null, 2) + "\n",
  );
  return r;
}
