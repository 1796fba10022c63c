/** The page's run of the tiny preset: SFT warmup → GRPO with the calculator → evaluation of base, SFT,
 *  SFT on its NF4 base and RL → chat. The order of operations is the scripts' (src/run/sft-run.ts,
 *  grpo-run.ts, eval-run.ts), with the preset's settings from the same tables; every piece is src/'s:
 *  data, chat template and tokenizer, model loading, the SFT and GRPO steps, rollouts with the
 *  calculator, rewards, the evaluation and its table. What the page leaves to the scripts: run
 *  folders, locks, checkpoints, resume, metrics files and report.html (the page draws its own charts).
 *  Files live in the page's memory (web/node/fs.ts): the base is put there from the server, the SFT
 *  model and the RL adapter are written there by src/'s savers, and offered for download from there. */
import * as tf from "@tensorflow/tfjs";
import { encodeSftConversations } from "../src/agents/sft.ts";
import { calculatorTool } from "../src/agents/calculator.ts";
import { systemPromptFor, toPrompt, checkToolsFit } from "../src/agents/prompts.ts";
import { openRunTools, openTools, type ToolSet } from "../src/agents/toolset.ts";
import type { Task } from "../src/datasets/tasks.ts";
import type { Quantize } from "../src/model/types.ts";
import { TINY_BASE_DIR, TINY_PROBLEMS } from "../src/presets/tiny.ts";
import { prepareEngine, type RolloutEngine } from "../src/rollout/engines/index.ts";
import type { Trajectory } from "../src/rollout/types.ts";
import { ChatSession } from "../src/run/chat.ts";
import { TINY_CHAT_PRESET, CHAT_FLAGS } from "../src/run/chat-flags.ts";
import { loadExamples, loadTrainingData, dataStream } from "../src/run/data.ts";
import { evaluateModel, type EvalProtocol } from "../src/run/eval-run.ts";
import { EVAL_FLAGS, TINY_EVAL_PRESET } from "../src/run/eval-flags.ts";
import { formatEvalTable, formatImprovement, pairedImprovement } from "../src/report/eval-table.ts";
import type { EvalResult } from "../src/run/evaluate.ts";
import { defaultsOf } from "../src/run/flags.ts";
import { GRPO_FLAGS, settleGrpoConfig, TINY_GRPO } from "../src/run/grpo-flags.ts";
import { engineSampling, grpoConfig, grpoRollouts, rolloutsOf, scoreStep, stepMetrics } from "../src/run/grpo-step.ts";
import { toolConfig } from "../src/run/options.ts";
import { openPolicy, savePolicy, trainingPolicy, type Policy } from "../src/run/policy.ts";
import { SFT_FLAGS, TINY_SFT } from "../src/run/sft-flags.ts";
import { grpoStep, noUpdateStats } from "../src/trainer/grpo.ts";
import { AdamW } from "../src/trainer/optimizer.ts";
import { lrAt } from "../src/trainer/schedule.ts";
import { sftMicroBatches, sftStep } from "../src/trainer/sft.ts";
import { Rng } from "../src/util/rng.ts";
import { putFile } from "./node/fs.ts";

export const SFT_DIR = "/outputs/tiny/sft/final";
export const GRPO_DIR = "/outputs/tiny/grpo/final";
export const BASE_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"];

export interface Settings {
  backend: "wasm" | "webgpu";
  sftSteps: number; // the preset's 40 (640 conversations, 16 a step); fewer stop its schedule early, more extend it
  grpoSteps: number; // the preset's 24; the same
  evalSamples: number; // the preset's 200
  grpoQuestions?: number; // questions per GRPO step (the preset's 8): fewer for a slow (software) GPU
  grpoSamples?: number; // rollouts per question (the preset's 8)
}

/** What the page hears while a phase runs (it draws charts and progress from these). */
export interface Events {
  log(line: string): void;
  progress(phase: string, done: number, total: number, extra?: string): void;
  sftStep?(step: number, m: { loss: number; tokens_per_s: number }): void;
  grpoStep?(step: number, m: Record<string, number>, trajs: Trajectory[]): void;
  /** True when the user pressed Stop: checked at every safe point (between steps and batches). */
  stopped(): boolean;
}

export class Stopped extends Error {
  constructor() {
    super("stopped by the user");
  }
}

