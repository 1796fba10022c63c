/** The tools of one run, from `--tools` items: a built-in tool by name (builtin.ts: `calculator`), an MCP server
 *  (`mcp:<command line>` over stdio, `mcp:<http(s) URL>` over Streamable HTTP, either with options:
 *  `mcp[prefix=…,tools=a+b]:…`), or an `mcpServers` JSON file by its path (`./mcp.json`: every server
 *  in it; mcp-config.ts). Every tool is wrapped in the same limits, whatever it is: a per-call time
 *  limit (unless the tool bounds its own calls more tightly, as the calculator's sandbox does) and an
 *  output cap with a visible truncation marker, and run() never rejects. Starting and stopping
 *  what the tools need (the calculator's worker, MCP server processes and sessions) is the tool set's
 *  job: scripts call close() and nothing tool-specific. An MCP server that changes its tools
 *  (list_changed) changes `tools` in place. Leaves out: per-tool limits. */
import { UsageError } from "../util/errors.ts";
import { parseMcpItem, readMcpConfig, type McpServerSpec } from "./mcp-config.ts";
import { BUILTIN_TOOLS, DEFAULT_TOOLS } from "./builtin.ts";
import { toToolResult, type Tool, type ToolResult } from "./types.ts";

export interface ToolSetOptions {
  /** Per-call time limit in ms (default 30 s). */
  timeoutMs?: number;
  /** Longest tool result in characters; longer ones are cut and marked (default 4,000). */
  maxChars?: number;
  /** Where an MCP server's notices go (a crash, a restart). Default stderr. */
  log?: (line: string) => void;
}

export interface ToolSet {
  /** The tools now; an MCP server's list_changed updates this array in place. */
  tools: Tool[];
  /** Stops every server and worker the tools hold. Safe to call twice. */
  close(): Promise<void>;
}

/** No tools: what a run on an environment (whose actions are the tools) opens. */
export function noTools(): ToolSet {
  return { tools: [], close: async () => {} };
}

export const DEFAULT_TOOL_TIMEOUT_MS = 30_000;
export const DEFAULT_TOOL_MAX_CHARS = 4_000;

const MCP_ITEM = /^mcp(?:\[[^\]]*\])?:/;
const CONFIG_ITEM = /^[^,]*\.json$/i;

/** "calculator,mcp:node server.js" → ["calculator", "mcp:node server.js"]. A comma starts a new item
 *  only before `mcp:`, `mcp[`, a bare tool name or a path ending in .json, so an MCP command line may
 *  hold commas unless a comma in it is followed by a lone word. */
export function splitToolSpecs(list: string): string[] {
  const specs = list.split(/,(?=\s*(?:mcp(?:\[[^\]]*\])?:|[A-Za-z_][\w-]*\s*(?:,|$)|[^,]*\.json\s*(?:,|$)))/).map((s) => s.trim());
  const bad = specs.find((s) => !MCP_ITEM.test(s) && !CONFIG_ITEM.test(s) && !/^[A-Za-z_][\w-]*$/.test(s));
  if (bad !== undefined)
    throw new UsageError(
      `--tools ${JSON.stringify(list)}: ${JSON.stringify(bad)} is not a tool name, mcp:<command line|URL> ` +
        `or an mcpServers .json file; expected e.g. calculator,mcp:npx -y some-mcp-server`,
    );
  return specs;
}

/** A run config's tools: `tools` specs (default DEFAULT_TOOLS), `toolTimeout` in seconds, `toolMaxChars`. */
export function openRunTools(
  cfg: { tools?: string[]; toolTimeout?: number; toolMaxChars?: number },
  log?: (line: string) => void,
): Promise<ToolSet> {
  return openTools(cfg.tools ?? [...DEFAULT_TOOLS], {
    timeoutMs: cfg.toolTimeout === undefined ? undefined : cfg.toolTimeout * 1000,
    maxChars: cfg.toolMaxChars,
    log,
  });
}

/** Open every item in order. An item that cannot be opened (unknown name, an MCP server that does not
 *  start or answer) or two tools with one name is a UsageError; what was opened so far is closed. */
