/** The tool-call conversation that test/fixtures/qwen2.5-chat-template/README.md shows rendered. */
import type { ChatMessage, ToolSchema } from "../../../src/model/types.ts";

export const tools: ToolSchema[] = [
  {
    type: "function",
    function: {
      name: "calculator",
      description: "Evaluate an arithmetic expression",
      parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] },
    },
  },
];

export const conversation: ChatMessage[] = [
  { role: "system", content: "Solve the problem. Use the calculator." },
  { role: "user", content: "Janet has 16 eggs..." },
  {
    role: "assistant",
    content: "Janet sells 16 - 3 - 4 = ",
    tool_calls: [{ type: "function", function: { name: "calculator", arguments: { expression: "16-3-4" } } }],
  },
  { role: "tool", content: "9" },
  { role: "assistant", content: "9 eggs. The answer is \\boxed{18}." },
];
