/** The tiny preset's own tokenizer: a byte-level BPE built like Qwen2's (same NFC normalizer, the same
 *  pre-tokenizer split regex, so digits stay one per token, and ByteLevel), with merges learned from a
 *  corpus by a small deterministic trainer, Qwen's special tokens as single ids and the real Qwen2.5
 *  chat template. The result is a real tokenizer.json + tokenizer_config.json pair that
 *  loadTokenizerFromDir (and Hugging Face transformers) read. Left out: the trainer's speed tricks (it
 *  recounts pairs after every merge, which is fine for a few hundred merges on a small corpus). */
import * as path from "node:path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { writeFileAtomic } from "../../src/util/fs.ts";

/** Qwen2's pre-tokenizer split pattern, verbatim from its tokenizer.json (Oniguruma syntax). */
export const QWEN2_SPLIT_PATTERN =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/** Qwen's added tokens in Qwen's order. The chat markers are special (skipped by
 *  decode(skipSpecialTokens)); the tool markers are not, so they survive decoding, as in Qwen2.5. */
export const TINY_ADDED_TOKENS: readonly { content: string; special: boolean }[] = [
  { content: "<|endoftext|>", special: true },
  { content: "<|im_start|>", special: true },
  { content: "<|im_end|>", special: true },
  { content: "<tool_call>", special: false },
  { content: "</tool_call>", special: false },
  { content: "<tool_response>", special: false },
  { content: "</tool_response>", special: false },
];

/** The chat template Qwen2.5 Instruct checkpoints ship in tokenizer_config.json, byte for byte. */
export const QWEN2_5_CHAT_TEMPLATE = String.raw`{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
`;

export interface TinyTokenizerFiles {
  tokenizerJson: Record<string, unknown>;
  tokenizerConfig: Record<string, unknown>;
}

const BYTE_LEVEL = { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false };

/** Learn a byte-level BPE of exactly `vocabSize` ids (256 bytes + merges + the 7 added tokens). */
export function buildTinyTokenizer(corpus: string[], opts: { vocabSize: number }): TinyTokenizerFiles {
  const { vocabSize } = opts;
  const minSize = 256 + TINY_ADDED_TOKENS.length;
  if (!Number.isInteger(vocabSize) || vocabSize < minSize)
    throw new Error(`vocabSize ${vocabSize} must be an integer >= ${minSize} (256 bytes + ${TINY_ADDED_TOKENS.length} added tokens)`);
  if (!Array.isArray(corpus) || corpus.some((t) => typeof t !== "string")) throw new Error(`corpus must be an array of strings`);

  const byteChars = bytesToUnicode(); // byte value -> its printable stand-in, e.g. 32 (space) -> "Ġ"
  const vocab = new Map<string, number>(byteChars.map((c, b) => [c, b]));
  const preTokenize = qwenPreTokenizer(byteChars);
  const words = countWords(corpus, preTokenize);
  const merges = learnMerges(words, vocab, vocabSize - TINY_ADDED_TOKENS.length);

  const base = vocab.size;
  const addedTokens = TINY_ADDED_TOKENS.map((t, i) => ({
    id: base + i,
    content: t.content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: t.special,
  }));
  const tokenizerJson = tokenizerJsonOf(
    Object.fromEntries(vocab),
    merges.map(([a, b]) => `${a} ${b}`),
    addedTokens,
  );
  const tokenizerConfig = {
    add_bos_token: false,
    add_prefix_space: false,
    added_tokens_decoder: Object.fromEntries(addedTokens.map(({ id, ...rest }) => [String(id), sortKeys(rest)])),
    additional_special_tokens: ["<|im_start|>", "<|im_end|>"],
    bos_token: null,
    chat_template: QWEN2_5_CHAT_TEMPLATE,
    clean_up_tokenization_spaces: false,
    eos_token: "<|im_end|>",
    errors: "replace",
    model_max_length: 131072,
    pad_token: "<|endoftext|>",
    split_special_tokens: false,
    tokenizer_class: "Qwen2Tokenizer",
    unk_token: null,
  };
  return { tokenizerJson, tokenizerConfig };
}

/** Write tokenizer.json and tokenizer_config.json into `dir`, each atomically. Other files in `dir`
 *  (config.json, weights) are left alone. */
