/** Contracts between the model, the tokenizer and everything that drives them (rollouts, trainers,
 *  scripts): types, and the constants and guards that go with them; implementations live beside this
 *  file. Names follow Hugging Face. */
import type * as tf from "@tensorflow/tfjs";
import type { LoraAdapter } from "./lora.ts";
import type { HostTensor } from "./safetensors.ts";
import type { Qwen2Weights } from "./weight.ts";

/** Qwen2 config as read from config.json (camelCase of the HF snake_case keys). */
export interface Qwen2Config {
  modelType: "qwen2";
  vocabSize: number;
  hiddenSize: number;
  intermediateSize: number;
  numHiddenLayers: number;
  numAttentionHeads: number;
  numKeyValueHeads: number;
  headDim: number; // hidden_size / num_attention_heads unless config.json says otherwise
  ropeTheta: number; // top-level rope_theta or rope_parameters.rope_theta
  rmsNormEps: number;
  tieWordEmbeddings: boolean;
  maxPositionEmbeddings: number;
  bosTokenId?: number;
  eosTokenId?: number | number[];
}

export type Quantize = "none" | "int8" | "nf4";
export const LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"] as const;
export type LoraTarget = (typeof LORA_TARGETS)[number];
/** The linear modules as the model holds them: those that read the same input are one matrix with
 *  their outputs side by side, in this order (LoRA and checkpoints keep the per-module names). */
export const FUSED_MODULES = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"] as const;
export type FusedModule = (typeof FUSED_MODULES)[number];
export const FUSED: Record<FusedModule, readonly LoraTarget[]> = {
  qkv_proj: ["q_proj", "k_proj", "v_proj"],
  o_proj: ["o_proj"],
  gate_up_proj: ["gate_proj", "up_proj"],
  down_proj: ["down_proj"],
};

export interface LoraConfig {
  r: number;
  alpha: number;
  dropout: number; // applied to the LoRA input only while training, as PEFT does
  targetModules: LoraTarget[];
}

/** Per-row KV cache for incremental decoding. Rows are sequences of the decode batch. */
export interface KVCache {
  readonly batchSize: number;
  readonly length: number; // cached positions per row (including left padding)
  /** Keep only these rows, in this order (finished sequences stop costing compute). */
  select(rows: number[]): void;
  dispose(): void;
}

/** How unpackBase holds the base: left, the layout ([out, in], multiplied as the left operand; default
 *  by size); mergeAdapter, whether the adapter is merged into the held weights. */
export interface UnpackOptions {
  left?: boolean;
  mergeAdapter?: boolean;
}

export interface ForwardOptions {
  /** false = run the frozen base with LoRA switched off (the GRPO reference policy). Default true. */
  adapters?: boolean;
  /** true while training: enables LoRA dropout. Default false. */
  training?: boolean;
  /** decodeStep only: rows marked true read nothing this step (a rollout row waiting for its
   *  environment): their token is stored masked out, unseen by every later query, and their position
   *  id does not advance, so the row's context is as if the step never happened. Its logits are junk. */
  hold?: boolean[];
}

/** A causal LM the trainers and the rollout engine drive. Qwen2 is the one implementation. */
export interface CausalLM {
  readonly config: Qwen2Config;
  readonly quantize: Quantize;
  readonly lora: LoraConfig | null;

  /** Full logits [batch, seq, vocab]; left padding with position ids from the mask. */
  forward(inputIds: number[][], attentionMask?: number[][], opts?: ForwardOptions): tf.Tensor3D;

  /** Log-probabilities of the given tokens under the model: out[b][t] = log p(ids[b][t] | ids[b][<t]),
   *  out[b][0] = 0. Never materialises full-vocab logits for the whole batch at once (chunked), and is
   *  differentiable with respect to trainableVariables(). Optional per-token entropy of the same
   *  distributions (not differentiated). Shapes [batch, seq].
   *  logprobMask [batch][seq]: 1 where a log-prob is needed (GRPO's loss mask); out (and entropy) is 0
   *  where it is 0, and the vocabulary head runs only over each row's span from its first to its last 1. */
  tokenLogprobs(
    inputIds: number[][],
    attentionMask: number[][],
    opts?: ForwardOptions & { withEntropy?: boolean; logprobMask?: number[][] },
  ): { logprobs: tf.Tensor2D; entropy?: tf.Tensor2D };

  /** Run a left-padded prompt batch; returns the last position's logits [batch, vocab] and a cache. */
  prefill(inputIds: number[][], attentionMask: number[][], opts?: ForwardOptions): { logits: tf.Tensor2D; cache: KVCache };
  /** Append one token per row; returns the new last-position logits [batch, vocab]. Updates the cache. */
  decodeStep(tokens: number[], cache: KVCache, opts?: ForwardOptions): tf.Tensor2D;

