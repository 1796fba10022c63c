/** One GRPO step of a fixed shape on random weights, rollouts and update timed apart and the update by
 *  part: what `npm run gpu-check` runs on a GPU and the bench's grpo_step workload on any backend.
 *  Rollouts are the model's prefill and decode loop with the rollout sampler (temperature 1), the
 *  base unpacked as rollouts do; the update is grpoStep with advantages ±1 (random weights earn no
 *  reward, and GRPO skips groups without signal).
 *  Leaves out: the tokenizer, chat template and tools (synthetic prompt ids of the shape's length,
 *  every row sampling newTokens), so rollouts time the model and the sampler only. */
import * as tf from "@tensorflow/tfjs";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { sampleTokens } from "../../src/rollout/sampler.ts";
import { grpoStep, type GrpoRollout, type GrpoSeconds } from "../../src/trainer/grpo.ts";
import { AdamW } from "../../src/trainer/optimizer.ts";
import { Rng } from "../../src/util/rng.ts";
import { registerWorkload, tokenBatch } from "./bench.ts";
import { llamaShapeRollouts, type LlamaShapeOptions } from "./grpo-shape-llama.ts";
import { compiledShapeRollouts } from "./bench-decoder.ts";
import type { Decoder } from "../../src/kernels/webgpu/decode/decoder.ts";

export interface GrpoShape {
  questions: number;
  samples: number; // rollouts per question (the group)
  promptLen: number;
  newTokens: number;
  microBatch: number | "auto";
}

/** The shapes, by bench config: 0.5b is the README's step (4 questions × 8 rollouts × 256 new tokens
 *  after ~220-token prompts, micro-batches sized by --micro_batch_size auto: on wasm 4 rollouts, on a
 *  GPU what fits half its memory); the larger models take the 0.5b's step. */
const STEP: GrpoShape = { questions: 4, samples: 8, promptLen: 220, newTokens: 256, microBatch: "auto" };
export const GRPO_SHAPES: Record<string, GrpoShape> = {
  "0.5b": STEP,
  small: { questions: 2, samples: 2, promptLen: 16, newTokens: 8, microBatch: "auto" },
  "1.5b": STEP,
  "3b": STEP,
  "7b": STEP,
};

export interface GrpoShapeResult {
  rows: number;
  promptTokens: number;
  newTokens: number;
  prefillSeconds: number;
  decodeSeconds: number; // newTokens − 1 decode steps and every draw
  /** The decode steps' draws (part of decodeSeconds; the prefill's draw is part of prefillSeconds):
   *  on a GPU backend each draw's read of the logits waits for the GPU to finish its step. */
  sampleSeconds: number;
  /** Time inside the decode steps' calls (part of decodeSeconds): on a GPU backend the host encoding
   *  the steps' dispatches, which returns before the GPU is done; on wasm the steps themselves; on
   *  the compiled decoder its passes' writing, encoding and submits. */
  stepCallSeconds: number;
  rolloutSeconds: number;
  sampledTokensPerS: number; // rows × newTokens ÷ rolloutSeconds
  updateSeconds: number;
  update: GrpoSeconds;
  /** The micro-batches the update ran in (how many, the rows of the largest). */
  microBatch?: { count: number; rows: number };
  beta: number;
  loss: number;
  tokens: number; // trained tokens
  backend: string;
}

const now = () => performance.now() / 1000;
const round = (x: number) => Math.round(x * 100) / 100;

/** One step of `shape` on `model` (LoRA attached; its adapter is trained by the step). β 0 (GRPO's
 *  default: no KL reference pass) unless given. */
