/** The tiny preset's tokenizer: BPE trained in TS, saved as real tokenizer files, read back by the
 *  same loader as Qwen's. Also the loader's file handling (missing, corrupt, template variants), which
 *  is cheap to test on these small files. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { buildTinyTokenizer, QWEN2_5_CHAT_TEMPLATE, saveTinyTokenizer, type TinyTokenizerFiles } from "../../scripts/lib/tiny-tokenizer.ts";
import { loadTokenizerFromDir, tokenizerFromJson } from "../../src/model/tokenizer.ts";
import type { Tokenizer } from "../../src/model/types.ts";
import { conversation, tools } from "./helpers/readme-conversation.ts";

const FIXTURE = "test/fixtures/qwen2.5-chat-template";
const corpus = [
  "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
  "How many clips did Natalia sell altogether in April and May?",
  "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
  "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?",
  '<|im_start|>user\nJanet has 16 eggs. She eats 3 and bakes with 4. How many are left?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "16-3-4"}}\n</tool_call><|im_end|>',
  "<|im_start|>user\n<tool_response>\n9\n</tool_response><|im_end|>\n<|im_start|>assistant\nThe answer is \\boxed{9}.<|im_end|>",
];
const VOCAB = 400;

let root: string;
let built: TinyTokenizerFiles;
let tok: Tokenizer;

beforeAll(async () => {
  root = await fs.mkdtemp(path.join(os.tmpdir(), "tiny-tok-"));
  built = buildTinyTokenizer(corpus, { vocabSize: VOCAB });
  await saveTinyTokenizer(path.join(root, "tiny"), built);
  tok = await loadTokenizerFromDir(path.join(root, "tiny"));
});
afterAll(async () => {
  await fs.rm(root, { recursive: true, force: true });
});

/** A folder with the tiny files, optionally changed. */
async function variant(name: string, edit: (files: { "tokenizer.json"?: string; "tokenizer_config.json"?: string }) => void) {
  const dir = path.join(root, name);
  await fs.mkdir(dir, { recursive: true });
  const files: { "tokenizer.json"?: string; "tokenizer_config.json"?: string } = {
    "tokenizer.json": JSON.stringify(built.tokenizerJson),
    "tokenizer_config.json": JSON.stringify(built.tokenizerConfig),
  };
  edit(files);
  for (const [file, text] of Object.entries(files)) if (text !== undefined) await fs.writeFile(path.join(dir, file), text);
  return dir;
}

