/** A throwaway tiny model folder for pipeline tests: random weights with the tiny preset's
 *  architecture (made smaller) and a tokenizer learned from a few synthetic problems. */
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { initBackend } from "../../src/backend.ts";
import { createModel } from "../../src/model/load.ts";
import { buildTinyTokenizer, saveTinyTokenizer } from "../../src/model/tiny-tokenizer.ts";
import { tokenizerCorpus } from "../../src/presets/make-tiny-base.ts";
import { tinyModelConfig } from "../../src/presets/tiny.ts";

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
