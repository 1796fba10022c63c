/** The system prompt and the chat messages a question becomes for RL and evaluation. The tool
 *  schema is not written here: the chat template renders it from `tools` (see agents/types.ts). */
import type { ChatMessage } from "../model/types.ts";

/** Short on purpose: a small model learns the format from SFT, the prompt only names it. The answer
 *  format must match what rollout/rewards.ts reads (`\boxed{}`). */
export const SYSTEM_PROMPT =
  "Solve the math problem step by step. Use the calculator tool for arithmetic. Put the final answer in \\boxed{}.";

/** System + user messages for one question; the model's reply starts after these. */
export function toPrompt(question: string, systemPrompt: string = SYSTEM_PROMPT): ChatMessage[] {
  if (!question.trim()) throw new Error("toPrompt: question is empty, expected the text of a math word problem");
  return [
    { role: "system", content: systemPrompt },
    { role: "user", content: question.trim() },
  ];
}