describe("buildTinyTokenizer", () => {
  it("learns the merges a hand-run BPE gives, ties broken by code-unit order", () => {
    // words "ab", "Ġab" x2, "Ġcd": pairs a+b 3, Ġ+a 2, Ġ+c 1, c+d 1 -> "a b"; then "Ġ ab" (2); then the
    // 1-1 tie between "c d" and "Ġ c" goes to "c d" ("c" < "Ġ").
    const small = buildTinyTokenizer(["ab ab ab cd"], { vocabSize: 256 + 7 + 3 });
    const model = small.tokenizerJson.model as { merges: string[]; vocab: Record<string, number> };
    expect(model.merges).toEqual(["a b", "Ġ ab", "c d"]);
    expect(model.vocab["ab"]).toBe(256);
    expect(model.vocab["Ġab"]).toBe(257);
    expect(model.vocab["cd"]).toBe(258);
    // one more merge ("Ġ cd") exhausts the corpus: 267 ids at most
    expect(buildTinyTokenizer(["ab ab ab cd"], { vocabSize: 267 }).tokenizerJson).toBeTruthy();
    expect(() => buildTinyTokenizer(["ab ab ab cd"], { vocabSize: 268 })).toThrow(
      /corpus too small: only 267 ids learnable \(every word is one token\), vocabSize 268 requested/,
    );
  });

  it("has exactly the requested vocabulary size, with Qwen's added tokens at the end", () => {
    expect(tok.vocabSize).toBe(VOCAB);
    const added = built.tokenizerJson.added_tokens as { id: number; content: string; special: boolean }[];
    expect(added.map((t) => [t.id, t.content, t.special])).toEqual([
      [393, "<|endoftext|>", true],
      [394, "<|im_start|>", true],
      [395, "<|im_end|>", true],
      [396, "<tool_call>", false],
      [397, "</tool_call>", false],
      [398, "<tool_response>", false],
      [399, "</tool_response>", false],
    ]);
    expect(tok.eosTokenId).toBe(395);
    expect(tok.padTokenId).toBe(393);
  });

  it("special and tool tokens are single ids inside text", () => {
    for (const [text, id] of [
      ["<|endoftext|>", 393],
      ["<|im_start|>", 394],
      ["<|im_end|>", 395],
      ["<tool_call>", 396],
      ["</tool_call>", 397],
      ["<tool_response>", 398],
      ["</tool_response>", 399],
    ] as const) {
      expect(tok.tokenToId(text)).toBe(id);
      const ids = tok.encode(`x${text}y`);
      expect(ids).toHaveLength(3);
      expect(ids[1]).toBe(id);
    }
  });

  it("round-trips text exactly, including bytes never seen in the corpus", () => {
    const texts = [...corpus, "Unseen: café 温度 🎉\t\r\n  trailing  ", "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>"];
    for (const t of texts) expect(tok.decode(tok.encode(t))).toBe(t);
    expect(tok.decode(tok.encode("<|im_start|>hi<|im_end|>"), { skipSpecialTokens: true })).toBe("hi");
  });

  it("merges frequent words and never merges digits", () => {
    expect(tok.encode(" clips")).toHaveLength(1);
    expect(tok.encode("Natalia")).toHaveLength(1);
    expect(tok.encode("48")).toHaveLength(2);
    expect(tok.encode("1234567890")).toHaveLength(10);
    const vocab = (built.tokenizerJson.model as { vocab: Record<string, number> }).vocab;
    for (const token of Object.keys(vocab)) if (/[0-9]/.test(token)) expect(token).toHaveLength(1);
  });

  it("carries the real Qwen2.5 chat template and renders tool calls like Qwen's", async () => {
    const fixture = JSON.parse(await fs.readFile(path.join(FIXTURE, "tokenizer_config.json"), "utf8"));
    expect(QWEN2_5_CHAT_TEMPLATE).toBe(fixture.chat_template);
    expect(built.tokenizerConfig.chat_template).toBe(fixture.chat_template);
    const readme = await fs.readFile(path.join(FIXTURE, "README.md"), "utf8");
    expect(tok.applyChatTemplate(conversation, { tools })).toBe(readme.match(/```\n([\s\S]*?)```/)![1]);
  });

  it("encodeChat agrees with whole-text encoding and masks the assistant's writing", () => {
    const { ids, assistantMask } = tok.encodeChat(conversation, { tools });
    expect(ids).toEqual(tok.encode(tok.applyChatTemplate(conversation, { tools })));
    const masked = ids.filter((_, i) => assistantMask[i] === 1);
    expect(tok.decode(masked)).toBe(
      'Janet sells 16 - 3 - 4 = \n<tool_call>\n{"name": "calculator", "arguments": {"expression": "16-3-4"}}\n</tool_call><|im_end|>' +
        "9 eggs. The answer is \\boxed{18}.<|im_end|>",
    );
  });

  it("is deterministic: same corpus, same bytes; corpus order does not matter", async () => {
    const again = buildTinyTokenizer(corpus, { vocabSize: VOCAB });
    const shuffled = buildTinyTokenizer([...corpus].reverse(), { vocabSize: VOCAB });
    expect(JSON.stringify(again)).toBe(JSON.stringify(built));
    expect(JSON.stringify(shuffled)).toBe(JSON.stringify(built));
    await saveTinyTokenizer(path.join(root, "again"), again);
    for (const f of ["tokenizer.json", "tokenizer_config.json"])
      expect(await fs.readFile(path.join(root, "again", f))).toEqual(await fs.readFile(path.join(root, "tiny", f)));
    expect((await fs.readdir(path.join(root, "again"))).sort()).toEqual(["tokenizer.json", "tokenizer_config.json"]); // no temp files left
  });

  it("rejects bad arguments with the value and what is accepted", () => {
    expect(() => buildTinyTokenizer(corpus, { vocabSize: 100 })).toThrow(/vocabSize 100 must be an integer >= 263/);
    expect(() => buildTinyTokenizer([1 as unknown as string], { vocabSize: 300 })).toThrow(/corpus must be an array of strings/);
  });
});

