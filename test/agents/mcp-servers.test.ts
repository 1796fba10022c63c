/** The MCP client against real servers from npm (dev dependencies, pinned): server-everything over
 *  stdio through `npx` and over Streamable HTTP (restarted mid-session, behind a loopback proxy that
 *  records headers), server-memory (an environment variable it needs), server-filesystem (a successful
 *  read of text that starts with "ERROR"), and chat.ts and eval.ts with server-everything through npx.
 *  Each server's processes carry a marker in their environment, so the test can see that none is left
 *  once the tool set is closed or the script has exited. */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { spawn, type ChildProcess } from "node:child_process";
import * as fs from "node:fs";
import * as http from "node:http";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { openTools, type ToolSet } from "../../src/agents/toolset.ts";
import { toToolResult } from "../../src/agents/types.ts";
import { runToolCall } from "../../src/rollout/tool-messages.ts";
import { scoreRollout } from "../../src/rollout/rewards.ts";

const ROOT = path.join(import.meta.dirname, "..", "..");
const EVERYTHING = path.join(ROOT, "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js");
const call = async (set: ToolSet, name: string, args: Record<string, unknown> = {}) => {
  const tool = set.tools.find((t) => t.name === name);
  if (!tool) throw new Error(`no tool ${name}; have ${set.tools.map((t) => t.name).join(", ")}`);
  return toToolResult(await tool.run(args))!;
};

/** Pids of live processes whose environment holds NAME=value. */
function pidsWith(name: string, value: string): number[] {
  const out: number[] = [];
  for (const d of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const env = fs.readFileSync(`/proc/${d}/environ`, "latin1").split("\0");
      const stat = fs.readFileSync(`/proc/${d}/stat`, "latin1");
      if (env.includes(`${name}=${value}`) && !/^\d+ \(.*\) Z/.test(stat)) out.push(Number(d));
    } catch {
      // gone, or not ours to read
    }
  }
  return out;
}
/** Waits (bounded) until no process carries the marker; returns those left. */
async function leftAfter(mark: string): Promise<number[]> {
  for (let i = 0; i < 100 && pidsWith("MCP_TEST_MARK", mark).length; i++) await new Promise((r) => setTimeout(r, 100));
  return pidsWith("MCP_TEST_MARK", mark);
}

const sets: ToolSet[] = [];
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "mcp-servers-"));
// Passed through to every server this file starts: npx takes the packages from node_modules and never
// asks the registry.
const offline = process.env.npm_config_offline;
process.env.npm_config_offline = "true";
afterAll(async () => {
  await Promise.all(sets.map((s) => s.close()));
  fs.rmSync(tmp, { recursive: true, force: true });
  if (offline === undefined) delete process.env.npm_config_offline;
  else process.env.npm_config_offline = offline;
});
async function open(specs: string[], notices: string[] = [], timeoutMs = 60_000, maxChars?: number): Promise<ToolSet> {
  const set = await openTools(specs, { timeoutMs, maxChars, log: (l) => notices.push(l) });
  sets.push(set);
  return set;
}

