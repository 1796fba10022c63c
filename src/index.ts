/** The library API: everything the scripts use, importable for programmatic use. */
import { resolveModelDir } from "./model/model-dir.ts";
import { loadTokenizerFromDir } from "./model/tokenizer.ts";
import type { Tokenizer } from "./model/types.ts";

export { initBackend } from "./kernels/backend.ts";
export { loadModel, createModel } from "./model/load.ts";
export { resolveModelDir } from "./model/model-dir.ts";
export { Qwen2ForCausalLM } from "./model/qwen2.ts";
export { readSafetensorsAll, writeSafetensors } from "./model/safetensors.ts";
export { writeModelGguf, writeLoraGguf, cachedModelGguf } from "./model/gguf.ts";
export type { CausalLM, ChatMessage, KVCache, LoraConfig, Quantize, Qwen2Config, Tokenizer, ToolSchema } from "./model/types.ts";
export { calculatorTool, shutdownCalculator } from "./agents/calculator.ts";
export { BUILTIN_TOOLS, DEFAULT_TOOLS, toolTable } from "./agents/builtin.ts";
export { parseToolCalls } from "./agents/toolcall.ts";
export { SYSTEM_PROMPT, systemPromptFor, toPrompt } from "./agents/prompts.ts";
export { openTools, type ToolSet, type ToolSetOptions } from "./agents/toolset.ts";
export { serveStdio as serveToolsStdio, serveHttp as serveToolsHttp } from "./agents/mcp-serve.ts";
export { registerScorer, getScorer, judgeRollout, type Scorer, type TaskSpec } from "./datasets/scorers.ts";
export { loadTasks, type Task } from "./datasets/tasks.ts";
export type { Tool } from "./agents/types.ts";
export { loadGsm8k, type Gsm8kExample } from "./datasets/gsm8k.ts";
export { generateSynthetic } from "./datasets/synthetic.ts";
export { toConversation, buildSftConversations } from "./agents/sft.ts";
export { extractAnswer, lastNumber, answersMatch, parseGold, ANSWER_SCHEMAS, type AnswerSchema } from "./datasets/answer.ts";
export { rolloutGroups, type Trajectory, type RolloutConfig } from "./rollout/rollout.ts";
export {
  defineRolloutEngine,
  EngineError,
  prepareEngine,
  registerRolloutEngine,
  ROLLOUT_ENGINES,
  type RolloutEngine,
  type RolloutEngineDef,
  type EngineContext,
  type EngineFlags,
} from "./rollout/engines/index.ts";
export { turnRollouts, type TurnCompleter } from "./rollout/turns.ts";
export { scoreRollout, parseRewardWeights, REWARD_COMPONENTS } from "./rollout/rewards.ts";
export { sampleTokens } from "./rollout/sampler.ts";
export { groupAdvantages } from "./trainer/advantages.ts";
export { policyLoss } from "./trainer/policy-loss.ts";
export { grpoStep } from "./trainer/grpo.ts";
export { sftStep, sftLoss } from "./trainer/sft.ts";
export { AdamW } from "./trainer/optimizer.ts";
export { runSft } from "./run/sft-run.ts";
export { runGrpo } from "./run/grpo-run.ts";
export { runEval } from "./run/eval-run.ts";
export { evaluate } from "./run/evaluate.ts";
export { openPolicy } from "./run/policy.ts";
export { startServer } from "./serve/http.ts";
export { serveOpenAi } from "./serve/openai/run.ts";
export { parseServeArgs } from "./serve/config.ts";
export { Rng } from "./util/rng.ts";

/** A tokenizer (tokenizer.json + tokenizer_config.json with its chat template) from a folder or hub id. */
export async function loadTokenizer(pathOrId: string): Promise<Tokenizer> {
  return loadTokenizerFromDir(await resolveModelDir(pathOrId));
}
