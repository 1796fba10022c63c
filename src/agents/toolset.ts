/** The tools of one run, from `--tools` specs: a registered tool by name (`calculator`), `mcp:<command
 *  line>` (every tool of an MCP server started over stdio) or `mcp:<http(s) URL>` (an MCP server over
 *  Streamable HTTP). Every tool is wrapped in the same limits, whatever it is: a per-call time limit
 *  (unless the tool bounds its own calls more tightly, as the calculator's sandbox does) and an output
 *  cap with a visible truncation marker, and run() never rejects. Starting and stopping
 *  what the tools need (the calculator's worker, MCP server processes and sessions) is the tool set's
 *  job: scripts call close() and nothing tool-specific. Leaves out: per-tool limits. */
import { UsageError } from "../cli.ts";
import "./calculator.ts"; // registers the built-in calculator
import { getTool, listTools } from "./registry.ts";
import type { Tool } from "./types.ts";

export interface ToolSetOptions {
  /** Per-call time limit in ms (default 30 s). */
  timeoutMs?: number;
  /** Longest tool result in characters; longer ones are cut and marked (default 4,000). */
  maxChars?: number;
  /** Where an MCP server's notices go (a crash, a restart). Default stderr. */
  log?: (line: string) => void;
}

export interface ToolSet {
  tools: Tool[];
  /** Stops every server and worker the tools hold. Safe to call twice. */
  close(): Promise<void>;
}

export const DEFAULT_TOOL_TIMEOUT_MS = 30_000;
export const DEFAULT_TOOL_MAX_CHARS = 4_000;

/** "calculator,mcp:node server.js" → ["calculator", "mcp:node server.js"]. A comma starts a new spec
 *  only before `mcp:` or a bare tool name, so an MCP command line may hold commas unless a comma in
 *  it is followed by a lone word. */
export function splitToolSpecs(list: string): string[] {
  const specs = list.split(/,(?=\s*(?:mcp:|[A-Za-z_][\w-]*\s*(?:,|$)))/).map((s) => s.trim());
  const bad = specs.find((s) => !s.startsWith("mcp:") && !/^[A-Za-z_][\w-]*$/.test(s));
  if (bad !== undefined)
    throw new UsageError(`--tools ${JSON.stringify(list)}: ${JSON.stringify(bad)} is not a tool name or mcp:<command line|URL>; expected e.g. calculator,mcp:npx -y some-mcp-server`);
  return specs;
}

/** A run config's tools: `tools` specs (default calculator), `toolTimeout` in seconds, `toolMaxChars`. */
export function openRunTools(cfg: { tools?: string[]; toolTimeout?: number; toolMaxChars?: number }, log?: (line: string) => void): Promise<ToolSet> {
  return openTools(cfg.tools ?? ["calculator"], { timeoutMs: cfg.toolTimeout === undefined ? undefined : cfg.toolTimeout * 1000, maxChars: cfg.toolMaxChars, log });
}

/** Open every spec in order. A spec that cannot be opened (unknown name, an MCP server that does not
 *  start or answer) or two tools with one name is a UsageError; what was opened so far is closed. */
export async function openTools(specs: string[], options: ToolSetOptions = {}): Promise<ToolSet> {
  const timeoutMs = options.timeoutMs ?? DEFAULT_TOOL_TIMEOUT_MS;
  const maxChars = options.maxChars ?? DEFAULT_TOOL_MAX_CHARS;
  if (!(timeoutMs > 0)) throw new UsageError(`tool timeout ${timeoutMs} ms is invalid; accepted: a number > 0`);
  if (!(Number.isInteger(maxChars) && maxChars >= 100)) throw new UsageError(`tool output cap ${maxChars} is invalid; accepted: an integer >= 100`);
  const closers: Array<() => Promise<void>> = [];
  const closeAll = async () => {
    const list = closers.splice(0).reverse();
    await Promise.allSettled(list.map((c) => c()));
  };
  const tools: Tool[] = [];
  const origin = new Map<string, string>(); // tool name → the spec it came from
  const opened: Tool[] = [];
  try {
    for (const spec of specs) {
      let fromSpec: Tool[];
      if (spec.startsWith("mcp:")) {
        const { openMcpServer } = await import("./mcp.ts");
        const server = await openMcpServer(spec.slice(4).trim(), { timeoutMs, log: options.log });
        closers.push(() => server.close());
        fromSpec = server.tools;
      } else {
        const tool = getTool(spec);
        if (!tool) throw new UsageError(`--tools: unknown tool "${spec}"; built in: ${listTools().map((t) => t.name).join(", ")}; or mcp:<command line> / mcp:<http(s) URL>`);
        if (tool.close) closers.push(() => tool.close!());
        fromSpec = [tool];
      }
      for (const t of fromSpec) {
        const taken = origin.get(t.name);
        if (taken !== undefined) throw new UsageError(`--tools: tool "${t.name}" from ${spec} clashes with the one from ${taken}; each tool name may come from one spec only`);
        origin.set(t.name, spec);
        opened.push(t);
      }
    }
  } catch (err) {
    await closeAll();
    throw err;
  }
  // Tools get ready in the background once every spec checked out; a call waits for that before its
  // time limit starts, so a slow worker start-up never turns a first call into a time-out.
  for (const t of opened) {
    const ready = t.start?.().catch(() => {}); // a failed start shows up as the calls' errors
    tools.push(limitTool(t, timeoutMs, maxChars, ready));
  }
  return { tools, close: closeAll };
}

/** The same tool with the run's limits: run() resolves within timeoutMs of `ready` (then to an
 *  "Error: ..." line), to text of at most maxChars plus a marker, and never rejects. */
export function limitTool(tool: Tool, timeoutMs: number, maxChars: number, ready?: Promise<void>): Tool {
  const { close: _close, start: _start, limitsOwnTime, ...rest } = tool;
  return {
    ...rest,
    run: async (args) => {
      await ready;
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<string>((resolve) => {
        if (!limitsOwnTime) timer = setTimeout(() => resolve(`Error: tool "${tool.name}" took longer than ${timeoutMs / 1000} s`), timeoutMs);
      });
      let text: string;
      try {
        const out = await Promise.race([Promise.resolve().then(() => tool.run(args)), late]);
        text = typeof out === "string" ? out : `Error: tool "${tool.name}" returned no text`;
      } catch (e) {
        text = `Error: tool "${tool.name}" failed (${String((e as Error)?.message ?? e).slice(0, 200)})`;
      } finally {
        clearTimeout(timer);
      }
      return capText(text, maxChars);
    },
  };
}

/** Text cut to maxChars, with a marker saying how much was dropped. */
export function capText(text: string, maxChars: number): string {
  if (text.length <= maxChars) return text;
  return `${text.slice(0, maxChars)}\n[truncated: ${text.length - maxChars} of ${text.length} characters not shown]`;
}
