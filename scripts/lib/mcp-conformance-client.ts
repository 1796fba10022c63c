/** The client under test for the official MCP conformance suite (@modelcontextprotocol/conformance):
 *  the project's own tool set (src/agents/toolset.ts) opened on the URL the suite appends, every tool
 *  it lists called once with arguments made from its schema (numbers 1, 2, …; strings "x"; booleans
 *  true), then closed. Dev-only; the suite needs Node 22+, this script runs on the project's Node:
 *    npx @modelcontextprotocol/conformance client --command "npx tsx scripts/lib/mcp-conformance-client.ts" --scenario tools_call
 *  Exits 0 when every call answered without isError, 1 otherwise (the suite's checks decide). */
import { runMain } from "../../src/run/cli.ts";
import { openTools } from "../../src/agents/toolset.ts";
import { toToolResult } from "../../src/agents/types.ts";

await runMain(async () => {
  const url = process.argv.at(-1) ?? "";
  const set = await openTools([`mcp:${url}`], { timeoutMs: 20_000 });
  let failed = 0;
  try {
    for (const tool of set.tools) {
      const out = toToolResult(await tool.run(argumentsFor(tool.parameters)))!;
      process.stdout.write(`${tool.name}: ${out.isError ? "error: " : ""}${out.text}\n`);
      if (out.isError) failed++;
    }
  } finally {
    await set.close();
  }
  if (failed) throw new Error(`${failed} of ${set.tools.length} tool calls failed`);
});

function argumentsFor(schema: Record<string, unknown>): Record<string, unknown> {
  const props = (schema.properties ?? {}) as Record<string, { type?: string }>;
  let n = 0;
  return Object.fromEntries(
    Object.entries(props).map(([k, p]) => [k, p.type === "number" || p.type === "integer" ? ++n : p.type === "boolean" ? true : "x"]),
  );
}