export async function grpoShape(
  model: Qwen2ForCausalLM,
  shape: GrpoShape,
  opts: { beta?: number; llama?: LlamaShapeOptions; update?: boolean; rollouts?: boolean; compiled?: Decoder } = {},
): Promise<GrpoShapeResult & { llama?: Record<string, unknown> }> {
  const s = shape,
    beta = opts.beta ?? 0;
  const rows = s.questions * s.samples;
  const prompts = tokenBatch(s.questions, s.promptLen, model.config.vocabSize, 3).flatMap((p) =>
    Array.from({ length: s.samples }, () => p),
  );
  // Rollouts by another engine than tfjs' path (their behaviour log-probs kept for TIS), the update as below.
  const engineRollouts = opts.llama
    ? await llamaShapeRollouts(model, prompts, s.newTokens, opts.llama)
    : opts.compiled
      ? await compiledShapeRollouts(opts.compiled, prompts, s.newTokens) // drawn inside each pass: no draws apart
      : null;
  if (engineRollouts) {
    const r = engineRollouts;
    const update = opts.update === false ? noUpdate(beta) : await updateOf(model, prompts, r.generated, s, beta, r.logprobs);
    return {
      rows,
      promptTokens: s.promptLen,
      newTokens: s.newTokens,
      prefillSeconds: round(r.prefillSeconds),
      decodeSeconds: round(r.rolloutSeconds - r.prefillSeconds),
      sampleSeconds: 0,
      stepCallSeconds: "hostSeconds" in r ? round(r.hostSeconds) : 0,
      rolloutSeconds: round(r.rolloutSeconds),
      sampledTokensPerS: round((rows * s.newTokens) / r.rolloutSeconds),
      ...update,
      backend: tf.getBackend(),
      ...("info" in r ? { llama: r.info } : {}),
    };
  }
  if (opts.rollouts === false) {
    // the update alone, on random completions of the shape's length (the larger models' rows)
    const generated = tokenBatch(rows, s.newTokens, model.config.vocabSize, 4);
    const update = await updateOf(model, prompts, generated, s, beta);
    const zero = { prefillSeconds: 0, decodeSeconds: 0, sampleSeconds: 0, stepCallSeconds: 0, rolloutSeconds: 0, sampledTokensPerS: 0 };
    return { rows, promptTokens: s.promptLen, newTokens: s.newTokens, ...zero, ...update, backend: tf.getBackend() };
  }
  const rng = new Rng(1);
  const generated: number[][] = prompts.map(() => []);
  let sampleSeconds = 0; // the decode steps' draws
  let stepCallSeconds = 0; // inside decodeStep: on webgpu the host encoding its dispatches, on wasm the step
  let decoding = false;
  const draw = async (lg: tf.Tensor2D) => {
    const t0 = now();
    const { tokens } = await sampleTokens(lg, { temperature: 1 }, rng);
    if (decoding) sampleSeconds += now() - t0;
    tokens.forEach((tok, i) => generated[i].push(tok));
    return tokens;
  };
  const tr = now();
  const release = model.unpackBase({ mergeAdapter: true }); // as rolloutGroups does
  let prefillSeconds = 0;
  try {
    const { logits, cache } = model.prefill(
      prompts,
      prompts.map((r) => r.map(() => 1)),
    );
    let tokens = await draw(logits);
    logits.dispose();
    prefillSeconds = now() - tr;
    decoding = true;
    for (let t = 1; t < s.newTokens; t++) {
      const t0 = now();
      const lg = model.decodeStep(tokens, cache);
      stepCallSeconds += now() - t0;
      tokens = await draw(lg);
      lg.dispose();
    }
    cache.dispose();
  } finally {
    release();
  }
  const rolloutSeconds = now() - tr;
  const update = opts.update === false ? noUpdate(beta) : await updateOf(model, prompts, generated, s, beta);
  return {
    rows,
    promptTokens: s.promptLen,
    newTokens: s.newTokens,
    prefillSeconds: round(prefillSeconds),
    decodeSeconds: round(rolloutSeconds - prefillSeconds),
    sampleSeconds: round(sampleSeconds),
    stepCallSeconds: round(stepCallSeconds),
    rolloutSeconds: round(rolloutSeconds),
    sampledTokensPerS: round((rows * s.newTokens) / rolloutSeconds),
    ...update,
    backend: tf.getBackend(),
  };
}

/** --no_update: the rollouts alone (the update is the same whichever engine sampled). */
const noUpdate = (beta: number) => ({
  updateSeconds: 0,
  update: { reference: 0, old: 0, forward: 0, recompute: 0, backward: 0, optimizer: 0 },
  beta,
  loss: 0,
  tokens: 0,
});