/** Yield to the browser so the tab stays responsive between steps. */
const breathe = () => new Promise<void>((r) => setTimeout(r, 0));

/** The preset's base, tokenizer and chat template from the page's server into the page's file store,
 *  where src/'s loaders read them (TINY_BASE_DIR, as in Node). */
export async function fetchBase(root = "tiny/"): Promise<void> {
  for (const f of BASE_FILES) {
    const res = await fetch(root + f);
    if (!res.ok) throw new Error(`${root}${f}: HTTP ${res.status} from the page's server`);
    putFile(`${TINY_BASE_DIR}/${f}`, new Uint8Array(await res.arrayBuffer()));
  }
}

export const sftSettings = () => ({ ...defaultsOf(SFT_FLAGS), ...TINY_SFT, preset: "tiny" });
export const grpoSettings = (s: Settings) =>
  settleGrpoConfig(
    {
      ...defaultsOf(GRPO_FLAGS),
      ...TINY_GRPO,
      preset: "tiny",
      model_path: SFT_DIR,
      max_steps: Math.max(TINY_GRPO.max_steps!, s.grpoSteps), // the preset's schedule; fewer steps stop it early
      prompts_per_step: s.grpoQuestions ?? TINY_GRPO.prompts_per_step!,
      samples_per_prompt: s.grpoSamples ?? TINY_GRPO.samples_per_prompt!,
      backend: s.backend,
      threads: 1,
      quiet: true,
    },
    null,
  );

/** SFT warmup, as src/run/sft-run.ts: the preset's conversations, its schedule (over `sftSteps`
 *  steps), full fine-tune; the model goes to SFT_DIR. Returns the seconds it took. */
export async function runSftPhase(s: Settings, ev: Events): Promise<number> {
  const t0 = performance.now();
  const cfg = { ...sftSettings(), backend: s.backend, threads: 1 as const };
  const { train: examples } = await loadTrainingData(
    { dataset: cfg.dataset, purpose: "sft", maxSamples: cfg.max_samples, synthetic: TINY_PROBLEMS },
    cfg.eval_samples,
  );
  const policy = await openPolicy(trainingPolicy(cfg, { modelPath: TINY_BASE_DIR, full: true }));
  const { model, tokenizer } = policy;
  const optimizer = new AdamW(model.trainableVariables(), { lr: cfg.learning_rate, weightDecay: cfg.weight_decay });
  const toolSet = await openTools(["calculator"]);
  try {
    const { built, encoded } = await encodeSftConversations(examples, calculatorTool, tokenizer, {
      inlineShare: cfg.inline_share,
      inlineOps: cfg.inline_ops,
      seed: cfg.seed,
      toolsInPrompt: cfg.tools_in_prompt,
      maxLength: cfg.max_length,
    });
    const perStep = cfg.batch_size * cfg.gradient_accumulation_steps;
    const stepsPerEpoch = Math.ceil(encoded.length / perStep);
    // The preset's schedule (one epoch, 40 steps); fewer steps stop it early, more extend it.
    const totalSteps = Math.max(stepsPerEpoch * cfg.num_epochs, s.sftSteps);
    const epochs = Math.ceil(totalSteps / stepsPerEpoch);
    ev.log(`sft: ${encoded.length} conversations, ${s.sftSteps} steps of ${perStep} (schedule over ${totalSteps})`);
    const schedule = { type: cfg.lr_scheduler, lr: cfg.learning_rate, warmupSteps: Math.floor(cfg.warmup_ratio * totalSteps), totalSteps };
    const rng = new Rng(cfg.seed);
    let step = 0;
    for (let epoch = 0; epoch < epochs && step < s.sftSteps; epoch++) {
      const order = rng.shuffle(encoded.map((_, i) => i));
      for (let k = 0; k < stepsPerEpoch && step < s.sftSteps; k++) {
        if (ev.stopped()) throw new Stopped();
        const tStep = performance.now();
        const rows = order.slice(k * perStep, (k + 1) * perStep);
        const micro = sftMicroBatches(rows, encoded, cfg.batch_size, tokenizer.padTokenId);
        const r = await sftStep(model, optimizer, micro, { lr: lrAt(step, schedule), maxGradNorm: cfg.max_grad_norm });
        step++;
        const seconds = (performance.now() - tStep) / 1000;
        const tokens = micro.reduce((a, b) => a + b.ids.length * b.ids[0].length, 0);
        ev.sftStep?.(step, { loss: r.loss, tokens_per_s: tokens / seconds });
        ev.progress("sft", step, s.sftSteps, `loss ${r.loss.toFixed(3)} · ${Math.round(tokens / seconds)} tokens/s`);
        await breathe();
      }
    }
    await savePolicy(policy, SFT_DIR, true);
  } finally {
    await toolSet.close();
    optimizer.dispose();
    model.dispose();
  }
  return (performance.now() - t0) / 1000;
}