describe("server-everything over stdio, started through npx", () => {
  it("lists what the client can call, passes arguments, carries isError; close() leaves no process", async () => {
    const mark = `npx-${process.pid}`;
    const notices: string[] = [];
    process.env.MCP_TEST_FROM_PARENT = mark; // not one of the SDK's defaults (HOME, PATH, SHELL, TERM, ...)
    // get-env returns the server's whole environment, as long as this process's (over the default cap of
    // 4,000 characters on some machines): a larger cap keeps it whole JSON.
    const set = await open(
      [`mcp[env=MCP_TEST_MARK=${mark},env=MCP_TEST_OWN=yes]:npx -y @modelcontextprotocol/server-everything`],
      notices,
      60_000,
      1_000_000,
    );
    const names = set.tools.map((t) => t.name);
    expect(names).toContain("get-sum");
    expect(names).not.toContain("simulate-research-query"); // taskSupport "required": this client runs no MCP tasks
    expect(notices.join("\n")).toMatch(/left out simulate-research-query \(they must run as MCP tasks/);
    expect(await call(set, "get-sum", { a: 2, b: 40 })).toEqual({ text: "The sum of 2 and 40 is 42.", isError: false });
    expect(await call(set, "echo", { message: "ERROR: not an error" })).toEqual({ text: "Echo: ERROR: not an error", isError: false });
    expect((await call(set, "get-tiny-image")).text).toMatch(/^Here's the image you requested:\n\[image\]\n/); // text models read a placeholder
    const wrong = await call(set, "get-sum", { a: "two" }); // the server's own input validation: isError
    expect(wrong.isError).toBe(true);
    expect(wrong.text).toMatch(/^Error/);
    // The environment reaches the server: this process's (PATH, the marker) and the spec's own.
    const env = JSON.parse((await call(set, "get-env")).text) as Record<string, string>;
    expect(env).toMatchObject({ MCP_TEST_MARK: mark, MCP_TEST_OWN: "yes", MCP_TEST_FROM_PARENT: mark });
    delete process.env.MCP_TEST_FROM_PARENT;
    expect(pidsWith("MCP_TEST_MARK", mark).length).toBeGreaterThanOrEqual(2); // npx and the server it started
    await set.close();
    expect(await leftAfter(mark)).toEqual([]);
  });
  it("a server started by a shell that ignores the end of stdin and SIGTERM: its whole group is stopped", async () => {
    const mark = `stubborn-${process.pid}`;
    const fixture = path.join(ROOT, "test", "fixtures", "mcp", "server.ts");
    // "; true" keeps sh from exec-ing, so the server is sh's child: the case of npx and sh -c.
    const set = await open([`mcp[env=MCP_TEST_MARK=${mark}]:sh -c '${process.execPath} --import tsx ${fixture} --stubborn; true'`]);
    expect(await call(set, "add", { a: 1, b: 2 })).toEqual({ text: "3", isError: false });
    expect(pidsWith("MCP_TEST_MARK", mark).length).toBeGreaterThanOrEqual(2); // sh, node (and tsx's esbuild)
    await set.close();
    expect(await leftAfter(mark)).toEqual([]);
  });
  it("an allow-list and prefixes combine two servers that share tool names", async () => {
    const spec = (p: string) => `mcp[prefix=${p},tools=echo+get-sum]:npx -y @modelcontextprotocol/server-everything`;
    await expect(open([spec("a_").replace("prefix=a_,", ""), spec("b_").replace("prefix=b_,", "")])).rejects.toThrow(
      /tool "echo" from mcp\[tools=echo\+get-sum\]:.* clashes with the one from .*; .* prefix/,
    );
    const set = await open([spec("a_"), spec("b_")]);
    expect(set.tools.map((t) => t.name)).toEqual(["a_echo", "a_get-sum", "b_echo", "b_get-sum"]);
    expect(await call(set, "b_get-sum", { a: 1, b: 2 })).toEqual({ text: "The sum of 1 and 2 is 3.", isError: false });
    await expect(open([`mcp[tools=echo+nosuch]:npx -y @modelcontextprotocol/server-everything`])).rejects.toThrow(
      /the server lists no tool "nosuch"; it lists echo, /,
    );
  });
});

describe("server-memory and server-filesystem over stdio", () => {
  const saved = process.env.MEMORY_FILE_PATH;
  afterEach(() => {
    if (saved === undefined) delete process.env.MEMORY_FILE_PATH;
    else process.env.MEMORY_FILE_PATH = saved;
  });
  it("MEMORY_FILE_PATH from this process's environment reaches server-memory", async () => {
    const file = path.join(tmp, "memory.jsonl");
    process.env.MEMORY_FILE_PATH = file;
    const set = await open(["mcp:npx -y @modelcontextprotocol/server-memory"]);
    const r = await call(set, "create_entities", {
      entities: [{ name: "Ada", entityType: "person", observations: ["wrote the first program"] }],
    });
    expect(r.isError).toBe(false);
    expect(fs.readFileSync(file, "utf8")).toContain('"name":"Ada"');
  });
  it("a log file that starts with ERROR is a successful read: no tool error, full tool_use reward", async () => {
    fs.writeFileSync(path.join(tmp, "app.log"), "ERROR disk full at 12:00\nINFO retried\n");
    const set = await open([`mcp:npx -y @modelcontextprotocol/server-filesystem ${JSON.stringify(tmp)}`]);
    const tools = new Map(set.tools.map((t) => [t.name, t]));
    const read = await runToolCall({ name: "read_text_file", arguments: { path: path.join(tmp, "app.log") } }, tools);
    expect(read).toMatchObject({ result: "ERROR disk full at 12:00\nINFO retried\n", error: false });
    const missing = await runToolCall({ name: "read_text_file", arguments: { path: path.join(tmp, "nope.log") } }, tools);
    expect(missing.error).toBe(true);
    expect(missing.result).toMatch(/^Error.*ENOENT/);
    const rollout = (errors: number) => ({
      finalText: "\\boxed{1}",
      numToolCalls: 1,
      numToolErrors: errors,
      numParseErrors: 0,
      truncated: false,
    });
    expect(scoreRollout(rollout(Number(read.error)), "1", { tool_use: 1 }).components.tool_use).toBe(1);
    expect(scoreRollout(rollout(Number(missing.error)), "1", { tool_use: 1 }).components.tool_use).toBe(0);
  });
});

describe("server-everything over Streamable HTTP", () => {
  let port = 0;
  let server: ChildProcess | null = null;
  const seenAuth: string[] = [];
  let expireSession = false; // the proxy answers the next request of a session with 404, as for an expired one
  let proxy: http.Server;
  let proxyUrl = "";
  const start = async () => {
    server = spawn(process.execPath, [EVERYTHING, "streamableHttp"], {
      env: { ...process.env, PORT: String(port) },
      stdio: ["ignore", "ignore", "pipe"],
    });
    await new Promise<void>((resolve, reject) => {
      let err = "";
      server!.stderr!.on("data", (d) => {
        err += d;
        if (/listening on port/.test(err)) resolve();
      });
      server!.once("exit", (code) => reject(new Error(`server-everything exited with ${code}: ${err}`)));
    });
  };
  const stop = async () => {
    if (!server || server.exitCode !== null) return;
    const s = server;
    await new Promise((r) => (s.once("exit", r), s.kill("SIGKILL")));
  };
  beforeAll(async () => {
    port = await new Promise<number>((resolve) => {
      const probe = net.createServer().listen(0, "127.0.0.1", () => {
        const p = (probe.address() as net.AddressInfo).port;
        probe.close(() => resolve(p));
      });
    });
    await start();
    // A loopback proxy in front of it that records the Authorization header of every request.
    proxy = http.createServer((req, res) => {
      seenAuth.push(String(req.headers.authorization));
      if (expireSession && req.headers["mcp-session-id"]) {
        expireSession = false;
        return void res
          .writeHead(404, { "content-type": "application/json" })
          .end('{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}');
      }
      const up = http.request(
        { host: "127.0.0.1", port, path: req.url, method: req.method, headers: { ...req.headers, host: `127.0.0.1:${port}` } },
        (r) => {
          res.writeHead(r.statusCode ?? 502, r.headers);
          r.pipe(res);
        },
      );
      up.on("error", () => (res.headersSent ? res.destroy() : res.writeHead(502).end()));
      req.pipe(up);
    });
    await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", () => r()));
    proxyUrl = `http://127.0.0.1:${(proxy.address() as net.AddressInfo).port}/mcp`;
  });
  afterAll(async () => {
    await stop();
    proxy?.closeAllConnections();
    proxy?.close();
  });

  it("headers reach the server; a restarted server is reconnected with a new session", async () => {
    const notices: string[] = [];
    const set = await open([`mcp[header=Authorization:Bearer t0ken,tools=echo+get-sum]:${proxyUrl}`], notices);
    expect(await call(set, "get-sum", { a: 1, b: 1 })).toEqual({ text: "The sum of 1 and 1 is 2.", isError: false });
    expect(seenAuth.length).toBeGreaterThan(0);
    expect(new Set(seenAuth)).toEqual(new Set(["Bearer t0ken"]));
    await stop();
    await start(); // same port, new process: it knows no session
    expect(await call(set, "echo", { message: "back" })).toEqual({ text: "Echo: back", isError: false });
    expect(notices.join("\n")).toMatch(/lost the session \(HTTP 40[04]\); initializing a new one[^]*has a new session/);
    expect(await call(set, "get-sum", { a: 2, b: 2 })).toEqual({ text: "The sum of 2 and 2 is 4.", isError: false });
  });
  it("an expired session (404) is initialized anew, as the spec requires, every time it happens", async () => {
    const notices: string[] = [];
    const set = await open([`mcp[tools=get-sum]:${proxyUrl}`], notices);
    for (const n of [1, 2, 3]) {
      expireSession = true;
      expect(await call(set, "get-sum", { a: n, b: n })).toEqual({ text: `The sum of ${n} and ${n} is ${2 * n}.`, isError: false });
    }
    expect(notices.filter((l) => /lost the session \(HTTP 404\)/.test(l))).toHaveLength(3);
  });
});

describe("chat.ts and eval.ts with server-everything through npx (tiny preset)", () => {
  /** Runs a script with `input` on stdin and the marker in its environment; its exit code and stderr. */
  const script = (name: string, args: string[], mark: string, input = "") =>
    new Promise<{ code: number | null; err: string }>((resolve) => {
      const child = spawn(process.execPath, ["--import", "tsx", path.join("scripts", name), ...args], {
        cwd: ROOT,
        stdio: ["pipe", "ignore", "pipe"],
        env: { ...process.env, MCP_TEST_MARK: mark },
      });
      let err = "";
      child.stderr!.on("data", (d) => (err += d));
      child.stdin!.end(input);
      const killer = setTimeout(() => child.kill("SIGKILL"), 100_000); // a hang fails the test (within its 120 s), not the run
      child.once("exit", (code) => {
        clearTimeout(killer);
        resolve({ code, err });
      });
    });
  const everything = "mcp:npx -y @modelcontextprotocol/server-everything";

  it("chat answers a piped question, exits 0 at /exit and leaves no process", async () => {
    const mark = `chat-${process.pid}`;
    const r = await script("chat.ts", ["--preset", "tiny", "--tools", everything], mark, "What is 2 + 3?\n/exit\n");
    expect(r.err).toMatch(/tools: echo, get-annotated-message, /);
    expect(r.code).toBe(0);
    expect(await leftAfter(mark)).toEqual([]);
  });
  it("eval writes its results, exits 0 and leaves no process", async () => {
    const mark = `eval-${process.pid}`;
    const out = path.join(tmp, "eval");
    const r = await script(
      "eval.ts",
      [
        "--preset",
        "tiny",
        "--model_path",
        "src/presets/tiny",
        "--max_samples",
        "2",
        "--output_dir",
        out,
        "--tools",
        `mcp[tools=get-sum]:npx -y @modelcontextprotocol/server-everything`,
      ],
      mark,
    );
    expect(r.code).toBe(0);
    expect(fs.existsSync(path.join(out, "eval.json"))).toBe(true);
    expect(await leftAfter(mark)).toEqual([]);
  });
  it("tools that do not fit the model's context: a one-line usage error, exit 2, no process left", async () => {
    const mark = `fit-${process.pid}`;
    const r = await script("chat.ts", ["--preset", "tiny", "--max_new_tokens", "300", "--tools", everything], mark, "What is 2 + 3?\n");
    expect(r.err).toMatch(
      /error: the system prompt with 12 tools is \d+ tokens; with 300 new tokens it does not fit the model's context of 1024; offer fewer tools/,
    );
    expect(r.code).toBe(2);
    expect(await leftAfter(mark)).toEqual([]);
  });
});
