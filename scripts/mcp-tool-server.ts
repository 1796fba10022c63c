/** Serve built-in tools (the calculator) as an MCP server, for any MCP client and for --tools mcp:…:
 *    npx tsx scripts/mcp-tool-server.ts                          # stdio: started by the client
 *    npx tsx scripts/mcp-tool-server.ts --http 3000              # Streamable HTTP at http://127.0.0.1:3000/mcp
 *    npx tsx scripts/train-gsm8k-agent.ts --preset tiny --tools "mcp:npx tsx scripts/mcp-tool-server.ts"
 *    npx tsx scripts/chat.ts --preset tiny --tools "calculator,mcp:npx tsx scripts/mcp-tool-server.ts --prefix remote_"
 *  The served calculator gives the same text as the built-in one, so runs match. */
import { Command } from "commander";
import { runMain, parseIntArg } from "../src/run/cli.ts";
import { UsageError } from "../src/util/errors.ts";
import { parseFlags } from "../src/run/flags.ts";
import { serveHttp, serveStdio } from "../src/agents/mcp-serve.ts";
import { BUILTIN_TOOLS } from "../src/agents/builtin.ts";

const program = new Command()
  .name("mcp-tool-server")
  .description("Serve the project's built-in tools over MCP (stdio, or Streamable HTTP with --http)")
  .option("--tools <list>", "built-in tools to serve, comma-separated", "calculator")
  .option("--prefix <text>", "serve each tool under this prefix + its name (e.g. remote_calculator), to use it beside the built-in one", "")
  .option(
    "--http <port>",
    "serve Streamable HTTP on 127.0.0.1:<port>/mcp instead of stdio (0: any free port)",
    parseIntArg("http", 0, 65535),
  )
  .exitOverride()
  .configureOutput({ outputError: () => {} });

await runMain(async () => {
  parseFlags(program, {}, process.argv); // commander errors → one-line usage error, --help → exit 0
  const o = program.opts();
  const tools = (o.tools as string).split(",").map((name) => {
    const tool = BUILTIN_TOOLS.get(name.trim());
    if (!tool)
      throw new UsageError(
        `--tools: unknown tool "${name}"; built in: ${BUILTIN_TOOLS.list()
          .map((t) => t.name)
          .join(", ")}`,
      );
    // A renamed tool drops its prompt sentence (it names the tool); the description stands in.
    return o.prefix ? { ...tool, name: `${o.prefix}${tool.name}`, promptHint: undefined } : tool;
  });
  if (o.http === undefined) return void (await serveStdio(tools));
  const server = await serveHttp(tools, o.http);
  process.stdout.write(`serving ${tools.map((t) => t.name).join(", ")} at ${server.url}\n`);
});
