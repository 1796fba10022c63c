/** The official MCP conformance suite (@modelcontextprotocol/conformance, a dev dependency) against
 *  the project: its client scenarios for tools against scripts/lib/mcp-conformance-client.ts (the
 *  project's tool set), and its DNS-rebinding server scenario against mcp-serve.ts's HTTP server (what
 *  scripts/mcp-tool-server.ts --http runs). The suite needs Node 22+: MCP_CONFORMANCE_NODE, else
 *  ~/.cache/mini-agentic-rl/node24/bin/node (scripts/setup-node.sh 24), else this Node if it is new
 *  enough. Under CI=true a missing Node 22+ is a failure; elsewhere the suites are skipped with one
 *  line saying how to enable them. The client under test runs on the project's own Node. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { execFile } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { pathToFileURL } from "node:url";
import { serveHttp } from "../../src/agents/mcp-serve.ts";

const ROOT = path.join(import.meta.dirname, "..", "..");
const SUITE = path.join(ROOT, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js");
const CLIENT = path.join(ROOT, "scripts", "lib", "mcp-conformance-client.ts");
const TSX = pathToFileURL(path.join(ROOT, "node_modules", "tsx", "dist", "loader.mjs")).href;
const ENABLE = "sh scripts/setup-node.sh 24 (or MCP_CONFORMANCE_NODE=/path/to/node22+)";

function conformanceNode(): string | null {
  const candidates = [
    process.env.MCP_CONFORMANCE_NODE,
    path.join(process.env.XDG_CACHE_HOME ?? path.join(os.homedir(), ".cache"), "mini-agentic-rl", "node24", "bin", "node"),
  ];
  const found = candidates.find((p) => p && fs.existsSync(p));
  if (found) return found;
  if (Number(process.versions.node.split(".")[0]) >= 22) return process.execPath;
  if (process.env.CI === "true" || process.env.CI === "1")
    throw new Error(`MCP conformance tests: CI=true but no Node 22+ found (CI fetches one: ${ENABLE})`);
  console.warn(`MCP conformance tests skipped: the suite needs Node 22+, this is ${process.version}; to run them: ${ENABLE}`);
  return null;
}
const node = conformanceNode();
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "mcp-conformance-")); // the suite writes results/ into its cwd
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

/** Runs the suite with `args`; resolves to its exit code and output. */
function suite(args: string[]): Promise<{ code: number; out: string }> {
  return new Promise((resolve) => {
    execFile(
      node!,
      [SUITE, ...args],
      { cwd: tmp, timeout: 120_000, env: { ...process.env, PATH: `${path.dirname(node!)}:${process.env.PATH}` } },
      (err, stdout, stderr) => {
        resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, out: `${stdout}\n${stderr}` });
      },
    );
  });
}

describe.runIf(node)("MCP conformance suite: client scenarios", () => {
  const command = `${JSON.stringify(process.execPath)} --import ${TSX} ${JSON.stringify(CLIENT)}`;
  it.each(["initialize", "tools_call", "sse-retry"])("%s", async (scenario) => {
    const r = await suite(["client", "--command", command, "--scenario", scenario]);
    expect(r.out).toMatch(/OVERALL: PASSED/);
    expect(r.out).not.toMatch(/CLIENT EXITED WITH ERROR/);
    expect(r.code).toBe(0);
  });
});

describe.runIf(node)("MCP conformance suite: the project's HTTP server", () => {
  let server: { url: string; close(): Promise<void> };
  beforeAll(async () => {
    server = await serveHttp(
      [
        {
          name: "echo",
          description: "Repeat the text",
          parameters: { type: "object", properties: { text: { type: "string" } } },
          run: async (a) => String(a.text),
        },
      ],
      0,
    );
  });
  afterAll(() => server?.close());
  it("dns-rebinding-protection: a foreign Host/Origin is refused, a loopback one served", async () => {
    const r = await suite(["server", "--url", server.url, "--scenario", "dns-rebinding-protection"]);
    expect(r.out).toMatch(/Passed: 2\/2, 0 failed/);
    expect(r.code).toBe(0);
  });
});
