/** Where MCP servers are described: a `--tools` item `mcp:<command line|URL>`, optionally with options
 *  in brackets (`mcp[prefix=ev_,tools=echo+get-sum]:npx -y @modelcontextprotocol/server-everything`),
 *  or the `mcpServers` JSON file that MCP hosts use (Claude Desktop, Cursor, Claude Code; VS Code's
 *  `servers` too), named by its path (`--tools ./mcp.json`). Both become McpServerSpecs.
 *  Per server: `command`/`args`/`env`/`cwd` (stdio) or `url`/`headers` (Streamable HTTP), and this
 *  project's `prefix`, `includeTools`, `excludeTools`. Strings in the file may use `${VAR}` and
 *  `${VAR:-default}` (as Claude Code's files do), so tokens need not be written into it.
 *  Leaves out: the legacy SSE transport (`"type": "sse"`), OAuth. */
import * as fs from "node:fs";
import { UsageError } from "../util/errors.ts";

export interface McpServerSpec {
  /** How the user wrote it, for messages: the `--tools` item, or `file.json#name`. */
  source: string;
  /** The server's name in a config file. */
  name?: string;
  command?: string;
  args?: string[];
  /** Set on top of this process's environment (stdio). */
  env?: Record<string, string>;
  cwd?: string;
  url?: string;
  /** Sent with every HTTP request (e.g. Authorization). */
  headers?: Record<string, string>;
  /** Prepended to every tool name, so two servers with one tool name can be combined. */
  prefix?: string;
  /** Only these tools (server-side names); default all the client can call. */
  includeTools?: string[];
  /** Never these tools (server-side names). */
  excludeTools?: string[];
}

const OPTION_KEYS = "prefix, tools (a+b), exclude (a+b), header (Name:value), env (NAME=value), cwd";

/** `mcp:…` or `mcp[opts]:…` → one spec. The target is a URL (http, https) or a command line. */
export function parseMcpItem(item: string): McpServerSpec {
  const m = /^mcp(?:\[([^\]]*)\])?:([^]*)$/.exec(item);
  if (!m) throw new UsageError(`--tools ${item}: expected mcp:<command line|URL> or mcp[options]:<command line|URL>`);
  const target = m[2].trim();
  if (!target)
    throw new UsageError(
      `--tools ${item.slice(0, -1)}: needs a command line (mcp:npx -y some-server) or a URL (mcp:http://127.0.0.1:3000/mcp)`,
    );
  const spec: McpServerSpec = /^https?:\/\//i.test(target) ? { source: item, url: target } : { source: item, ...commandOf(target, item) };
  for (const opt of (m[1] ?? "")
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean)) {
    const eq = opt.indexOf("=");
    const key = eq < 0 ? opt : opt.slice(0, eq).trim();
    const value = eq < 0 ? "" : opt.slice(eq + 1).trim();
    if (!value) throw new UsageError(`--tools ${item}: option "${opt}" needs a value; options: ${OPTION_KEYS}`);
    if (key === "prefix") spec.prefix = value;
    else if (key === "tools")
      spec.includeTools = value
        .split("+")
        .map((s) => s.trim())
        .filter(Boolean);
    else if (key === "exclude")
      spec.excludeTools = value
        .split("+")
        .map((s) => s.trim())
        .filter(Boolean);
    else if (key === "cwd") spec.cwd = value;
    else if (key === "header" || key === "env") {
      const sep = value.indexOf(key === "header" ? ":" : "=");
      if (sep <= 0)
        throw new UsageError(`--tools ${item}: option "${opt}" must be ${key === "header" ? "header=Name:value" : "env=NAME=value"}`);
      const bag = key === "header" ? (spec.headers ??= {}) : (spec.env ??= {});
      bag[value.slice(0, sep).trim()] = value.slice(sep + 1).trim();
    } else throw new UsageError(`--tools ${item}: unknown option "${key}"; options: ${OPTION_KEYS}`);
  }
  return checked(spec);
}

