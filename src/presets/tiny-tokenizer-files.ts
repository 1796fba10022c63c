/** Re-exports for building the tiny tokenizer and using it before it is written to disk. */
import { tokenizerFromJson } from "../model/tokenizer.ts";
import type { Tokenizer } from "../model/types.ts";
import type { TinyTokenizerFiles } from "../model/tiny-tokenizer.ts";
export { buildTinyTokenizer, saveTinyTokenizer, QWEN2_5_CHAT_TEMPLATE } from "../model/tiny-tokenizer.ts";

export function tokenizerFromJsonFiles(files: TinyTokenizerFiles): Tokenizer {
  return tokenizerFromJson(files.tokenizerJson, files.tokenizerConfig);
}
