/** A throwaway model folder for run-layer tests: a tiny byte-level BPE tokenizer with Qwen's special
 *  tokens and chat template, and a random-weight Qwen2 of matching vocabulary, saved the Hugging Face
 *  way so openPolicy loads it like any checkpoint. */
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { initBackend } from "../../src/backend.ts";
import { createModel } from "../../src/model/load.ts";
import { buildTinyTokenizer, saveTinyTokenizer } from "../../src/model/tiny-tokenizer.ts";

export async function makeTinyModelDir(prefix: string, seed = 3): Promise<string> {
  await initBackend("wasm");
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), prefix));
  const corpus = ["Janet has 16 eggs and sells 3 of them. How many are left?", "The answer is \\boxed{13}.", "calculator expression 16-3"];
  const tok = buildTinyTokenizer(corpus, { vocabSize: 300 });
  const model = await createModel({
    modelType: "qwen2", vocabSize: 300, hiddenSize: 32, intermediateSize: 64, numHiddenLayers: 1,
    numAttentionHeads: 2, numKeyValueHeads: 1, headDim: 16, ropeTheta: 1e4, rmsNormEps: 1e-6,
    tieWordEmbeddings: true, maxPositionEmbeddings: 1024,
  }, { seed });
  await model.savePretrained(dir); // replaces the folder, so the tokenizer goes in after
  model.dispose();
  await saveTinyTokenizer(dir, tok);
  return dir;
}