/** GRPO, as src/run/grpo-run.ts: LoRA on the NF4-quantized SFT model, the preset's settings, the
 *  rollout engine the backend's `auto` picks; the adapter goes to GRPO_DIR. Returns the seconds. */
export async function runGrpoPhase(s: Settings, ev: Events): Promise<number> {
  const t0 = performance.now();
  const { cfg, rewardWeights } = grpoSettings(s);
  const { train: examples } = await loadTrainingData(
    { dataset: cfg.dataset, purpose: "rl", maxSamples: cfg.max_samples, synthetic: cfg.synthetic },
    cfg.eval_samples,
  );
  const openEngine = await prepareEngine(cfg, ev.log);
  const toolSet = await openRunTools(toolConfig(cfg), ev.log);
  const policy = await openPolicy(trainingPolicy(cfg, { modelPath: cfg.model_path, adapter: cfg.init_adapter, full: false }));
  const { model, tokenizer } = policy;
  const optimizer = new AdamW(model.trainableVariables(), { lr: cfg.learning_rate, weightDecay: cfg.weight_decay });
  let engine: RolloutEngine | null = null;
  try {
    const tools = toolSet.tools;
    checkToolsFit(tokenizer, model.config.maxPositionEmbeddings, tools, cfg.max_new_tokens, cfg.tools_in_prompt);
    const total = cfg.max_steps;
    const question = dataStream(examples, cfg.seed);
    const questionsOf = (k: number) => Array.from({ length: cfg.prompts_per_step }, (_, i) => question(k * cfg.prompts_per_step + i));
    engine = await openEngine({
      model,
      tokenizer,
      modelDir: policy.base,
      workDir: "/outputs/tiny/grpo",
      tools,
      sampling: engineSampling(cfg),
      log: ev.log,
    });
    ev.log(
      `grpo: ${s.grpoSteps} steps (schedule over ${total}) × ${cfg.prompts_per_step} questions × ` +
        `${cfg.samples_per_prompt} rollouts, engine ${engine.name}`,
    );
    const promptsOf = (k: number) => questionsOf(k).map((ex) => toPrompt(ex.question, systemPromptFor(tools, ex.answerSchema, ex.scorer)));
    const schedule = {
      type: cfg.lr_scheduler,
      lr: cfg.learning_rate,
      warmupSteps: Math.floor(cfg.warmup_ratio * total),
      totalSteps: total,
    };
    for (let step = 0; step < s.grpoSteps; step++) {
      if (ev.stopped()) throw new Stopped();
      const tStep = performance.now();
      const batch = questionsOf(step);
      const rolled = await rolloutsOf(engine, {
        step,
        steps: total,
        batch,
        seed: cfg.seed,
        envs: null,
        samples: cfg.samples_per_prompt,
        promptsOf,
      });
      const rolloutSeconds = (performance.now() - tStep) / 1000;
      const scored = scoreStep(rolled.trajs, batch, { rewardWeights, scale: cfg.scale_rewards });
      const rollouts = grpoRollouts(scored, engine.behaviourLogprobs);
      const tTrain = performance.now();
      const lr = lrAt(step, schedule);
      const st =
        rollouts.length === 0
          ? noUpdateStats(0)
          : await grpoStep(model, optimizer, rollouts, grpoConfig(cfg, lr, tokenizer.padTokenId, engine));
      const trainSeconds = (performance.now() - tTrain) / 1000;
      const seconds = { lr, rolloutSeconds, trainSeconds, stepSeconds: (performance.now() - tStep) / 1000 };
      const m = stepMetrics(scored.trajs, scored.rewards, st, seconds) as Record<string, number>;
      ev.grpoStep?.(step + 1, m, scored.trajs);
      ev.progress(
        "grpo",
        step + 1,
        s.grpoSteps,
        `reward ${Number(m.reward).toFixed(2)} · acc ${Number(m.accuracy).toFixed(2)} · tools ${Number(m.tool_calls).toFixed(2)} · ` +
          `${Math.round(m.rollout_tokens_per_s)} tokens/s`,
      );
      await breathe();
    }
    await savePolicy(policy, GRPO_DIR, false);
  } finally {
    await engine?.close();
    await toolSet.close();
    optimizer.dispose();
    model.dispose();
  }
  return (performance.now() - t0) / 1000;
}

