/** Throwaway model folders for run-layer tests, saved the Hugging Face way so openPolicy loads them
 *  like any checkpoint: a tiny-preset-shaped one for pipeline runs, and a smaller one for eval/chat. */
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { initBackend } from "../../../src/kernels/backend.ts";
import { createModel } from "../../../src/model/load.ts";
import { buildTinyTokenizer, saveTinyTokenizer } from "../../../scripts/lib/tiny-tokenizer.ts";
import { tokenizerCorpus } from "../../../scripts/lib/make-tiny-base.ts";
import { tinyModelConfig } from "../../../src/presets/tiny.ts";
import type { Qwen2Config } from "../../../src/model/types.ts";

/** Random weights with the tiny preset's architecture (made smaller) and a tokenizer learned from a
 *  few synthetic problems. */
export async function makeTinyModelDir(seed = 1): Promise<string> {
  await initBackend("wasm");
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "marl-tiny-"));
  const files = buildTinyTokenizer(tokenizerCorpus(200), { vocabSize: 320 });
  const cfg = { ...tinyModelConfig(320), hiddenSize: 64, intermediateSize: 128, numHiddenLayers: 2, numAttentionHeads: 2, headDim: 32 };
  const model = await createModel(cfg, { seed });
  await model.savePretrained(dir);
  model.dispose();
  await saveTinyTokenizer(dir, files);
  return dir;
}

/** One layer, hidden 32: the model of makeSmallModelDir (vocabulary 300). */
export const SMALL_MODEL_CONFIG: Qwen2Config = {
  modelType: "qwen2",
  vocabSize: 300,
  hiddenSize: 32,
  intermediateSize: 64,
  numHiddenLayers: 1,
  numAttentionHeads: 2,
  numKeyValueHeads: 1,
  headDim: 16,
  ropeTheta: 1e4,
  rmsNormEps: 1e-6,
  tieWordEmbeddings: true,
  maxPositionEmbeddings: 1024,
};

/** SMALL_MODEL_CONFIG with random weights and a byte-level BPE tokenizer with Qwen's special tokens
 *  and chat template, learned from three sentences. */
export async function makeSmallModelDir(prefix: string, seed = 3): Promise<string> {
  await initBackend("wasm");
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), prefix));
  const corpus = ["Janet has 16 eggs and sells 3 of them. How many are left?", "The answer is \\boxed{13}.", "calculator expression 16-3"];
  const tok = buildTinyTokenizer(corpus, { vocabSize: SMALL_MODEL_CONFIG.vocabSize });
  const model = await createModel(SMALL_MODEL_CONFIG, { seed });
  await model.savePretrained(dir); // replaces the folder, so the tokenizer goes in after
  model.dispose();
  await saveTinyTokenizer(dir, tok);
  return dir;
}
