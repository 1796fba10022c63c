/** Tools from an MCP server, through the official SDK's Client: over stdio (`mcp:<command line>`, the
 *  server started as a child process) or Streamable HTTP (`mcp:<http(s) URL>`). Every tool the server
 *  lists (all pages of tools/list) becomes a Tool whose run() sends tools/call:
 *  - the result's text content (other content summarised as "[image]", "[resource …]") goes back to
 *    the model; a result with isError becomes "Error: …" text, as does a protocol error or time-out
 *    (counted as tool errors by the rollout);
 *  - a server that goes away mid-run (the process exits, the HTTP session ends) makes the calls in
 *    flight error text naming the server; the next call starts it once more. If it goes away a second
 *    time, or cannot be started again, every later call is error text naming the server and the run
 *    goes on: the rollouts score the failed calls, the log shows the notice.
 *  A server that cannot be started or does not answer `initialize` and `tools/list` is a UsageError.
 *  Leaves out: resources, prompts, sampling, OAuth. */
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import * as path from "node:path";
import { UsageError } from "../cli.ts";
import type { Tool } from "./types.ts";

export interface McpServerHandle {
  /** What the server is called in messages: the URL or the command line. */
  label: string;
  tools: Tool[];
  close(): Promise<void>;
}

export interface McpOptions {
  /** Per-call time limit in ms. */
  timeoutMs: number;
  /** Limit for starting the server and listing its tools (default: the larger of 120 s and timeoutMs;
   *  `npx` fetching a package or tsx compiling a server takes seconds on a loaded machine). */
  startupTimeoutMs?: number;
  log?: (line: string) => void;
  /** Restarts allowed after the server goes away (default 1). */
  restarts?: number;
}

/** A tool's `_meta` key for its system-prompt sentence (Tool.promptHint); servers may leave it out. */
export const PROMPT_HINT_META = "mini-agentic-rl/prompt_hint";

const MAX_PAGES = 100; // tools/list pages: a server that never stops paginating is a broken server

/** Split a command line into words: whitespace separates, '…' and "…" quote, \ escapes (no expansion). */
export function splitCommandLine(line: string): string[] {
  const words: string[] = [];
  let cur = "", inWord = false, quote: string | null = null;
  for (let i = 0; i < line.length; i++) {
    const ch = line[i];
    if (quote) {
      if (ch === quote) quote = null;
      else if (ch === "\\" && quote === '"' && i + 1 < line.length) cur += line[++i];
      else cur += ch;
    } else if (ch === "'" || ch === '"') {
      quote = ch;
      inWord = true;
    } else if (ch === "\\" && i + 1 < line.length) {
      cur += line[++i];
      inWord = true;
    } else if (/\s/.test(ch)) {
      if (inWord) words.push(cur);
      cur = "";
      inWord = false;
    } else {
      cur += ch;
      inWord = true;
    }
  }
  if (quote) throw new UsageError(`--tools mcp:${line}: unclosed ${quote} quote`);
  if (inWord) words.push(cur);
  return words;
}