export interface EvalModel {
  name: string;
  modelPath: string;
  quantize: Quantize;
}
/** eval.ts --preset tiny's models: the base, SFT, SFT on the NF4 base RL trains on, and RL. */
export const EVAL_MODELS: EvalModel[] = [
  { name: "base", modelPath: TINY_BASE_DIR, quantize: "none" },
  { name: "sft", modelPath: SFT_DIR, quantize: "none" },
  { name: "sft-nf4", modelPath: SFT_DIR, quantize: "nf4" },
  { name: "rl", modelPath: GRPO_DIR, quantize: "nf4" },
];
/** eval.ts --preset tiny's comparisons (the model, then its baseline). */
export const EVAL_COMPARE: Array<[string, string]> = [
  ["sft", "base"],
  ["rl", "sft"],
  ["rl", "sft-nf4"],
];

export interface EvalOutcome {
  table: string;
  results: Array<{ name: string; result: EvalResult }>;
  seconds: number;
}

/** eval.ts --preset tiny: each model on the held-out questions, greedy, one at a time (src/run's
 *  evaluateModel), then the table and the paired improvements. */
export async function runEvalPhase(s: Settings, ev: Events, models = EVAL_MODELS): Promise<EvalOutcome> {
  const t0 = performance.now();
  const p: EvalProtocol = { ...defaultsOf(EVAL_FLAGS), ...TINY_EVAL_PRESET, backend: s.backend, threads: 1 };
  const examples: Task[] = await loadExamples({
    dataset: "synthetic",
    purpose: "eval",
    maxSamples: s.evalSamples,
    synthetic: TINY_PROBLEMS,
  });
  const toolSet: ToolSet = await openRunTools(toolConfig(p), ev.log);
  const results: Array<{ name: string; result: EvalResult }> = [];
  try {
    for (const m of models) {
      const result = await evaluateModel(
        { name: m.name, modelPath: m.modelPath, quantize: m.quantize },
        examples,
        p,
        (done, total) => {
          if (ev.stopped()) throw new Stopped();
          ev.progress("eval", done, total, m.name);
        },
        { tools: toolSet.tools },
      );
      results.push({ name: m.name, result });
      ev.log(`eval ${m.name}: strict ${result.strict.value.toFixed(3)} [${result.strict.lo.toFixed(3)}, ${result.strict.hi.toFixed(3)}]`);
      await breathe();
    }
  } finally {
    await toolSet.close();
  }
  const byName = new Map(results.map((r) => [r.name, r.result]));
  const lines = [formatEvalTable(results)];
  for (const [a, b] of EVAL_COMPARE)
    if (byName.has(a) && byName.has(b)) lines.push(formatImprovement(a, b, pairedImprovement(byName.get(a)!, byName.get(b)!)));
  return { table: lines.join("\n"), results, seconds: (performance.now() - t0) / 1000 };
}

/** A chat with a trained model (src/run/chat.ts's session, the preset's chat settings). */
export async function openChat(
  s: Settings,
  modelPath = GRPO_DIR,
  quantize: Quantize = "nf4",
): Promise<{ session: ChatSession; policy: Policy; close(): Promise<void> }> {
  const o = { ...defaultsOf(CHAT_FLAGS), ...TINY_CHAT_PRESET };
  const toolSet = await openRunTools(toolConfig(o));
  const policy = await openPolicy({ modelPath, quantize, seed: o.seed, backend: s.backend, threads: 1 });
  const session = new ChatSession(policy.model, policy.tokenizer, { ...o, tools: toolSet.tools });
  return {
    session,
    policy,
    close: async () => {
      await toolSet.close();
      policy.model.dispose();
    },
  };
}

/** Tensors alive, for the page's status line (tfjs memory discipline: it stays flat between phases). */
export const liveTensors = () => tf.memory().numTensors;
