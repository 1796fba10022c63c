/** MCP tools against real servers the test starts: the fixture server (SDK Server class) over stdio
 *  and over Streamable HTTP on a loopback port, each in its own process. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawn, type ChildProcess } from "node:child_process";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import * as path from "node:path";
import { shutdownCalculator } from "../../src/agents/calculator.ts";
import { splitCommandLine } from "../../src/agents/mcp.ts";
import { openTools, type ToolSet } from "../../src/agents/toolset.ts";
import { toToolResult } from "../../src/agents/types.ts";

const ROOT = path.join(import.meta.dirname, "..", "..");
const FIXTURE = path.join(ROOT, "test", "fixtures", "mcp", "server.ts");
const stdioSpec = (...args: string[]) =>
  `mcp:${JSON.stringify(process.execPath)} --import tsx ${JSON.stringify(FIXTURE)} ${args.join(" ")}`.trim();
const FIXTURE_TOOLS = ["echo", "add", "fail", "slow", "big", "crash"];

afterAll(() => shutdownCalculator());

const call = async (set: ToolSet, name: string, args: Record<string, unknown> = {}) =>
  toToolResult(await set.tools.find((t) => t.name === name)!.run(args))!;
const run = async (set: ToolSet, name: string, args: Record<string, unknown> = {}) => (await call(set, name, args)).text;

describe("command lines", () => {
  it("split on whitespace with quotes and escapes, no expansion", () => {
    expect(splitCommandLine(`npx -y "@scope/server" --dir '/a b' c\\ d $HOME`)).toEqual([
      "npx",
      "-y",
      "@scope/server",
      "--dir",
      "/a b",
      "c d",
      "$HOME",
    ]);
    expect(() => splitCommandLine(`node "server.js`)).toThrow(/unclosed " quote/);
  });
});

describe("MCP over stdio", () => {
  let set: ToolSet;
  const notices: string[] = [];
  beforeAll(async () => {
    set = await openTools([stdioSpec()], { timeoutMs: 2_000, maxChars: 1_000, log: (l) => notices.push(l) });
  });
  afterAll(() => set?.close());

  it("lists every page of tools with their schemas", () => {
    expect(set.tools.map((t) => t.name)).toEqual(FIXTURE_TOOLS); // served two per page
    expect(set.tools[1]).toMatchObject({
      description: "Add two numbers",
      parameters: { type: "object", properties: { a: { type: "number" }, b: { type: "number" } }, required: ["a", "b"] },
    });
  });
  it("calls tools; isError results, time-outs and oversized output become text for the model", async () => {
    expect(await run(set, "echo", { text: "hello" })).toBe("hello");
    expect(await run(set, "add", { a: 2, b: 40 })).toBe("42");
    expect(await call(set, "fail")).toEqual({ text: "Error: this tool always fails", isError: true });
    expect(await call(set, "slow", { ms: 10_000 })).toEqual({ text: 'Error: tool "slow" took longer than 2 s', isError: true });
    expect(await run(set, "echo", { text: "still serving" })).toBe("still serving");
    const big = await run(set, "big", { n: 5_000 });
    expect(big).toBe(`${"x".repeat(1_000)}\n[truncated: 4000 of 5000 characters not shown]`);
    const calls = await Promise.all([1, 2, 3, 4].map((b) => run(set, "add", { a: 1, b }))); // concurrent calls
    expect(calls).toEqual(["2", "3", "4", "5"]);
  });
  it("a server that crashes is started again once; after a second crash its tools answer with an error", async () => {
    // The reason (connection closed, a broken pipe) depends on when the exit is seen; the server is named
    // by its command line, shortened with "..." when the checkout's path is long.
    expect(await run(set, "crash")).toMatch(/^Error: MCP server node --import tsx \/.+ failed on "crash" \(/);
    // The restart (tsx compiling the server) may take longer than the 2 s call limit on a loaded machine.
    let reply = await run(set, "echo", { text: "back" });
    for (let i = 0; i < 30 && reply !== "back"; i++) {
      await new Promise((r) => setTimeout(r, 1000));
      reply = await run(set, "echo", { text: "back" });
    }
    expect(reply).toBe("back");
    expect(notices.join("\n")).toMatch(/went away; it will be started again on the next call[^]*started again/);
    expect(await run(set, "crash")).toMatch(/^Error: MCP server .* failed on "crash"/);
    expect(await run(set, "echo", { text: "x" })).toMatch(
      /^Error: MCP server node --import tsx \/.+ is not running; tool "echo" is unavailable$/,
    );
  });
});

describe("tools/list_changed", () => {
  it("the tool set follows the server's new list: a dropped tool answers with an error, a new one is offered", async () => {
    const notices: string[] = [];
    const set = await openTools(["calculator", stdioSpec("--dynamic")], { timeoutMs: 60_000, log: (l) => notices.push(l) });
    try {
      const echo = set.tools.find((t) => t.name === "echo")!;
      expect(set.tools.map((t) => t.name)).toEqual(["calculator", ...FIXTURE_TOOLS, "reshape"]);
      expect(await run(set, "reshape")).toBe("reshaped");
      for (let i = 0; i < 100 && !set.tools.some((t) => t.name === "extra"); i++) await new Promise((r) => setTimeout(r, 50));
      expect(set.tools.map((t) => t.name)).toEqual(["calculator", ...FIXTURE_TOOLS.filter((n) => n !== "echo"), "reshape", "extra"]);
      expect(await run(set, "extra")).toBe("extra here");
      expect(toToolResult(await echo.run({ text: "x" }))).toEqual({
        text: expect.stringMatching(/^Error: MCP server .* no longer offers tool "echo"$/),
        isError: true,
      });
      expect(notices.join("\n")).toMatch(/changed its tools; now add, fail, slow, big, crash, reshape, extra/);
    } finally {
      await set.close();
    }
  });
});

describe("MCP over Streamable HTTP", () => {
  let server: ChildProcess;
  let url: string;
  beforeAll(async () => {
    server = spawn(process.execPath, ["--import", "tsx", FIXTURE, "--http", "--calculator"], {
      cwd: ROOT,
      stdio: ["ignore", "pipe", "inherit"],
    });
    url = await new Promise<string>((resolve, reject) => {
      let out = "";
      server.stdout!.on("data", (d) => {
        out += d;
        const m = /listening (http:\/\/127\.0\.0\.1:\d+\/mcp)/.exec(out);
        if (m) resolve(m[1]);
      });
      server.on("exit", (code) => reject(new Error(`fixture server exited with ${code}`)));
    });
  });
  afterAll(() => {
    if (server.exitCode === null) server.kill();
  });

  it("time-outs and oversized output become text for the model, as over stdio", async () => {
    // Two sets: a short limit for the slow call, a generous one where a loaded machine must not time out.
    const short = await openTools([`mcp:${url}`], { timeoutMs: 2_000 });
    const capped = await openTools([`mcp:${url}`], { timeoutMs: 60_000, maxChars: 1_000 });
    try {
      expect(await run(short, "slow", { ms: 10_000 })).toBe('Error: tool "slow" took longer than 2 s');
      expect(await run(capped, "big", { n: 5_000 })).toBe(`${"x".repeat(1_000)}\n[truncated: 4000 of 5000 characters not shown]`);
      expect(await run(capped, "echo", { text: "still serving" })).toBe("still serving");
    } finally {
      await Promise.all([short.close(), capped.close()]);
    }
  });
  it("refuses a foreign Host or Origin with 403 (DNS rebinding), serves loopback ones", async () => {
    const status = (headers: Record<string, string>) =>
      new Promise<number>((resolve, reject) => {
        const body = JSON.stringify({ jsonrpc: "2.0", id: 1, method: "ping" });
        const req = http.request(
          url,
          { method: "POST", headers: { "content-type": "application/json", accept: "application/json, text/event-stream", ...headers } },
          (res) => {
            res.resume();
            resolve(res.statusCode ?? 0);
          },
        );
        req.on("error", reject);
        req.end(body);
      });
    const port = new URL(url).port;
    expect(await status({ host: "evil.example" })).toBe(403);
    expect(await status({ host: `localhost:${port}`, origin: "http://evil.example" })).toBe(403);
    expect(await status({ host: `localhost:${port}`, origin: `http://localhost:${port}` })).toBe(200);
    expect(await status({ host: `127.0.0.1:${port}` })).toBe(200);
  });
  it("lists, calls, reports isError; a server that is gone gives error text naming it", async () => {
    const notices: string[] = [];
    // A generous limit: the served calculator's worker may still be starting on a loaded machine.
    const set = await openTools([`mcp:${url}`], { timeoutMs: 60_000, log: (l) => notices.push(l) });
    try {
      expect(set.tools.map((t) => t.name)).toEqual(["calculator", ...FIXTURE_TOOLS]);
      expect(await run(set, "calculator", { expression: "16-3-4" })).toBe("9");
      expect(await run(set, "calculator", { expression: "1/0" })).toMatch(/^Error/);
      expect(await run(set, "fail")).toBe("Error: this tool always fails");
      server.kill();
      await new Promise((r) => server.once("exit", r));
      expect(await run(set, "echo", { text: "x" })).toMatch(
        new RegExp(`^Error: MCP server ${url.replace(/[./]/g, "\\$&")} failed on "echo"`),
      );
    } finally {
      await set.close();
    }
  });
});

describe("servers that cannot be used are usage errors", () => {
  it.each([
    ["a missing command", "mcp:/no/such/mcp-server", /--tools mcp:\/no\/such\/mcp-server: server did not start \(command not found\)/],
    [
      "a command that exits at once",
      `mcp:${JSON.stringify(process.execPath)} -e "process.exit(1)"`,
      /server did not start \(.*Connection closed\)/,
    ],
    ["an unreachable URL", "mcp:http://127.0.0.1:9/mcp", /--tools mcp:http:\/\/127\.0\.0\.1:9\/mcp: server did not start/],
  ])("%s", async (_what, spec, message) => {
    await expect(openTools([spec], { timeoutMs: 5_000 })).rejects.toThrow(message);
  });
  it("a URL that accepts connections and never answers: an error at the start-up limit, not a hang", async () => {
    const { openMcpServer } = await import("../../src/agents/mcp.ts");
    const hung = http.createServer(() => {}); // reads every request, answers none
    await new Promise<void>((r) => hung.listen(0, "127.0.0.1", () => r()));
    const url = `http://127.0.0.1:${(hung.address() as AddressInfo).port}/mcp`;
    try {
      const t0 = Date.now();
      await expect(openMcpServer(url, { timeoutMs: 1_000, startupTimeoutMs: 1_000 })).rejects.toThrow(
        new RegExp(`^--tools mcp:${url.replace(/[./]/g, "\\$&")}: server did not start \\(`),
      );
      expect(Date.now() - t0).toBeLessThan(20_000);
    } finally {
      hung.closeAllConnections();
      hung.close();
    }
  });
  it("two tools with one name", async () => {
    await expect(openTools(["calculator", stdioSpec("--clash")])).rejects.toThrow(
      /tool "calculator" from mcp:.* clashes with the one from calculator/,
    );
  });
});