/** The step's update on what was sampled: advantages ±1; with an engine's log-probs, TIS (cap 2). */
async function updateOf(
  model: Qwen2ForCausalLM,
  prompts: number[][],
  generated: number[][],
  s: GrpoShape,
  beta: number,
  behaviour?: number[][],
): Promise<{
  updateSeconds: number;
  update: GrpoSeconds;
  microBatch?: { count: number; rows: number };
  beta: number;
  loss: number;
  tokens: number;
}> {
  const batch: GrpoRollout[] = prompts.map((p, i) => ({
    ids: [...p, ...generated[i]],
    lossMask: [...p.map(() => 0), ...generated[i].map(() => 1)],
    group: Math.floor(i / s.samples),
    advantage: i % 2 ? 1 : -1,
    behaviourLogprobs: behaviour ? [...p.map(() => NaN), ...behaviour[i]] : undefined,
  }));
  const optimizer = new AdamW(model.trainableVariables(), { lr: 1e-5 });
  const tu = now();
  const stats = await grpoStep(model, optimizer, batch, {
    beta,
    epsilon: 0.2,
    epsilonHigh: 0.28,
    lossType: "grpo",
    maxNewTokens: s.newTokens,
    numIterations: 1,
    maxGradNorm: 1,
    lr: 1e-5,
    microBatchSize: s.microBatch,
    tisCap: behaviour ? 2 : 0,
  });
  const updateSeconds = now() - tu;
  optimizer.dispose();
  if (!Number.isFinite(stats.loss)) throw new Error(`the GRPO step's loss is ${stats.loss}`);
  const update = Object.fromEntries(Object.entries(stats.seconds!).map(([k, v]) => [k, round(v)])) as unknown as GrpoSeconds;
  return { updateSeconds: round(updateSeconds), update, microBatch: stats.microBatch, beta, loss: stats.loss, tokens: stats.tokens };
}

/** A decode step's time at several batch sizes after the shape's prompt length (greedy, the rollouts'
 *  sampler, the base unpacked): on a GPU a step's host work is per dispatch, so the question is how
 *  much a larger batch (more rollouts per GRPO step) costs. Medians of `steps` steps after one. */
export async function decodeScaling(
  model: Qwen2ForCausalLM,
  shape: GrpoShape,
  batches: number[],
  steps: number,
): Promise<{ rows: number; msPerStep: number; tokensPerS: number }[]> {
  const out: { rows: number; msPerStep: number; tokensPerS: number }[] = [];
  const release = model.unpackBase({ mergeAdapter: true });
  try {
    for (const rows of batches) {
      const ids = tokenBatch(rows, shape.promptLen, model.config.vocabSize, 5);
      const { logits, cache } = model.prefill(
        ids,
        ids.map((r) => r.map(() => 1)),
      );
      let next = (await sampleTokens(logits, { temperature: 0 }, new Rng(0))).tokens;
      logits.dispose();
      const times: number[] = [];
      for (let s = 0; s <= steps; s++) {
        const t0 = now();
        const lg = model.decodeStep(next, cache);
        next = (await sampleTokens(lg, { temperature: 0 }, new Rng(0))).tokens;
        lg.dispose();
        if (s > 0) times.push(now() - t0);
      }
      cache.dispose();
      times.sort((a, b) => a - b);
      const sec = times[times.length >> 1];
      out.push({ rows, msPerStep: round(1000 * sec), tokensPerS: round(rows / sec) });
    }
  } finally {
    release();
  }
  return out;
}

/** The grpo_step workload's KL weight (bench's --beta) and its rollout engine (--rollout_engine). */
export const grpoStepOptions: { beta: number; llama?: LlamaShapeOptions; update?: boolean } = { beta: 0 };

registerWorkload({
  name: "grpo_step",
  description:
    "one GRPO step of the config's shape (0.5b: 4 questions × 8 rollouts × 256 new tokens after 220-token prompts; small: 2 × 2 × 8 after 16), LoRA r16 on all 7 modules, base as --quantize (the README's step: nf4), KL weight as --beta (default 0): rollouts (tokens/s sampled) and update (tokens/s trained) apart, parts in seconds",
  async run(ctx) {
    const shape = GRPO_SHAPES[ctx.configName];
    if (!shape) throw new Error(`grpo_step has no shape for config "${ctx.configName}"; accepted: ${Object.keys(GRPO_SHAPES).join(", ")}`);
    const r = await grpoShape(await ctx.model(true), shape, grpoStepOptions);
    const sampled = r.rows * r.newTokens;
    if (r.llama) console.error(`llama: ${JSON.stringify(r.llama)}`);
    return [
      ctx.measure({
        workload: r.llama ? "grpo_rollouts_llama" : "grpo_rollouts",
        batch: r.rows,
        tokens: sampled,
        seconds: r.rolloutSeconds,
        parts: { prefill: r.prefillSeconds, decode: r.decodeSeconds, sample: r.sampleSeconds, stepCall: r.stepCallSeconds },
      }),
      ctx.measure({ workload: "grpo_update", batch: r.rows, tokens: r.tokens, seconds: r.updateSeconds, parts: { ...r.update } }),
    ];
  },
});