export async function openTools(specs: string[], options: ToolSetOptions = {}): Promise<ToolSet> {
  const timeoutMs = options.timeoutMs ?? DEFAULT_TOOL_TIMEOUT_MS;
  const maxChars = options.maxChars ?? DEFAULT_TOOL_MAX_CHARS;
  const log = options.log ?? ((line: string) => process.stderr.write(line + "\n"));
  if (!(timeoutMs > 0)) throw new UsageError(`tool timeout ${timeoutMs} ms is invalid; accepted: a number > 0`);
  if (!(Number.isInteger(maxChars) && maxChars >= 100))
    throw new UsageError(`tool output cap ${maxChars} is invalid; accepted: an integer >= 100`);
  const closers: Array<() => Promise<void>> = [];
  const closeAll = async () => {
    const list = closers.splice(0).reverse();
    await Promise.allSettled(list.map((c) => c()));
  };
  const tools: Tool[] = [];
  const groups: Array<{ source: string; tools: Tool[] }> = []; // one per server or built-in tool, limits applied
  /** The item that already offers `name`, leaving out group `except`. */
  const clash = (name: string, except = -1) => groups.find((g, i) => i !== except && g.tools.some((t) => t.name === name))?.source;
  let opened!: () => void;
  const allOpened = new Promise<void>((r) => (opened = r));
  const add = (source: string, fromSpec: Tool[]) => {
    const seen = new Set<string>();
    for (const t of fromSpec) {
      const taken = clash(t.name) ?? (seen.has(t.name) ? source : undefined);
      if (taken !== undefined)
        throw new UsageError(
          `--tools: tool "${t.name}" from ${source} clashes with the one from ${taken}; each tool name may ` +
            `come from one item only (an MCP server can take a prefix: mcp[prefix=x_]:…)`,
        );
      seen.add(t.name);
    }
    // Tools get ready in the background once every item checked out; a call waits for that before its
    // time limit starts, so a slow worker start-up never turns a first call into a time-out.
    // a failed start shows up as the calls' errors
    const ready = (t: Tool) => (t.start ? allOpened.then(() => t.start!()).catch(() => {}) : undefined);
    groups.push({ source, tools: fromSpec.map((t) => limitTool(t, timeoutMs, maxChars, ready(t))) });
  };
  try {
    for (const spec of specs) {
      if (!MCP_ITEM.test(spec) && !CONFIG_ITEM.test(spec)) {
        const tool = BUILTIN_TOOLS.get(spec);
        if (!tool)
          throw new UsageError(
            `--tools: unknown tool "${spec}"; built in: ${BUILTIN_TOOLS.list()
              .map((t) => t.name)
              .join(", ")}; or mcp:<command line> / mcp:<http(s) URL> / an mcpServers .json file`,
          );
        if (tool.close) closers.push(() => tool.close!());
        add(spec, [tool]);
        continue;
      }
      const servers: McpServerSpec[] = MCP_ITEM.test(spec) ? [parseMcpItem(spec)] : readMcpConfig(spec);
      for (const s of servers) {
        const { openMcpServer } = await import("./mcp.ts");
        const server = await openMcpServer(s, { timeoutMs, log });
        closers.push(() => server.close());
        const at = groups.length;
        add(s.source, server.tools);
        server.onToolsChanged = (fresh) => {
          const kept = fresh.filter((t) => {
            const taken = clash(t.name, at);
            if (taken !== undefined) log(`mcp: server ${server.label}'s new tool "${t.name}" clashes with the one from ${taken}; left out`);
            return taken === undefined;
          });
          groups[at].tools = kept.map((t) => limitTool(t, timeoutMs, maxChars));
          tools.splice(0, tools.length, ...groups.flatMap((g) => g.tools));
        };
      }
    }
  } catch (err) {
    await closeAll();
    throw err;
  }
  tools.push(...groups.flatMap((g) => g.tools));
  opened();
  return { tools, close: closeAll };
}

/** The same tool with the run's limits: run() resolves within timeoutMs of `ready` (then to an
 *  "Error: ..." result), to text of at most maxChars plus a marker, and never rejects. */
export function limitTool(tool: Tool, timeoutMs: number, maxChars: number, ready?: Promise<void>): Tool {
  const { close: _close, start: _start, limitsOwnTime, ...rest } = tool;
  return {
    ...rest,
    run: async (args) => {
      await ready;
      let timer: NodeJS.Timeout | undefined;
      const fail = (text: string): ToolResult => ({ text, isError: true });
      const late = new Promise<ToolResult>((resolve) => {
        if (!limitsOwnTime)
          timer = setTimeout(() => resolve(fail(`Error: tool "${tool.name}" took longer than ${timeoutMs / 1000} s`)), timeoutMs);
      });
      let out: ToolResult;
      try {
        out =
          toToolResult(await Promise.race([Promise.resolve().then(() => tool.run(args)), late])) ??
          fail(`Error: tool "${tool.name}" returned no text`);
      } catch (e) {
        out = fail(`Error: tool "${tool.name}" failed (${String((e as Error)?.message ?? e).slice(0, 200)})`);
      } finally {
        clearTimeout(timer);
      }
      return { text: capText(out.text, maxChars), isError: out.isError };
    },
  };
}

/** Text cut to maxChars, with a marker saying how much was dropped. */
export function capText(text: string, maxChars: number): string {
  if (text.length <= maxChars) return text;
  return `${text.slice(0, maxChars)}\n[truncated: ${text.length - maxChars} of ${text.length} characters not shown]`;
}