/** Connect, list the tools, and wrap each. `target` is a command line or an http(s) URL. */
export async function openMcpServer(target: string, o: McpOptions): Promise<McpServerHandle> {
  if (!target) throw new UsageError(`--tools mcp: needs a command line (mcp:npx -y some-server) or a URL (mcp:http://127.0.0.1:3000/mcp)`);
  const isUrl = /^https?:\/\//i.test(target);
  let url: URL | null = null;
  if (isUrl) {
    try {
      url = new URL(target);
    } catch {
      throw new UsageError(`--tools mcp:${target}: not a valid URL`);
    }
  }
  const words = isUrl ? [] : splitCommandLine(target);
  if (!isUrl && words.length === 0) throw new UsageError(`--tools mcp:${target}: empty command line`);
  const named = url ? url.href : [path.basename(words[0]), ...words.slice(1)].join(" ");
  const label = named.length > 60 ? `${named.slice(0, 57)}...` : named;
  const log = o.log ?? ((line: string) => process.stderr.write(line + "\n"));
  const shown = target.length > 80 ? `${target.slice(0, 77)}...` : target; // in usage errors: as the user wrote it
  const startupMs = o.startupTimeoutMs ?? Math.max(120_000, o.timeoutMs);

  const stderrTail: string[] = []; // the child's last stderr lines, for the start-up error
  const makeTransport = (): Transport => {
    if (url) return new StreamableHTTPClientTransport(url);
    const t = new StdioClientTransport({ command: words[0], args: words.slice(1), stderr: "pipe" });
    t.stderr?.on("data", (chunk: Buffer) => {
      stderrTail.push(...chunk.toString("utf8").split("\n").filter((l) => l.trim()));
      stderrTail.splice(0, Math.max(0, stderrTail.length - 5));
    });
    return t;
  };

  let client: Client | null = null;
  let closing = false;
  let restartsLeft = o.restarts ?? 1;
  let reconnect: Promise<Client | null> | null = null;

  const connect = async (): Promise<Client> => {
    const c = new Client({ name: "mini-agentic-rl", version: "0.1.0" });
    const transport = makeTransport();
    c.onclose = () => {
      if (client !== c) return; // a connection that never came up: the caller reports it
      client = null;
      if (!closing) log(`mcp: server ${label} went away${restartsLeft > 0 ? "; it will be started again on the next call" : ""}`);
    };
    await c.connect(transport, { timeout: startupMs });
    return c;
  };

  try {
    client = await connect();
  } catch (err) {
    throw new UsageError(`--tools mcp:${shown}: server did not start (${reason(err)}${stderrTail.length ? `; stderr: ${stderrTail.slice(-1)[0].slice(0, 200)}` : ""})`);
  }
  let listed;
  try {
    listed = await listAllTools(client, startupMs);
  } catch (err) {
    await client.close().catch(() => {});
    throw new UsageError(`--tools mcp:${shown}: tools/list failed (${reason(err)})`);
  }

  /** The live client, or a restarted one (at most `restarts` times, one attempt shared by concurrent calls). */
  const live = async (): Promise<Client | null> => {
    if (client) return client;
    if (reconnect) return reconnect;
    if (closing || restartsLeft <= 0) return null;
    reconnect = (async () => {
      restartsLeft--;
      try {
        const c = await connect();
        if (closing) {
          await c.close().catch(() => {});
          return null;
        }
        client = c;
        log(`mcp: server ${label} started again`);
        return c;
      } catch (err) {
        log(`mcp: server ${label} could not be started again (${reason(err)}); its tools now answer with an error`);
        return null;
      } finally {
        reconnect = null;
      }
    })();
    return reconnect;
  };

  const tools: Tool[] = listed.map((t) => ({
    name: t.name,
    description: t.description ?? "",
    parameters: (t.inputSchema ?? { type: "object", properties: {} }) as Record<string, unknown>,
    ...(typeof t._meta?.[PROMPT_HINT_META] === "string" ? { promptHint: t._meta[PROMPT_HINT_META] as string } : {}),
    run: async (args) => {
      const c = await live();
      if (!c) return `Error: MCP server ${label} is not running; tool "${t.name}" is unavailable`;
      try {
        const result = await c.callTool({ name: t.name, arguments: args }, undefined, { timeout: o.timeoutMs });
        return resultText(result as CallResult);
      } catch (err) {
        if (isTimeout(err)) return `Error: tool "${t.name}" took longer than ${o.timeoutMs / 1000} s`;
        return `Error: MCP server ${label} failed on "${t.name}" (${reason(err)})`;
      }
    },
  }));

  return {
    label,
    tools,
    close: async () => {
      closing = true;
      const c = client;
      client = null;
      if (!c) return;
      const transport = c.transport;
      if (transport instanceof StreamableHTTPClientTransport) await transport.terminateSession().catch(() => {});
      await c.close().catch(() => {});
    },
  };
}

interface ListedTool {
  name: string;
  description?: string;
  inputSchema?: unknown;
  _meta?: Record<string, unknown>;
}

async function listAllTools(client: Client, timeoutMs: number): Promise<ListedTool[]> {
  const out: ListedTool[] = [];
  let cursor: string | undefined;
  for (let page = 0; page < MAX_PAGES; page++) {
    const r = await client.listTools(cursor === undefined ? undefined : { cursor }, { timeout: timeoutMs });
    out.push(...r.tools);
    cursor = r.nextCursor;
    if (!cursor) return out;
  }
  throw new Error(`more than ${MAX_PAGES} pages of tools`);
}

interface CallResult {
  content?: Array<{ type: string; text?: string; uri?: string; resource?: { uri?: string; text?: string } }>;
  structuredContent?: unknown;
  isError?: boolean;
  toolResult?: unknown; // protocol versions before 2025-03-26
}

/** The text the model reads for one tools/call result. */
export function resultText(r: CallResult): string {
  const parts = (r.content ?? []).map((c) => {
    if (c.type === "text") return c.text ?? "";
    if (c.type === "resource") return c.resource?.text ?? `[resource ${c.resource?.uri ?? ""}]`;
    if (c.type === "resource_link") return `[resource ${c.uri ?? ""}]`;
    return `[${c.type}]`;
  });
  let text = parts.join("\n");
  if (!text && r.structuredContent !== undefined) text = JSON.stringify(r.structuredContent);
  if (!text && r.toolResult !== undefined) text = JSON.stringify(r.toolResult);
  if (r.isError) return /^error\b/i.test(text.trimStart()) ? text : `Error: ${text || "the tool reported an error"}`;
  return text;
}

function isTimeout(err: unknown): boolean {
  return (err as { code?: number })?.code === -32001; // ErrorCode.RequestTimeout
}

function reason(err: unknown): string {
  const e = err as { message?: string; code?: string | number; cause?: { code?: string; message?: string } };
  const msg = String(e?.cause?.code ?? e?.code ?? "") === "ENOENT" ? "command not found" : String(e?.message ?? err);
  return msg.replace(/\s+/g, " ").slice(0, 200);
}
