/** Serve Tools as an MCP server with the official SDK's low-level Server: tools/list gives each tool's
 *  JSON schema verbatim (so a client renders the same <tools> block as the built-in tool) and its
 *  system-prompt sentence in `_meta` (so the prompt is the same too), tools/call
 *  runs it and passes on whether it failed as isError. Over stdio, or over Streamable HTTP in stateless
 *  mode on a loopback address (one Server per request, as the SDK's stateless example does), where a
 *  request whose Host or Origin is not a loopback name is refused with 403, as the SDK's
 *  localhostHostValidation does (a web page that rebinds its DNS name to 127.0.0.1 cannot call tools).
 *  scripts/mcp-tool-server.ts runs it for the built-in tools; the tests serve fixtures with it.
 *  Leaves out: sessions, resumability, auth. */
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";
import { toToolResult, type Tool } from "./types.ts";
import { PROMPT_HINT_META } from "./mcp.ts";

export interface ServeOptions {
  name?: string;
  /** tools/list page size (default: all on one page). */
  pageSize?: number;
}

/** An SDK Server answering tools/list and tools/call for `tools`. */
export function mcpServerFor(tools: Tool[], o: ServeOptions = {}): Server {
  // listChanged: a caller that changes `tools` in place may send notifications/tools/list_changed.
  const server = new Server(
    { name: o.name ?? "mini-agentic-rl-tools", version: "0.1.0" },
    { capabilities: { tools: { listChanged: true } } },
  );
  const ready = readyAll(tools);
  const pageSize = o.pageSize ?? Number.MAX_SAFE_INTEGER;
  server.setRequestHandler(ListToolsRequestSchema, async (req) => {
    const start = req.params?.cursor ? Number(req.params.cursor) : 0;
    const page = tools.slice(start, start + Math.max(1, pageSize));
    const next = start + page.length;
    return {
      tools: page.map((t) => ({
        name: t.name,
        description: t.description,
        inputSchema: t.parameters as { type: "object" },
        ...(t.promptHint ? { _meta: { [PROMPT_HINT_META]: t.promptHint } } : {}),
      })),
      ...(next < tools.length ? { nextCursor: String(next) } : {}),
    };
  });
  server.setRequestHandler(CallToolRequestSchema, async (req) => {
    const tool = tools.find((t) => t.name === req.params.name);
    if (!tool) return { content: [{ type: "text", text: `Error: unknown tool "${req.params.name}"` }], isError: true };
    await ready; // a worker start-up is waited for here, not inside the client's handshake
    const out = toToolResult(await tool.run(req.params.arguments ?? {})) ?? {
      text: `Error: tool "${tool.name}" returned no text`,
      isError: true,
    };
    return { content: [{ type: "text", text: out.text }], isError: out.isError };
  });
  return server;
}

const starting = new WeakMap<Tool, Promise<unknown>>();
/** Every tool's start(), begun once per tool (a failed start shows up in its calls). */
function readyAll(tools: Tool[]): Promise<unknown> {
  return Promise.all(
    tools.map((t) => {
      if (!starting.has(t))
        starting.set(
          t,
          Promise.resolve(t.start?.()).catch(() => {}),
        );
      return starting.get(t);
    }),
  );
}

/** Serve over this process's stdin/stdout until the client closes them. */
export async function serveStdio(tools: Tool[], o: ServeOptions = {}): Promise<Server> {
  const server = mcpServerFor(tools, o);
  await server.connect(new StdioServerTransport());
  return server;
}

/** Serve over Streamable HTTP at http://host:port/mcp (port 0: any free port). Resolves once listening. */
export async function serveHttp(
  tools: Tool[],
  port: number,
  o: ServeOptions & { host?: string } = {},
): Promise<{ url: string; close(): Promise<void> }> {
  const host = o.host ?? "127.0.0.1";
  void readyAll(tools);
  const loopback = LOOPBACK.includes(host === "::1" ? "[::1]" : host);
  const httpServer = http.createServer(async (req, res) => {
    const refused = loopback ? foreignHostOrOrigin(req) : null;
    if (refused)
      return void res
        .writeHead(403, { "content-type": "application/json" })
        .end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message: refused }, id: null }));
    if (!req.url?.startsWith("/mcp"))
      return void res.writeHead(404, { "content-type": "application/json" }).end('{"error":"not found; the MCP endpoint is /mcp"}');
    if (req.method !== "POST")
      // stateless: no server-initiated stream, no session to delete
      return void res
        .writeHead(405, { "content-type": "application/json" })
        .end('{"jsonrpc":"2.0","error":{"code":-32000,"message":"Method not allowed."},"id":null}');
    const server = mcpServerFor(tools, o);
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
    res.on("close", () => {
      void transport.close();
      void server.close();
    });
    try {
      await server.connect(transport);
      await transport.handleRequest(req, res);
    } catch (err) {
      if (!res.headersSent)
        res
          .writeHead(500, { "content-type": "application/json" })
          .end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32603, message: String((err as Error).message) }, id: null }));
    }
  });
  // Idle keep-alive sockets stay open longer than a client's pause between calls (Node's default is
  // 5 s), so a call does not race the server closing the socket it reuses.
  httpServer.keepAliveTimeout = 10 * 60_000;
  await new Promise<void>((resolve, reject) => {
    httpServer.once("error", reject);
    httpServer.listen(port, host, () => resolve());
  });
  const addr = httpServer.address() as AddressInfo;
  return {
    url: `http://${host}:${addr.port}/mcp`,
    close: () =>
      new Promise<void>((resolve) => {
        httpServer.closeAllConnections();
        httpServer.close(() => resolve());
      }),
  };
}

const LOOPBACK = ["localhost", "127.0.0.1", "[::1]"];

/** Why a request to a loopback server is refused: a Host (missing, or not a loopback name, any port)
 *  or an Origin that is not a loopback name; null when it is fine. Clients that send no Origin (not
 *  browsers) pass on their Host alone. */
function foreignHostOrOrigin(req: http.IncomingMessage): string | null {
  const hostname = (value: string) => {
    try {
      return new URL(value).hostname;
    } catch {
      return null;
    }
  };
  const host = req.headers.host;
  if (!host) return "Missing Host header";
  const h = hostname(`http://${host}`);
  if (!h || !LOOPBACK.includes(h)) return `Invalid Host: ${host}`;
  const origin = req.headers.origin;
  if (origin !== undefined && origin !== "null") {
    const o = hostname(origin);
    if (!o || !LOOPBACK.includes(o)) return `Invalid Origin: ${origin}`;
  }
  return null;
}
