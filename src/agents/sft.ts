/** GSM8K solutions as tool-calling conversations for SFT. Each `<<expr=result>>` annotation ends an
 *  assistant turn with a calculator call; a tool message carries the result; the next assistant turn
 *  goes on with the text after the annotation (which in GSM8K restates the result: "= <<48/2=24>>24
 *  clips"). The `#### N` line becomes "The answer is \boxed{N}." — the format rollout/rewards.ts reads.
 *
 *  Sloppy annotations: toConversation trusts the annotated result (it is synchronous and needs no
 *  tool). buildSftConversations then re-runs every call with the real calculator, puts the
 *  calculator's own text in the tool messages (so SFT shows exactly what rollouts will show), keeps
 *  rounded annotations (the solution text keeps its rounding, like a person would), and drops examples
 *  whose annotation is wrong or that the calculator cannot evaluate, with a count.
 *
 *  Steps worked out in the text: `inlineShare` writes a seeded share of the steps (optionally only
 *  those with the `inlineOps` operators) as GSM8K's visible text, result inline and no call, so the
 *  demonstrations sometimes skip the tool, as human-written solutions do. */
import type { ChatMessage, Tokenizer } from "../model/types.ts";
// In agents/, not datasets/: an SFT conversation is the agent's own prompt and tool messages around
// GSM8K's annotations, built from the agent's prompt (toPrompt) and tool-result shape, not a copy of
// them that could drift from what rollouts see.
import { toolSchema, toToolResult, type Tool } from "./types.ts";
import { toPrompt } from "./prompts.ts";
import { answerValue, normalizeNumber } from "../datasets/answer.ts";
import { normalizeExpression, parseAnnotations } from "../datasets/annotations.ts";
import type { Gsm8kExample } from "../datasets/gsm8k.ts";
import { Rng } from "../util/rng.ts";

export const CALCULATOR = "calculator";

export interface ConversationOptions {
  systemPrompt?: string;
  /** Steps (0-based, in order) written as plain text instead of a calculator call: the annotation is
   *  dropped and the result stays inline, as GSM8K's own text reads ("= 24 clips"). Default: none. */
  inline?: (expression: string, step: number) => boolean;
}

/** system, user, then assistant/tool turns as described above. */
export function toConversation(ex: Gsm8kExample, opts: ConversationOptions = {}): ChatMessage[] {
  const hash = ex.answer.lastIndexOf("####");
  if (hash < 0) throw new Error(`example ${ex.id}: answer has no "#### N" line`);
  const body = ex.answer.slice(0, hash);
  const messages = toPrompt(ex.question, opts.systemPrompt);
  let cursor = 0;
  let text = ""; // assistant text not yet in a message
  parseAnnotations(body).forEach((ann, step) => {
    text += body.slice(cursor, ann.start);
    cursor = ann.end;
    if (opts.inline?.(ann.expression, step)) return;
    messages.push({
      role: "assistant",
      // Trailing spaces dropped: the template puts "\n<tool_call>" right after the content.
      content: text.trimEnd(),
      tool_calls: [{ type: "function", function: { name: CALCULATOR, arguments: { expression: normalizeExpression(ann.expression) } } }],
    });
    messages.push({ role: "tool", content: normalizeNumber(ann.result) ?? ann.result });
    text = "";
  });
  const rest = (text + body.slice(cursor)).trimEnd();
  messages.push({ role: "assistant", content: `${rest}${rest ? "\n" : ""}The answer is \\boxed{${ex.gold}}.` });
  return messages;
}

/** ok: same text; format: same value, other text ("0.4" vs "0.40"); rounded: the annotation is the
 *  calculator's value rounded or cut to the annotation's decimals; wrong: another value; error: the
 *  tool did not return a number. */
export type ToolCheckStatus = "ok" | "format" | "rounded" | "wrong" | "error";
export interface ToolCheck {
  expression: string;
  annotated: string; // the tool message toConversation wrote
  computed: string; // what the tool returned
  status: ToolCheckStatus;
}

/** Re-run every tool call of a conversation and compare with the tool message that follows it. */
export async function verifyConversation(conv: ChatMessage[], tool: Pick<Tool, "name" | "run">): Promise<ToolCheck[]> {
  const checks: ToolCheck[] = [];
  for (let i = 0; i < conv.length; i++) {
    for (const call of conv[i].tool_calls ?? []) {
      if (call.function.name !== tool.name)
        throw new Error(`message ${i} calls tool "${call.function.name}", but the tool given is "${tool.name}"`);
      const args = call.function.arguments;
      const parsedArgs = typeof args === "string" ? (JSON.parse(args) as Record<string, unknown>) : args;
      const annotated = conv[i + 1]?.role === "tool" ? conv[i + 1].content : "";
      const computed = (toToolResult(await tool.run(parsedArgs))?.text ?? "").trim();
      checks.push({ expression: String(parsedArgs.expression), annotated, computed, status: compareResults(annotated, computed) });
    }
  }
  return checks;
}

