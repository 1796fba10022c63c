/** The offline `tiny` preset: a small Qwen2-architecture model, its own byte-level BPE tokenizer with
 *  Qwen's special tokens and chat template, and synthetic GSM8K-format problems — everything the
 *  real pipeline uses, small enough to run SFT → GRPO → eval on a 2-core CPU in minutes.
 *
 *  The shipped base (src/presets/tiny/) is a language model pretrained by scripts/make-tiny-base.ts
 *  on GSM8K-format text (question, solution with <<expr=result>> annotations, #### answer; 30% of it
 *  rendered as chat transcripts with calculator calls) on two-digit numbers. SFT teaches the
 *  tool-calling conversation on three-digit numbers; GRPO then improves accuracy. The seeds below
 *  keep pretraining, SFT, RL and evaluation questions apart (each problem depends only on its seed
 *  and index). */
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import type { SyntheticOptions } from "../datasets/synthetic.ts";
import type { Qwen2Config } from "../model/types.ts";

export const TINY_BASE_DIR = path.join(path.dirname(fileURLToPath(import.meta.url)), "tiny");
export const TINY_OUTPUT_DIR = path.join("outputs", "tiny");

/** What the base is pretrained on (and its tokenizer learned from): 1-3 steps, two-digit operands
 *  (products up to four digits). */
export const TINY_PRETRAIN_PROBLEMS: Omit<SyntheticOptions, "n" | "seed"> = {
  minSteps: 1,
  maxSteps: 3,
  minOperand: 2,
  maxOperand: 99,
  maxValue: 9999,
};

/** The task SFT, RL and evaluation use: 1-2 steps with operands up to 999 — one digit longer than
 *  anything in pretraining, so copying the numbers into calculator calls is where the model fails
 *  and improves (the arithmetic is the tool's; products reach six digits). */
export const TINY_PROBLEMS: Omit<SyntheticOptions, "n" | "seed"> = {
  minSteps: 1,
  maxSteps: 2,
  minOperand: 2,
  maxOperand: 999,
  maxValue: 999_999,
};

/** Disjoint streams of problems. */
export const TINY_SEEDS = { pretrain: 101, tokenizer: 102, sft: 201, rl: 301, eval: 401 } as const;

export const TINY_VOCAB_SIZE = 512;

export function tinyModelConfig(vocabSize: number): Qwen2Config {
  return {
    modelType: "qwen2",
    vocabSize,
    hiddenSize: 128,
    intermediateSize: 384,
    numHiddenLayers: 4,
    numAttentionHeads: 4,
    numKeyValueHeads: 2,
    headDim: 32,
    ropeTheta: 10000,
    rmsNormEps: 1e-6,
    tieWordEmbeddings: true,
    maxPositionEmbeddings: 1024,
  };
}