describe("loadTokenizerFromDir file handling", () => {
  it("names the missing or broken file", async () => {
    const missing = path.join(root, "nowhere");
    await expect(loadTokenizerFromDir(missing)).rejects.toThrow(`${path.join(missing, "tokenizer.json")} not found`);
    const noConfig = await variant("no-config", (f) => delete f["tokenizer_config.json"]);
    await expect(loadTokenizerFromDir(noConfig)).rejects.toThrow(`${path.join(noConfig, "tokenizer_config.json")} not found`);
    const corrupt = await variant("corrupt", (f) => (f["tokenizer.json"] = f["tokenizer.json"]!.slice(0, 500)));
    await expect(loadTokenizerFromDir(corrupt)).rejects.toThrow(`${path.join(corrupt, "tokenizer.json")} is not valid JSON`);
    const noModel = await variant("no-model", (f) => (f["tokenizer.json"] = "{}"));
    await expect(loadTokenizerFromDir(noModel)).rejects.toThrow(/tokenizer\.json has no "model" section/);
    const badEos = await variant(
      "bad-eos",
      (f) => (f["tokenizer_config.json"] = JSON.stringify({ ...built.tokenizerConfig, eos_token: "<eos>" })),
    );
    await expect(loadTokenizerFromDir(badEos)).rejects.toThrow(/tokenizer_config\.json: eos_token "<eos>" is not in the vocabulary/);
    const badTemplate = await variant(
      "bad-template",
      (f) => (f["tokenizer_config.json"] = JSON.stringify({ ...built.tokenizerConfig, chat_template: "{% if %}" })),
    );
    await expect(loadTokenizerFromDir(badTemplate)).rejects.toThrow(/chat template "default" does not parse/);
  });

  it("reads eos given as an AddedToken object, and works without a chat template until one is needed", async () => {
    const dir = await variant("no-template", (f) => {
      const { chat_template: _, ...cfg } = built.tokenizerConfig;
      f["tokenizer_config.json"] = JSON.stringify({ ...cfg, eos_token: { content: "<|im_end|>", special: true } });
    });
    const t = await loadTokenizerFromDir(dir);
    expect(t.eosTokenId).toBe(395);
    expect(t.encode("48")).toHaveLength(2);
    expect(() => t.applyChatTemplate([{ role: "user", content: "x" }])).toThrow(/tokenizer_config\.json has no chat_template/);
  });

  it("picks named templates as transformers does, and prefers chat_template.jinja", async () => {
    const listed = await variant("listed", (f) => {
      f["tokenizer_config.json"] = JSON.stringify({
        ...built.tokenizerConfig,
        chat_template: [
          { name: "default", template: "D:{{ messages[0].content }}" },
          { name: "tool_use", template: "T:{{ tools[0].function.name }}" },
        ],
      });
    });
    const t = await loadTokenizerFromDir(listed);
    expect(t.applyChatTemplate([{ role: "user", content: "hi" }])).toBe("D:hi");
    expect(t.applyChatTemplate([{ role: "user", content: "hi" }], { tools })).toBe("T:calculator");

    const withJinja = await variant("jinja-file", () => {});
    await fs.writeFile(path.join(withJinja, "chat_template.jinja"), "J:{{ messages | length }}{% if add_generation_prompt %}+{% endif %}");
    const j = await loadTokenizerFromDir(withJinja);
    expect(
      j.applyChatTemplate(
        [
          { role: "user", content: "a" },
          { role: "user", content: "b" },
        ],
        { addGenerationPrompt: true },
      ),
    ).toBe("J:2+");
  });

  it("builds from in-memory files too", () => {
    const t = tokenizerFromJson(built.tokenizerJson, built.tokenizerConfig);
    expect(t.encode("Natalia sold 48 clips")).toEqual(tok.encode("Natalia sold 48 clips"));
  });
});
