/** Tools from an MCP server, through the official SDK's Client: over stdio (a command line, the server
 *  started in its own process group by mcp-stdio.ts) or Streamable HTTP (a URL, with optional headers).
 *  Servers are described by McpServerSpecs (mcp-config.ts). The tools the server lists (all pages of
 *  tools/list) become Tools whose run() sends tools/call:
 *  - offered: every listed tool the client can call, narrowed by the spec's includeTools/excludeTools
 *    and renamed with its prefix; tools whose `execution.taskSupport` is "required" are left out (this
 *    client does not run MCP tasks). This client declares no sampling, elicitation or roots, so a
 *    current server does not list the tools that need them; an older one may (excludeTools);
 *  - `notifications/tools/list_changed`: the list is fetched again and the handle's onToolsChanged
 *    called; a tool the server stopped listing answers with an error;
 *  - a result's text content goes back to the model; images, audio and binary resources become
 *    placeholders ("[image]", "[resource URI]": the models here read text only); the result's `isError`
 *    decides whether the call counts as a tool error (its text then reads "Error: …"), as do a
 *    protocol error and a time-out; text that merely starts with "Error" is a success;
 *  - a stdio server that goes away mid-run (the process exits) makes the calls in flight error text
 *    naming the server; the next call starts it once more. If it goes away a second time, or cannot be
 *    started again, every later call is error text naming the server and the run goes on;
 *  - an HTTP session that is lost (404: expired, as the spec has it; 400: the server restarted and
 *    does not know the session) is initialized anew and the call sent once more, as the spec requires.
 *  A server that cannot be started or does not answer `initialize` and `tools/list` is a UsageError.
 *  Leaves out: resources, prompts, sampling, elicitation, tasks, OAuth. */
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport, StreamableHTTPError } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import { ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";
import * as path from "node:path";
import { UsageError } from "../util/errors.ts";
import { parseMcpItem, type McpServerSpec } from "./mcp-config.ts";
import { ProcessGroupStdioTransport } from "./mcp-stdio.ts";
import type { Tool, ToolResult } from "./types.ts";

export { splitCommandLine } from "./mcp-config.ts";

export interface McpServerHandle {
  /** What the server is called in messages: its name in a config file, the URL or the command line. */
  label: string;
  /** The tools offered now (list_changed replaces them). */
  tools: Tool[];
  /** Called with the new list after the server announced a change and it was fetched again. */
  onToolsChanged?: (tools: Tool[]) => void;
  close(): Promise<void>;
}

export interface McpOptions {
  /** Per-call time limit in ms. */
  timeoutMs: number;
  /** Limit for starting the server and listing its tools (default: the larger of 120 s and timeoutMs;
   *  `npx` fetching a package or tsx compiling a server takes seconds on a loaded machine). */
  startupTimeoutMs?: number;
  log?: (line: string) => void;
  /** Restarts allowed after a stdio server goes away (default 1). */
  restarts?: number;
}

/** A tool's `_meta` key for its system-prompt sentence (Tool.promptHint); servers may leave it out. */
export const PROMPT_HINT_META = "mini-agentic-rl/prompt_hint";

const MAX_PAGES = 100; // tools/list pages: a server that never stops paginating is a broken server
const CLIENT_INFO = { name: "mini-agentic-rl", version: "0.1.0" };

/** Connect, list the tools, and wrap each. `target` is a spec, or the text after `mcp:` (a command line or URL). */
export async function openMcpServer(target: McpServerSpec | string, o: McpOptions): Promise<McpServerHandle> {
  const spec = typeof target === "string" ? parseMcpItem(`mcp:${target}`) : target;
  const named = spec.name ?? (spec.url ? new URL(spec.url).href : [path.basename(spec.command!), ...(spec.args ?? [])].join(" "));
  const label = named.length > 60 ? `${named.slice(0, 57)}...` : named;
  const log = o.log ?? ((line: string) => process.stderr.write(line + "\n"));
  const shown = spec.source.length > 80 ? `${spec.source.slice(0, 77)}...` : spec.source; // in usage errors: as the user wrote it
  const startupMs = o.startupTimeoutMs ?? Math.max(120_000, o.timeoutMs);

  const stderrTail: string[] = []; // the child's last stderr lines, for the start-up error
  const makeTransport = (): Transport => {
    if (spec.url) return new StreamableHTTPClientTransport(new URL(spec.url), { requestInit: { headers: spec.headers } });
    return new ProcessGroupStdioTransport({
      command: spec.command!,
      args: spec.args ?? [],
      env: spec.env,
      cwd: spec.cwd,
      onStderrLine: (line) => {
        stderrTail.push(line);
        stderrTail.splice(0, Math.max(0, stderrTail.length - 5));
      },
    });
  };

  let client: Client | null = null;
  let closing = false;
  let restartsLeft = o.restarts ?? 1;
  let reconnect: Promise<Client | null> | null = null;
  const handle: McpServerHandle = { label, tools: [], close: async () => {} };
  let offered = new Map<string, ListedTool>(); // server-side name → its listing

  const connect = async (): Promise<Client> => {
    const c = new Client(CLIENT_INFO);
    c.onclose = () => {
      if (client !== c) return; // a connection that never came up, or one dropped on purpose
      client = null;
      if (!closing) log(`mcp: server ${label} went away${restartsLeft > 0 ? "; it will be started again on the next call" : ""}`);
    };
    c.setNotificationHandler(ToolListChangedNotificationSchema, () => void refresh(c));
    try {
      await c.connect(makeTransport(), { timeout: startupMs });
    } catch (err) {
      await c.close().catch(() => {}); // a stdio child that started but never answered is stopped
      throw err;
    }
    return c;
  };

  /** tools/list again after list_changed; the handle's tools are replaced and onToolsChanged told. */
  const refresh = async (c: Client) => {
    try {
      const listed = await listAllTools(c, startupMs);
      const fresh = pick(listed, spec, label, null);
      // unchanged, e.g. announced right after initialize
      if (client !== c || JSON.stringify([...fresh.values()]) === JSON.stringify([...offered.values()])) return;
      offered = fresh;
      handle.tools = [...offered.values()].map(wrap);
      log(`mcp: server ${label} changed its tools; now ${handle.tools.map((t) => t.name).join(", ") || "(none)"}`);
      handle.onToolsChanged?.(handle.tools);
    } catch (err) {
      log(`mcp: server ${label} announced new tools, but tools/list failed (${reason(err)}); the old list stays`);
    }
  };

  try {
    client = await connect();
  } catch (err) {
    throw new UsageError(
      `--tools ${shown}: server did not start ` +
        `(${reason(err)}${stderrTail.length ? `; stderr: ${stderrTail.slice(-1)[0].slice(0, 200)}` : ""})`,
    );
  }
  let listed: ListedTool[];
  try {
    listed = await listAllTools(client, startupMs);
  } catch (err) {
    closing = true;
    await client.close().catch(() => {});
    throw new UsageError(`--tools ${shown}: tools/list failed (${reason(err)})`);
  }
  try {
    offered = pick(listed, spec, label, log);
  } catch (err) {
    closing = true;
    await client.close().catch(() => {});
    throw err;
  }

  /** The live client, or a restarted one (one attempt shared by concurrent calls). A restart after a
   *  crash uses up one of `restarts`; a new session after a lost one (`free`) does not. */
  const live = async (free = false): Promise<Client | null> => {
    if (client) return client;
    if (reconnect) return reconnect;
    if (closing || (!free && restartsLeft <= 0)) return null;
    if (!free) restartsLeft--;
    reconnect = (async () => {
      try {
        const c = await connect();
        if (closing) {
          await c.close().catch(() => {});
          return null;
        }
        client = c;
        log(`mcp: server ${label} ${free ? "has a new session" : "started again"}`);
        return c;
      } catch (err) {
        log(
          `mcp: server ${label} could not be ${free ? "reached for a new session" : "started again"} (${reason(err)})` +
            (!free && restartsLeft <= 0 ? "; its tools now answer with an error" : ""),
        );
        return null;
      } finally {
        reconnect = null;
      }
    })();
    return reconnect;
  };

  const call = async (name: string, shownName: string, args: Record<string, unknown>, retried = false): Promise<ToolResult> => {
    const fail = (text: string): ToolResult => ({ text, isError: true });
    if (!offered.has(name)) return fail(`Error: MCP server ${label} no longer offers tool "${shownName}"`);
    const c = await live(retried);
    if (!c) return fail(`Error: MCP server ${label} is not running; tool "${shownName}" is unavailable`);
    try {
      return resultOf((await c.callTool({ name, arguments: args }, undefined, { timeout: o.timeoutMs })) as CallResult);
    } catch (err) {
      if (isTimeout(err)) return fail(`Error: tool "${shownName}" took longer than ${o.timeoutMs / 1000} s`);
      const lost = sessionLost(err);
      if (lost && !retried) {
        if (client === c) {
          client = null; // onclose now ignores it
          log(`mcp: server ${label} lost the session (HTTP ${lost}); initializing a new one`);
          void c.close().catch(() => {});
        }
        return call(name, shownName, args, true);
      }
      return fail(`Error: MCP server ${label} failed on "${shownName}" (${reason(err)})`);
    }
  };

  const wrap = (t: ListedTool): Tool => {
    const shownName = `${spec.prefix ?? ""}${t.name}`;
    return {
      name: shownName,
      description: t.description ?? "",
      parameters: (t.inputSchema ?? { type: "object", properties: {} }) as Record<string, unknown>,
      // A renamed tool drops its prompt sentence (it names the tool); the description stands in.
      ...(typeof t._meta?.[PROMPT_HINT_META] === "string" && !spec.prefix ? { promptHint: t._meta[PROMPT_HINT_META] as string } : {}),
      run: (args) => call(t.name, shownName, args),
    };
  };
  handle.tools = [...offered.values()].map(wrap);
  handle.close = async () => {
    closing = true;
    const c = client;
    client = null;
    if (!c) return;
    const transport = c.transport;
    if (transport instanceof StreamableHTTPClientTransport) await transport.terminateSession().catch(() => {});
    await c.close().catch(() => {});
  };
  return handle;
}

interface ListedTool {
  name: string;
  description?: string;
  inputSchema?: unknown;
  execution?: { taskSupport?: string };
  _meta?: Record<string, unknown>;
}

/** The listed tools the spec asks for and the client can call, by server-side name. An includeTools
 *  name the server does not list is a UsageError (a typo would silently drop a tool); `log` null:
 *  a refresh, where it is not. */
function pick(listed: ListedTool[], spec: McpServerSpec, label: string, log: ((line: string) => void) | null): Map<string, ListedTool> {
  const byName = new Map(listed.map((t) => [t.name, t]));
  if (log && spec.includeTools) {
    const missing = spec.includeTools.filter((n) => !byName.has(n));
    if (missing.length)
      throw new UsageError(
        `--tools ${spec.source}: the server lists no tool ${missing.map((n) => `"${n}"`).join(", ")}; it ` +
          `lists ${listed.map((t) => t.name).join(", ") || "none"}`,
      );
  }
  const out = new Map<string, ListedTool>();
  const needTasks: string[] = [];
  for (const t of listed) {
    if (spec.includeTools && !spec.includeTools.includes(t.name)) continue;
    if (spec.excludeTools?.includes(t.name)) continue;
    if (t.execution?.taskSupport === "required") needTasks.push(t.name);
    else out.set(t.name, t);
  }
  if (log && needTasks.length)
    log(`mcp: server ${label}: left out ${needTasks.join(", ")} (they must run as MCP tasks, which this client does not do)`);
  return out;
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

/** The text the model reads for one tools/call result, and whether the server flagged it an error. */
export function resultOf(r: CallResult): ToolResult {
  const parts = (r.content ?? []).map((c) => {
    if (c.type === "text") return c.text ?? "";
    if (c.type === "resource") return c.resource?.text ?? `[resource ${c.resource?.uri ?? ""}]`;
    if (c.type === "resource_link") return `[resource ${c.uri ?? ""}]`;
    return `[${c.type}]`; // image, audio: the models here read text
  });
  let text = parts.join("\n");
  if (!text && r.structuredContent !== undefined) text = JSON.stringify(r.structuredContent);
  if (!text && r.toolResult !== undefined) text = JSON.stringify(r.toolResult);
  if (r.isError !== true) return { text, isError: false };
  return { text: /^error\b/i.test(text.trimStart()) ? text : `Error: ${text || "the tool reported an error"}`, isError: true };
}

/** The HTTP status when an error means the server no longer knows this client's session: 404 (the
 *  spec's answer to an expired or unknown session) or 400 (what the SDK's examples answer a session id
 *  they never issued, e.g. after a restart). */
function sessionLost(err: unknown): number | null {
  return err instanceof StreamableHTTPError && (err.code === 404 || err.code === 400) ? err.code : null;
}

function isTimeout(err: unknown): boolean {
  return (err as { code?: number })?.code === -32001; // ErrorCode.RequestTimeout
}

function reason(err: unknown): string {
  const e = err as { message?: string; code?: string | number; cause?: { code?: string; message?: string } };
  const msg = String(e?.cause?.code ?? e?.code ?? "") === "ENOENT" ? "command not found" : String(e?.message ?? err);
  return msg.replace(/\s+/g, " ").slice(0, 200);
}