export async function saveTinyTokenizer(dir: string, built: TinyTokenizerFiles): Promise<void> {
  await writeFileAtomic(path.join(dir, "tokenizer.json"), JSON.stringify(built.tokenizerJson, null, 2) + "\n");
  await writeFileAtomic(path.join(dir, "tokenizer_config.json"), JSON.stringify(built.tokenizerConfig, null, 2) + "\n");
}

/** BPE training: repeatedly merge the most frequent adjacent pair (ties: the smaller pair in code-unit
 *  order, so the result depends on the corpus alone) until the vocabulary holds `target` entries.
 *  `vocab` is extended in place; the merges come back in rank order. */
function learnMerges(words: Map<string, number>, vocab: Map<string, number>, target: number): [string, string][] {
  const entries = [...words.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const symbols = entries.map(([w]) => [...w]); // each word as its current symbols
  const counts = entries.map(([, n]) => n);
  const merges: [string, string][] = [];
  while (vocab.size < target) {
    const pairs = new Map<string, number>();
    for (let w = 0; w < symbols.length; w++) {
      const s = symbols[w];
      for (let i = 0; i + 1 < s.length; i++) {
        const key = `${s[i]} ${s[i + 1]}`; // byte-level symbols never hold a space
        pairs.set(key, (pairs.get(key) ?? 0) + counts[w]);
      }
    }
    let best: string | undefined;
    let bestCount = 0;
    for (const [key, n] of pairs) if (n > bestCount || (n === bestCount && best !== undefined && key < best)) [best, bestCount] = [key, n];
    if (best === undefined)
      throw new Error(
        `corpus too small: only ${vocab.size + TINY_ADDED_TOKENS.length} ids learnable (every word is one token), vocabSize ${target + TINY_ADDED_TOKENS.length} requested; lower vocabSize or add text`,
      );
    const [a, b] = best.split(" ");
    merges.push([a, b]);
    if (!vocab.has(a + b)) vocab.set(a + b, vocab.size); // two merges can spell the same token
    for (const s of symbols) {
      for (let i = 0; i + 1 < s.length; i++) if (s[i] === a && s[i + 1] === b) s.splice(i, 2, a + b);
    }
  }
  return merges;
}

/** Word counts over the corpus, words being the byte-level pre-tokens encode() will see. Added-token
 *  text (e.g. "<|im_end|>" in rendered chats) is cut out first: it always maps to its own id. */
function countWords(corpus: string[], preTokenize: (text: string) => string[]): Map<string, number> {
  const escaped = TINY_ADDED_TOKENS.map((t) => t.content.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  const added = new RegExp(escaped.join("|"), "g");
  const words = new Map<string, number>();
  for (const text of corpus)
    for (const piece of text.split(added)) for (const w of preTokenize(piece)) words.set(w, (words.get(w) ?? 0) + 1);
  return words;
}

/** The pre-tokenizer of a merge-less tokenizer with Qwen's settings, i.e. the very code (regex
 *  translation included) that will split text at encode time, so training sees the same words. */
function qwenPreTokenizer(byteChars: string[]): (text: string) => string[] {
  const vocab = Object.fromEntries(byteChars.map((c, b) => [c, b]));
  const hf = new HfTokenizer(tokenizerJsonOf(vocab, [], []), {});
  const pre = hf.pre_tokenizer!;
  return (text) => (text.length === 0 ? [] : pre.pre_tokenize(text.normalize("NFC")));
}

function tokenizerJsonOf(vocab: Record<string, number>, merges: string[], addedTokens: object[]): Record<string, unknown> {
  return {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: addedTokens,
    normalizer: { type: "NFC" },
    pre_tokenizer: {
      type: "Sequence",
      pretokenizers: [{ type: "Split", pattern: { Regex: QWEN2_SPLIT_PATTERN }, behavior: "Isolated", invert: false }, BYTE_LEVEL],
    },
    post_processor: BYTE_LEVEL,
    decoder: BYTE_LEVEL,
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: "",
      end_of_word_suffix: "",
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges,
    },
  };
}

/** GPT-2's reversible map from the 256 byte values to printable characters (the ByteLevel alphabet):
 *  printable Latin-1 bytes stand for themselves, the rest move to U+0100 onwards. */
function bytesToUnicode(): string[] {
  const keep = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const out: string[] = [];
  let next = 0;
  for (let b = 0; b < 256; b++) out.push(String.fromCharCode(keep(b) ? b : 256 + next++));
  return out;
}

function sortKeys(o: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(o).sort(([a], [b]) => (a < b ? -1 : 1)));
}