/** How an annotated result relates to the calculator's. */
export function compareResults(annotated: string, computed: string): ToolCheckStatus {
  const c = normalizeNumber(computed);
  if (c === null) return "error";
  if (computed === annotated) return "ok";
  const a = normalizeNumber(annotated);
  const av = a !== null ? Number(a) : answerValue(annotated); // a fraction like "3/4" is a value too
  if (av === null) return "wrong";
  const cv = Number(c);
  if (Math.abs(av - cv) <= 1e-9 * Math.max(Math.abs(av), Math.abs(cv))) return "format";
  if (a === null) return "wrong";
  // Rounded or cut to the annotation's decimals: 3.33 or 3.3 for 3.3333; 3 or 4 for 3.5; not 3.4.
  const scale = 10 ** (a.split(".")[1]?.length ?? 0);
  const close = (x: number) => Math.abs(x / scale - av) <= 1e-9 * Math.max(1, Math.abs(av));
  return close(Math.round(cv * scale)) || close(Math.trunc(cv * scale)) ? "rounded" : "wrong";
}

export interface SftBuild {
  conversations: ChatMessage[][];
  ids: string[]; // example id of each conversation
  dropped: { id: string; checks: ToolCheck[] }[]; // examples with a wrong or failing tool call
  counts: Record<ToolCheckStatus, number>; // over all tool calls, kept and dropped
  mismatches: { id: string; kept: boolean; check: ToolCheck }[]; // every call whose status is not "ok"
  inlined: number; // steps written as text (inlineShare), in kept conversations
}

export const INLINE_OPS = ["+", "-", "*", "/", "^", "%"];

/** The arithmetic operators of an expression: "(3+4)*2" → ["+", "*"]. */
export function operators(expression: string): string[] {
  return normalizeExpression(expression).match(/[-+*/^%]/g) ?? [];
}

export interface BuildOptions {
  systemPrompt?: string;
  /** Share of eligible calculator steps written as plain text, result inline (default 0), like the
   *  steps people work out in their heads: SFT then imitates a policy that sometimes skips the tool. */
  inlineShare?: number;
  /** Steps are eligible when every operator in them is one of these (default: all). */
  inlineOps?: string[];
  seed?: number; // which steps are inlined: the same for the same seed
}

/** Conversations checked against the real tool, with its own text in the tool messages. */
export async function buildSftConversations(
  examples: Gsm8kExample[],
  tool: Pick<Tool, "name" | "run">,
  opts: BuildOptions = {},
): Promise<SftBuild> {
  const share = opts.inlineShare ?? 0;
  if (!(share >= 0 && share <= 1)) throw new Error(`inline share ${share} must be between 0 and 1`);
  const ops = opts.inlineOps ?? INLINE_OPS;
  const bad = ops.filter((op) => !INLINE_OPS.includes(op));
  if (bad.length > 0) throw new Error(`inline ops [${bad.join(" ")}] not known; expected some of ${INLINE_OPS.join(" ")}`);
  const rng = new Rng(opts.seed ?? 0);
  const out: SftBuild = {
    conversations: [],
    ids: [],
    dropped: [],
    counts: { ok: 0, format: 0, rounded: 0, wrong: 0, error: 0 },
    mismatches: [],
    inlined: 0,
  };
  for (const ex of examples) {
    const r = rng.fork(); // one stream per example: its steps do not depend on the others
    let inlined = 0;
    const inline = (expression: string) => {
      const yes = operators(expression).every((op) => ops.includes(op)) && r.next() < share;
      if (yes) inlined++;
      return yes;
    };
    const conv = toConversation(ex, { systemPrompt: opts.systemPrompt, inline: share > 0 ? inline : undefined });
    const checks = await verifyConversation(conv, tool);
    const drop = checks.some((c) => c.status === "wrong" || c.status === "error");
    for (const check of checks) {
      out.counts[check.status]++;
      if (check.status !== "ok") out.mismatches.push({ id: ex.id, kept: !drop, check });
    }
    if (drop) {
      out.dropped.push({ id: ex.id, checks });
      continue;
    }
    let k = 0;
    const fixed = conv.map((m) => (m.role === "tool" ? { ...m, content: checks[k++].computed } : m));
    out.conversations.push(fixed);
    out.inlined += inlined;
    out.ids.push(ex.id);
  }
  return out;
}

/** SFT's training rows: the conversations (buildSftConversations) tokenized with the tool's schema in
 *  the prompt (or not), with the assistant's tokens as the loss mask; those over maxLength tokens are
 *  left out (`built` says how many conversations there were). */
export async function encodeSftConversations(
  examples: Gsm8kExample[],
  tool: Tool,
  tokenizer: Tokenizer,
  opts: BuildOptions & { toolsInPrompt: boolean; maxLength: number },
): Promise<{ built: SftBuild; encoded: { ids: number[]; assistantMask: number[] }[] }> {
  const built = await buildSftConversations(examples, tool, opts);
  const tools = opts.toolsInPrompt ? [toolSchema(tool)] : undefined;
  const encoded = built.conversations.map((c) => tokenizer.encodeChat(c, { tools })).filter((e) => e.ids.length <= opts.maxLength);
  return { built, encoded };
}
