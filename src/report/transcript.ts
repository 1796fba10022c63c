/** One rollout's conversation as HTML: each assistant turn (sampled by the policy) with its
 *  <tool_call> blocks marked, then each tool result the rollout was made to read (forced tokens,
 *  grey, red when the tool failed), parse errors, and a note where the token budget ran out. All of
 *  it is model- or tool-written text: escaped, and capped at `maxChars` with the rest counted. */
import type { TurnRecord } from "../rollout/types.ts";
import { capText, escapeHtml } from "./html.ts";

/** Assistant text with each <tool_call>…</tool_call> block (closed or not) wrapped in span.call. */
function markCalls(text: string): string {
  return text
    .split(/(<tool_call>[\s\S]*?(?:<\/tool_call>|$))/)
    .map((part, i) => (i % 2 === 1 ? `<span class="call">${escapeHtml(part)}</span>` : escapeHtml(part)))
    .join("");
}

/** Pieces are added while the character budget lasts; the rest is counted, not shown. */
class Budget {
  omitted = 0;
  constructor(private left: number) {}
  take(s: string): string {
    const c = capText(s, Math.max(0, this.left));
    this.left -= c.text.length;
    this.omitted += c.omitted;
    return c.text;
  }
}

function cutNote(omitted: number, where: string): string {
  return omitted > 0 ? `<span class="cut">… ${omitted} more characters in ${escapeHtml(where)}</span>` : "";
}

/** `turns` as written in trajectories.jsonl / samples-*.jsonl. */
export function renderTurns(turns: readonly TurnRecord[], opts: { maxChars?: number; source?: string } = {}): string {
  const budget = new Budget(opts.maxChars ?? 4000);
  const out: string[] = [];
  for (const turn of turns ?? []) {
    const text = budget.take(String(turn.text ?? ""));
    out.push(
      `<span class="turn">${markCalls(text)}${turn.ended === false ? `<span class="cut"> [token budget ran out]</span>` : ""}</span>`,
    );
    for (const c of turn.toolCalls ?? []) {
      const result = budget.take(String(c.result ?? ""));
      out.push(
        `<span class="res${c.error ? " err" : ""}" title="forced tokens: the tool's answer, not ` +
          `sampled">${escapeHtml(String(c.name ?? "?"))} → ${escapeHtml(result)}</span>`,
      );
    }
    for (const e of turn.parseErrors ?? [])
      out.push(`<span class="res perr">tool call not parsed: ${escapeHtml(budget.take(String(e)))}</span>`);
    // An environment's answer to this turn's action (runs with an environment instead of tools).
    const env = turn as { observation?: unknown; reward?: unknown };
    if (typeof env.observation === "string") {
      const r = typeof env.reward === "number" ? ` (reward ${env.reward})` : "";
      out.push(
        `<span class="res" title="forced tokens: what the environment answered, not ` +
          `sampled">observation${escapeHtml(r)} → ${escapeHtml(budget.take(env.observation))}</span>`,
      );
    }
  }
  return `<pre class="tx">${out.join("")}${cutNote(budget.omitted, opts.source ?? "the log")}</pre>`;
}

/** A transcript stored as one plain string (older samples files). */
export function renderPlain(text: string, opts: { maxChars?: number; source?: string } = {}): string {
  const c = capText(text, opts.maxChars ?? 4000);
  return `<pre class="tx"><span class="turn">${markCalls(c.text)}</span>${cutNote(c.omitted, opts.source ?? "the log")}</pre>`;
}

export const TRANSCRIPT_LEGEND =
  `<p class="legend"><span class="tag" style="border-left:3px solid #2563eb">assistant (sampled)</span>` +
  `<span class="tag" style="background:#e0ecff">tool call</span>` +
  `<span class="tag" style="background:#f3f4f6;border-left:3px solid #9ca3af">tool result (forced tokens, not trained on)</span>` +
  `<span class="tag bad">tool error / unparsed call</span></p>`;
