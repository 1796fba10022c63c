/** How MCP servers are described: `mcp:` and `mcp[options]:` items, `mcpServers` JSON files (with
 *  `${VAR}` expansion), and how `--tools` lists split into items; one config file opened for real. */
import { afterAll, describe, expect, it } from "vitest";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { parseMcpItem, readMcpConfig } from "../../src/agents/mcp-config.ts";
import { openTools, splitToolSpecs } from "../../src/agents/toolset.ts";
import { toToolResult } from "../../src/agents/types.ts";

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "mcp-config-"));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));
const write = (name: string, value: unknown) => {
  const file = path.join(tmp, name);
  fs.writeFileSync(file, typeof value === "string" ? value : JSON.stringify(value));
  return file;
};

describe("mcp: items", () => {
  it("a command line or a URL, with options in brackets", () => {
    expect(parseMcpItem(`mcp:npx -y "@scope/server" '/a b'`)).toEqual({
      source: `mcp:npx -y "@scope/server" '/a b'`,
      command: "npx",
      args: ["-y", "@scope/server", "/a b"],
    });
    expect(
      parseMcpItem("mcp[prefix=ev_,tools=echo+get-sum,exclude=x,env=A=1=2,cwd=/tmp]:npx -y @modelcontextprotocol/server-everything"),
    ).toMatchObject({
      command: "npx",
      prefix: "ev_",
      includeTools: ["echo", "get-sum"],
      excludeTools: ["x"],
      env: { A: "1=2" },
      cwd: "/tmp",
    });
    expect(parseMcpItem("mcp[header=Authorization: Bearer abc]:http://127.0.0.1:3000/mcp")).toEqual({
      source: "mcp[header=Authorization: Bearer abc]:http://127.0.0.1:3000/mcp",
      url: "http://127.0.0.1:3000/mcp",
      headers: { Authorization: "Bearer abc" },
    });
  });
  it.each([
    ["mcp:", /--tools mcp: needs a command line/],
    ["mcp[colour=red]:npx x", /unknown option "colour"; options: prefix, tools/],
    ["mcp[prefix=]:npx x", /option "prefix=" needs a value/],
    ["mcp[prefix=1x]:npx x", /prefix "1x" must be letters/],
    ["mcp[header=Authorization]:http://h/mcp", /must be header=Name:value/],
    ["mcp[header=A:b]:npx x", /headers apply to a URL, not to a stdio server/],
    ["mcp[env=A=b]:http://h/mcp", /env and cwd apply to stdio servers/],
    ["mcp:node 'x", /unclosed ' quote/],
  ])("%s is a usage error", (item, message) => {
    expect(() => parseMcpItem(item)).toThrow(message);
  });
  it("--tools lists split before mcp:, mcp[, a lone name or a .json path", () => {
    expect(splitToolSpecs("calculator,mcp[prefix=a_,tools=x+y]:node s.js --list a=1,b=2,./servers.json,mcp:http://h/mcp")).toEqual([
      "calculator",
      "mcp[prefix=a_,tools=x+y]:node s.js --list a=1,b=2",
      "./servers.json",
      "mcp:http://h/mcp",
    ]);
    expect(() => splitToolSpecs("calculator,./x.yaml")).toThrow(/is not a tool name, mcp:<command line\|URL> or an mcpServers .json file/);
  });
});

describe("mcpServers JSON files", () => {
  it("stdio and HTTP servers as MCP hosts write them, with ${VAR} expanded and disabled ones left out", () => {
    const file = write("claude_desktop_config.json", {
      mcpServers: {
        memory: { command: "npx", args: ["-y", "@modelcontextprotocol/server-memory"], env: { MEMORY_FILE_PATH: "${HOME}/memory.jsonl" } },
        remote: {
          type: "http",
          url: "http://127.0.0.1:3000/mcp",
          headers: { Authorization: "Bearer ${MCP_TEST_TOKEN:-none}" },
          prefix: "r_",
          includeTools: ["echo"],
        },
        off: { command: "nosuch", disabled: true },
      },
    });
    expect(readMcpConfig(file, { HOME: "/home/u" })).toEqual([
      {
        source: `${file}#memory`,
        name: "memory",
        command: "npx",
        args: ["-y", "@modelcontextprotocol/server-memory"],
        env: { MEMORY_FILE_PATH: "/home/u/memory.jsonl" },
      },
      {
        source: `${file}#remote`,
        name: "remote",
        url: "http://127.0.0.1:3000/mcp",
        headers: { Authorization: "Bearer none" },
        prefix: "r_",
        includeTools: ["echo"],
      },
    ]);
  });
  it.each([
    ["no file", null, /no such file/],
    ["not JSON", "{", /not readable JSON/],
    ["no servers", { mcpServers: {} }, /expected \{"mcpServers"/],
    ["an unset variable", { mcpServers: { a: { url: "http://h/${MCP_TEST_UNSET}" } } }, /server "a": \$\{MCP_TEST_UNSET\} is not set/],
    ["the legacy SSE transport", { mcpServers: { a: { type: "sse", url: "http://h/sse" } } }, /legacy SSE transport is not supported/],
    ["neither command nor url", { mcpServers: { a: { args: [] } } }, /give either a command or a url/],
    ["args that are not strings", { mcpServers: { a: { command: "x", args: [1] } } }, /args must be a list of strings/],
  ])("%s is a usage error", (_what, content, message) => {
    const file = content === null ? path.join(tmp, "missing.json") : write(`bad-${Math.random()}.json`, content);
    expect(() => readMcpConfig(file, {})).toThrow(message);
  });
  it("opens every server of the file as one --tools item", async () => {
    const fixture = path.join(import.meta.dirname, "..", "fixtures", "mcp", "server.ts");
    const server = { command: process.execPath, args: ["--import", "tsx", fixture] };
    const file = write("mcp.json", {
      mcpServers: { one: { ...server, prefix: "one_", includeTools: ["add"] }, two: { ...server, excludeTools: ["crash", "slow"] } },
    });
    const set = await openTools(["calculator", file], { timeoutMs: 60_000 });
    try {
      expect(set.tools.map((t) => t.name)).toEqual(["calculator", "one_add", "echo", "add", "fail", "big"]);
      expect(toToolResult(await set.tools[1].run({ a: 1, b: 2 }))).toEqual({ text: "3", isError: false });
    } finally {
      await set.close();
    }
  });
});