/** An `mcpServers` JSON file → one spec per server that is not `"disabled": true`, in file order. */
export function readMcpConfig(file: string, env: NodeJS.ProcessEnv = process.env): McpServerSpec[] {
  let raw: unknown;
  try {
    raw = JSON.parse(fs.readFileSync(file, "utf8"));
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    throw new UsageError(`--tools ${file}: ${e.code === "ENOENT" ? "no such file" : `not readable JSON (${e.message.split("\n")[0]})`}`);
  }
  const servers = (raw as { mcpServers?: unknown; servers?: unknown })?.mcpServers ?? (raw as { servers?: unknown })?.servers;
  if (!isObject(servers) || Object.keys(servers).length === 0)
    throw new UsageError(`--tools ${file}: expected {"mcpServers": {"name": {"command": ..., "args": [...]} or {"url": ...}}}`);
  const specs: McpServerSpec[] = [];
  for (const [name, entry] of Object.entries(servers)) {
    const where = `--tools ${file}: server "${name}"`;
    if (!isObject(entry)) throw new UsageError(`${where} is not an object`);
    if (entry.disabled === true) continue;
    const e = expandVars(entry, env, where) as Record<string, unknown>;
    const type = e.type === undefined ? undefined : String(e.type);
    if (type === "sse") throw new UsageError(`${where}: the legacy SSE transport is not supported; use its Streamable HTTP endpoint`);
    if (type !== undefined && !["stdio", "http", "streamable-http", "streamableHttp"].includes(type))
      throw new UsageError(`${where}: unknown type "${type}"; accepted: stdio, http, streamable-http`);
    const spec: McpServerSpec = { source: `${file}#${name}`, name };
    if (typeof e.url === "string") spec.url = e.url;
    if (typeof e.command === "string") {
      // a program, as MCP hosts run it: not split into words
      spec.command = e.command;
      spec.args = strings(e.args, `${where}: args`);
    }
    if (e.env !== undefined) spec.env = stringMap(e.env, `${where}: env`);
    if (e.headers !== undefined) spec.headers = stringMap(e.headers, `${where}: headers`);
    if (typeof e.cwd === "string") spec.cwd = e.cwd;
    if (typeof e.prefix === "string") spec.prefix = e.prefix;
    if (e.includeTools !== undefined) spec.includeTools = strings(e.includeTools, `${where}: includeTools`);
    if (e.excludeTools !== undefined) spec.excludeTools = strings(e.excludeTools, `${where}: excludeTools`);
    specs.push(checked(spec, where));
  }
  return specs;
}

function checked(spec: McpServerSpec, where = `--tools ${spec.source}`): McpServerSpec {
  if (!spec.url === !spec.command) throw new UsageError(`${where}: give either a command or a url`);
  if (spec.url) {
    try {
      new URL(spec.url);
    } catch {
      throw new UsageError(`${where}: ${spec.url} is not a valid URL`);
    }
    if (spec.env || spec.cwd) throw new UsageError(`${where}: env and cwd apply to stdio servers, not to a URL`);
  } else if (spec.headers) throw new UsageError(`${where}: headers apply to a URL, not to a stdio server`);
  if (spec.prefix !== undefined && !/^[A-Za-z_][\w-]*$/.test(spec.prefix))
    throw new UsageError(`${where}: prefix "${spec.prefix}" must be letters, digits, _ and -, starting with a letter or _`);
  return spec;
}

/** Split a command line into words: whitespace separates, '…' and "…" quote, \ escapes (no expansion). */
export function splitCommandLine(line: string): string[] {
  const words: string[] = [];
  let cur = "",
    inWord = false,
    quote: string | null = null;
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

function commandOf(line: string, where: string): { command: string; args: string[] } {
  const words = splitCommandLine(line);
  if (words.length === 0) throw new UsageError(`${where}: empty command line`);
  return { command: words[0], args: words.slice(1) };
}

/** `${VAR}` and `${VAR:-default}` in every string of a JSON value; an unset VAR without default is an error. */
function expandVars(v: unknown, env: NodeJS.ProcessEnv, where: string): unknown {
  if (typeof v === "string")
    return v.replace(/\$\{([A-Za-z_]\w*)(?::-([^}]*))?\}/g, (_m, name: string, dflt: string | undefined) => {
      const value = env[name] ?? dflt;
      if (value === undefined) throw new UsageError(`${where}: \${${name}} is not set in the environment`);
      return value;
    });
  if (Array.isArray(v)) return v.map((x) => expandVars(x, env, where));
  if (isObject(v)) return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, expandVars(x, env, where)]));
  return v;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}
function strings(v: unknown, where: string): string[] {
  if (v === undefined) return [];
  if (!Array.isArray(v) || !v.every((x) => typeof x === "string")) throw new UsageError(`${where} must be a list of strings`);
  return v;
}
function stringMap(v: unknown, where: string): Record<string, string> {
  if (!isObject(v) || !Object.values(v).every((x) => typeof x === "string")) throw new UsageError(`${where} must map names to strings`);
  return v as Record<string, string>;
}