  /** Optional: hold a quantized base dequantized for generation until the returned release is called
   *  (same outputs, faster decoding, f32 memory meanwhile). rolloutGroups calls it when present.
   *  mergeAdapter: also add the adapter's LoRA terms into those f32 weights, so a decode step runs no
   *  LoRA products (outputs equal to float32 rounding); forwards with adapters off, training
   *  forwards and adapter swaps then fail until the release. */
  unpackBase?(opts?: UnpackOptions): () => void;

  /** Optional: true when tokenLogprobs runs the prefix its rows share once (GRPO then keeps the
   *  rollouts of one prompt together in its micro-batches). */
  readonly sharePrefixes?: boolean;

  /** Optional: the most rows of `length` tokens one training forward and backward should hold on the
   *  current backend (its memory); GRPO splits larger micro-batches. Absent: no limit. */
  trainRowsFor?(length: number): number;

  /** Optional: the rows of `length` tokens `--micro_batch_size auto` gives one micro-step: on a GPU
   *  as many as fit a share of its memory beside the weights (estimated from shapes), elsewhere
   *  trainRowsFor's. */
  autoTrainRows?(length: number): number;

  /** Optional (WeightsOnHost): the weights on the host, for an engine that runs them elsewhere. */
  stateDict?(): Promise<Record<string, HostTensor>>;
  readonly loraAdapter?: AdapterOnHost | null;

  /** LoRA A/B variables when an adapter is attached (base frozen); every weight when trained in full. */
  trainableVariables(): tf.Variable[];

  /** PEFT folder: adapter_config.json + adapter_model.safetensors (written atomically). */
  saveAdapter(dir: string): Promise<void>;
  /** Hugging Face folder: config.json + model.safetensors (full weights, f32; written atomically). */
  savePretrained(dir: string): Promise<void>;
  dispose(): void;
}

/** The attached adapter as an engine exports it: its config and its factors under PEFT's names
 *  (lora_A [r, in], lora_B [out, r], f32). */
export interface AdapterOnHost {
  readonly config: LoraConfig;
  toPeft(): Promise<Record<string, HostTensor>>;
}

/** A model whose weights an engine in another runtime can load (llama.cpp's GGUF): the base as
 *  Hugging Face names → torch-layout f32 (a quantized base dequantized, the tied head once), and the
 *  attached adapter. Qwen2ForCausalLM has it. */
export interface WeightsOnHost extends CausalLM {
  readonly baseModelName: string;
  stateDict(): Promise<Record<string, HostTensor>>;
  readonly loraAdapter: AdapterOnHost | null;
}

export const hasWeightsOnHost = (m: CausalLM): m is WeightsOnHost => typeof m.stateDict === "function" && m.loraAdapter !== undefined;

/** A model whose weights a program reads where the backend holds them (the compiled WebGPU decoder):
 *  the frozen base as held (f32, or int8/NF4 codes), and the adapter's variables. */
export interface WeightsOnDevice extends CausalLM {
  readonly weights: Qwen2Weights;
  readonly loraAdapter: LoraAdapter | null;
}

export const hasWeightsOnDevice = (m: CausalLM): m is WeightsOnDevice => "weights" in m && m.loraAdapter !== undefined;

export interface ChatToolCall {
  type: "function";
  function: { name: string; arguments: Record<string, unknown> | string };
}
export interface ChatMessage {
  role: "system" | "user" | "assistant" | "tool";
  content: string;
  tool_calls?: ChatToolCall[];
}
/** JSON schema of a tool as the chat template renders it inside <tools></tools>. */
export interface ToolSchema {
  type: "function";
  function: { name: string; description: string; parameters: Record<string, unknown> };
}

export interface Tokenizer {
  readonly vocabSize: number;
  readonly eosTokenId: number; // <|im_end|> for Qwen chat models (tokenizer_config eos_token)
  readonly padTokenId: number; // <|endoftext|>
  encode(text: string): number[]; // no special tokens added; special-token text maps to its id
  decode(ids: number[], opts?: { skipSpecialTokens?: boolean }): string;
  tokenToId(token: string): number | undefined;
  /** The chat template rendered to text (jinja, tools supported). */
  applyChatTemplate(messages: ChatMessage[], opts?: { tools?: ToolSchema[]; addGenerationPrompt?: boolean }): string;
  /** Rendered and tokenized, with mask 1 on tokens the assistant wrote (its content, tool calls and
   *  closing <|im_end|>) and 0 on everything else (system/user/tool turns, role headers). */
  encodeChat(
    messages: ChatMessage[],
    opts?: { tools?: ToolSchema[]; addGenerationPrompt?: boolean },
  ): { ids: number[]; assistantMask: number[] };
}
