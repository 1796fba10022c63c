/** The system prompt and the chat messages a question becomes for RL and evaluation. The prompt is
 *  built from the run's tools and the task's answer schema; the tool schemas themselves are not written
 *  here: the chat template renders them from `tools` (see agents/types.ts). */
import { ANSWER_INSTRUCTIONS, type AnswerSchema } from "../datasets/answer.ts";
import { UsageError } from "../util/errors.ts";
import type { ChatMessage, Tokenizer } from "../model/types.ts";
import { toolSchema, type Tool } from "./types.ts";

/** The prompt of the calculator agent, what systemPromptFor([calculatorTool]) gives. Short on purpose:
 *  a small model learns the format from SFT, the prompt only names it. The answer format must match
 *  what datasets/scorers.ts reads (`\boxed{}`). */
export const SYSTEM_PROMPT =
  "Solve the math problem step by step. Use the calculator tool for arithmetic. Put the final answer in \\boxed{}.";

/** One sentence per tool (its promptHint, or its name and description), then the answer schema's
 *  instruction. A task scored by anything but `math` is called a task, not a math problem. */
export function systemPromptFor(tools: readonly Tool[], answerSchema: AnswerSchema = "boxed", scorer = "math"): string {
  const parts = [scorer === "math" ? "Solve the math problem step by step." : "Solve the task step by step."];
  for (const t of tools) parts.push(t.promptHint ?? `Use the ${t.name} tool (${oneLine(t.description)}).`);
  parts.push(ANSWER_INSTRUCTIONS[answerSchema]);
  return parts.join(" ");
}

function oneLine(text: string): string {
  const s = text.replace(/\s+/g, " ").trim().replace(/\.$/, "");
  return s.length > 120 ? `${s.slice(0, 117)}...` : s || "no description";
}

/** System + user messages for one question; the model's reply starts after these. */
export function toPrompt(question: string, systemPrompt: string = SYSTEM_PROMPT): ChatMessage[] {
  if (!question.trim()) throw new Error("toPrompt: question is empty, expected the text of a math word problem");
  return [
    { role: "system", content: systemPrompt },
    { role: "user", content: question.trim() },
  ];
}

/** A UsageError when the system prompt with the tools' schemas, plus `reserve` tokens for the reply,
 *  does not fit the model's context: an MCP server's many tools can fill a small model's context
 *  (server-everything's 12 schemas are 3,886 tokens with the tiny tokenizer; its context is 1,024), and
 *  every reply would fail. */
export function checkToolsFit(
  tokenizer: Tokenizer,
  contextLength: number,
  tools: readonly Tool[],
  reserve: number,
  toolsInPrompt = true,
): void {
  const text = tokenizer.applyChatTemplate(
    [
      { role: "system", content: systemPromptFor(tools) },
      { role: "user", content: "?" },
    ],
    {
      tools: toolsInPrompt && tools.length > 0 ? tools.map(toolSchema) : undefined,
      addGenerationPrompt: true,
    },
  );
  const n = tokenizer.encode(text).length;
  if (n + reserve > contextLength)
    throw new UsageError(
      `the system prompt with ${tools.length} tool${tools.length === 1 ? "" : "s"} is ${n} tokens; with ` +
        `${reserve} new tokens it does not fit the model's context of ${contextLength}; offer fewer tools ` +
        `(mcp[tools=a+b]:…) or lower --max_new_tokens`,
    );
}
