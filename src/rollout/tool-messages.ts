/** The in-loop side of tool use: run a turn's calls and render their results the way the chat template
 *  renders `tool` messages after an assistant turn, as the text a row is forced to read next.
 *  Leaves out: parsing (agents/toolcall.ts) and tokenizing (the caller encodes the text). */
import { toToolResult, type ParsedToolCall, type Tool } from "../agents/types.ts";
import type { ChatMessage, Tokenizer } from "../model/types.ts";
import { parseToolCalls } from "../agents/toolcall.ts";
import type { ToolCallRecord, Trajectory, TurnRecord } from "./types.ts";

/** Run one parsed call: the one place a call becomes a record (rollouts, eval and chat go through
 *  it). Never rejects: an unknown tool, a throwing tool or one that returns no text becomes error text
 *  the model reads, so one bad call cannot stop the batch. The run's tools (agents/toolset.ts) already
 *  never reject and cap their output; this also holds for a bare Tool a library user passes. */
export async function runToolCall(call: ParsedToolCall, tools: ReadonlyMap<string, Tool>): Promise<ToolCallRecord> {
  const record = (result: string, error: boolean): ToolCallRecord => ({ name: call.name, arguments: call.arguments, result, error });
  const tool = tools.get(call.name);
  if (!tool) return record(`Error: unknown tool "${call.name}"; known tools: ${[...tools.keys()].join(", ") || "(none)"}`, true);
  try {
    const result = toToolResult(await tool.run(call.arguments));
    if (!result) return record(`Error: tool "${call.name}" returned no text`, true);
    // The tool says whether it failed (MCP's isError); a plain string starting "Error" is the built-ins' form.
    return record(result.text, result.isError);
  } catch (err) {
    const msg = err instanceof Error ? err.message : String(err);
    return record(`Error: tool "${call.name}" failed: ${msg.slice(0, 200)}`, true);
  }
}

/** Renders N tool results as the text that follows the assistant's closing stop token, e.g. for Qwen2.5
 *  `\n<|im_start|>user\n<tool_response>\n9\n</tool_response><|im_end|>\n<|im_start|>assistant\n`.
 *  Derived from the tokenizer's own chat template: render a conversation with an assistant tool-call
 *  turn followed by N tool messages holding placeholders, keep what comes after the assistant's stop
 *  token, and cut it at the placeholders. The pieces are cached per N; results are spliced in verbatim
 *  (the template also renders content verbatim). */
export class ToolResponseRenderer {
  private readonly pieces = new Map<number, string[]>();

  /** role "user": the text of one user message after a plain assistant turn (an environment's observation). */
  constructor(
    private readonly tokenizer: Tokenizer,
    private readonly role: "tool" | "user" = "tool",
  ) {}

  render(results: string[]): string {
    if (results.length === 0) throw new Error("ToolResponseRenderer.render needs at least one result; got 0");
    if (this.role === "user" && results.length !== 1) throw new Error(`a user message renders one text; got ${results.length}`);
    const pieces = this.piecesFor(results.length);
    let out = pieces[0];
    for (let i = 0; i < results.length; i++) out += results[i] + pieces[i + 1];
    return out;
  }

  private piecesFor(n: number): string[] {
    const cached = this.pieces.get(n);
    if (cached) return cached;
    const marks = Array.from({ length: n }, (_, i) => `\u0000TOOL_RESULT_${i}\u0000`);
    const head: ChatMessage[] =
      this.role === "tool"
        ? [
            { role: "user", content: "q" },
            { role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: "f", arguments: {} } }] },
          ]
        : [
            { role: "user", content: "q" },
            { role: "assistant", content: "a" },
          ];
    const before = this.tokenizer.applyChatTemplate(head, { addGenerationPrompt: false });
    const full = this.tokenizer.applyChatTemplate([...head, ...marks.map((content): ChatMessage => ({ role: this.role, content }))], {
      addGenerationPrompt: true,
    });
    const stop = this.tokenizer.decode([this.tokenizer.eosTokenId]);
    const cut = before.lastIndexOf(stop);
    if (cut < 0 || !full.startsWith(before.slice(0, cut + stop.length)))
      throw new Error(
        `chat template does not close an assistant tool-call turn with the eos token ` +
          `${JSON.stringify(stop)}; cannot derive the tool-response text`,
      );
    let rest = full.slice(cut + stop.length);
    const pieces: string[] = [];
    for (const mark of marks) {
      const at = rest.indexOf(mark);
      if (at < 0) throw new Error(`chat template did not render a tool message's content; cannot derive the tool-response text`);
      pieces.push(rest.slice(0, at));
      rest = rest.slice(at + mark.length);
    }
    pieces.push(rest);
    this.pieces.set(n, pieces);
    return pieces;
  }
}

/** One closed assistant turn of a tool-using rollout (its text without the stop token): parse its
 *  tool calls, run them, record the turn and count calls, errors and unknown tools in the trajectory.
 *  Returns the texts to send back (results, then parse errors), or null when the turn called nothing:
 *  the final answer. Calls run even when the rollout ends after this turn, so the record shows what
 *  the model asked for. Called by episode.ts, for every loop. */
export async function toolTurn(traj: Trajectory, text: string, tools: ReadonlyMap<string, Tool>): Promise<string[] | null> {
  const parsed = parseToolCalls(text);
  const turn: TurnRecord = { text, content: parsed.content, toolCalls: [], parseErrors: parsed.errors, ended: true };
  traj.turns.push(turn);
  traj.numParseErrors += parsed.errors.length;
  if (parsed.calls.length === 0 && parsed.errors.length === 0) {
    turn.content = text; // the final answer: nothing was taken out
    return null;
  }
  turn.toolCalls = await Promise.all(parsed.calls.map((c) => runToolCall(c, tools)));
  traj.numToolCalls += turn.toolCalls.length;
  traj.numToolErrors += turn.toolCalls.filter((c) => c.error).length;
  traj.numUnknownTools += parsed.calls.filter((c) => !tools.has(c.name)).length;
  return [...turn.toolCalls.map((c) => c.result), ...parsed.errors];
}
