/** GRPO for the calculator agent: grouped multi-turn rollouts with real tool calls, rewards,
 *  group-relative advantages, LoRA updates on a quantized frozen base.
 *  npx tsx scripts/train-gsm8k-agent.ts --preset tiny           (starts from the tiny SFT output)
 *  npx tsx scripts/train-gsm8k-agent.ts --model_path outputs/Qwen2.5-0.5B/sft/final --dataset gsm8k */
import { superviseSelf } from "../src/shutdown.ts";

// The trainer runs in a child process this one supervises, so Ctrl-C is answered at once even while
// a kernel keeps the trainer busy (src/shutdown.ts). Only the child loads the training code.
await superviseSelf();
const { parseChoice, parseFloatArg, parseIntArg, runMain, UsageError } = await import("../src/cli.ts");
const { parseRewardWeights } = await import("../src/rollout/rewards.ts");
const { LOSS_TYPES } = await import("../src/trainer/policy-loss.ts");
const { TINY_GRPO, TINY_PROBLEMS } = await import("../src/presets/tiny.ts");
const { runGrpo } = await import("../src/run/grpo-run.ts");
const { addEnvOptions, addToolOptions, defaultOutputDir, loraTargets, parseWithPreset, toolConfig, trainingCommand } = await import("../src/run/options.ts");

const program = addEnvOptions(addToolOptions(trainingCommand("train-gsm8k-agent", "GRPO: teach the calculator agent from its own rollouts", {
  quantize: "nf4", lr: 1e-5, scheduler: "constant", warmupRatio: 0,
})))
  .option("--init_adapter <dir>", "PEFT adapter to continue (default: the adapter at --model_path, if it is one; else a fresh adapter)")
  .option("--dataset <name|path>", "gsm8k (local HF cache or hub), synthetic, a GSM8K-format .jsonl/.parquet path, or a task .jsonl ({id, query, answer, scorer?, answer_schema?})", "gsm8k")
  .option("--max_samples <n>", "use at most this many training questions (default: all; synthetic: 5000)", parseIntArg("max_samples", 1))
  .option("--total_epochs <n>", "RL steps; each is one rollout → train round", parseIntArg("total_epochs", 1), 100)
  .option("--prompts_per_step <n>", "questions per step", parseIntArg("prompts_per_step", 1), 4)
  .option("--samples_per_prompt <n>", "G: rollouts per question (the group)", parseIntArg("samples_per_prompt", 2), 8)
  .option("--max_new_tokens <n>", "token budget per rollout over all turns (sampled + tool responses)", parseIntArg("max_new_tokens", 1), 512)
  .option("--max_turns <n>", "assistant turns per rollout", parseIntArg("max_turns", 1), 8)
  .option("--temperature <x>", "sampling temperature", parseFloatArg("temperature", 0), 1.0)
  .option("--top_p <x>", "nucleus sampling mass", parseFloatArg("top_p", 0, 1), 1.0)
  .option("--top_k <n>", "sample among the k most likely tokens (0: off)", parseIntArg("top_k", 0), 0)
  .option("--beta <x>", "weight of the k3 KL to the adapter-free base (0: no reference pass)", parseFloatArg("beta", 0), 0.04)
  .option("--epsilon <x>", "lower clip range of the ratio", parseFloatArg("epsilon", 0), 0.2)
  .option("--epsilon_high <x>", "upper clip range (default: --epsilon)", parseFloatArg("epsilon_high", 0))
  .option("--num_iterations <n>", "policy updates per batch of rollouts", parseIntArg("num_iterations", 1), 1)
  .option("--loss_type <kind>", `${LOSS_TYPES.join(", ")}`, parseChoice("loss_type", LOSS_TYPES), "grpo")
  .option("--scale_rewards <kind>", "group: divide advantages by the group's std; none: only centre them", parseChoice("scale_rewards", ["group", "none"] as const), "group")
  .option("--reward_weights <spec>", "weights of the reward components, e.g. correctness=1,format=0.1,tool_use=0 (with --env: env=1)", "correctness=1,format=0.1")
  .option("--micro_batch_size <n>", "rollouts per forward/backward (memory knob; results do not change)", parseIntArg("micro_batch_size", 1), 8)
  .option("--save_steps <n>", "checkpoint every N steps (and always at the end)", parseIntArg("save_steps", 0), 25)
  .option("--save_total_limit <n>", "keep only the newest N checkpoints", parseIntArg("save_total_limit", 1), 2)
  .option("--eval_samples <n>", "held-out questions evaluated greedily at the end (0: skip)", parseIntArg("eval_samples", 0), 0)
  .option("--output_dir <dir>", "run folder (default outputs/<model>/grpo)")
  .option("--overwrite", "replace a run already in --output_dir", false)
  .option("--resume", "continue the run in --output_dir from its latest checkpoint", false);

await runMain(async () => {
  const { o, explicit } = parseWithPreset(program, process.argv, { tiny: TINY_GRPO });
  const tools = toolConfig(o);
  let weights: Record<string, number>;
  try {
    weights = parseRewardWeights(o.env && !explicit("reward_weights") ? "env=1" : o.reward_weights);
  } catch (err) {
    throw new UsageError(`--reward_weights: ${(err as Error).message}`);
  }
  const r = await runGrpo({
    modelPath: o.model_path, initAdapter: o.init_adapter, dataset: o.dataset, synthetic: o.preset === "tiny" ? TINY_PROBLEMS : undefined,
    maxSamples: o.max_samples, totalEpochs: o.total_epochs, promptsPerStep: o.prompts_per_step, samplesPerPrompt: o.samples_per_prompt,
    maxNewTokens: o.max_new_tokens, maxTurns: o.max_turns, temperature: o.temperature, topP: o.top_p, topK: o.top_k,
    beta: o.beta, epsilon: o.epsilon, epsilonHigh: o.epsilon_high ?? o.epsilon, numIterations: o.num_iterations, lossType: o.loss_type,
    scaleRewards: o.scale_rewards, rewardWeights: weights, learningRate: o.learning_rate, lrScheduler: o.lr_scheduler,
    warmupRatio: o.warmup_ratio, weightDecay: o.weight_decay, maxGradNorm: o.max_grad_norm, microBatchSize: o.micro_batch_size,
    loraR: o.lora_r, loraAlpha: o.lora_alpha, loraDropout: o.lora_dropout, loraTargets: loraTargets(o.lora_targets),
    quantize: o.quantize, toolsInPrompt: o.tools_in_prompt, saveSteps: o.save_steps, saveTotalLimit: o.save_total_limit,
    evalSamples: o.eval_samples, seed: o.seed, outputDir: o.output_dir ?? defaultOutputDir(o.model_path, "grpo"),
    backend: o.backend, threads: o.threads, unpackBase: o.unpack_base, overwrite: o.overwrite, resume: o.resume, ...tools,
    env: o.env, envDialect: o.env_dialect,
  });
  process.stdout.write(`grpo done: ${r.steps} steps, ${r.seconds.toFixed(0)} s → ${r.finalDir}\n`);
});
