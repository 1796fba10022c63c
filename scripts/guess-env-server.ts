/** The guess-the-number environment (scripts/lib/guess-number.ts) as an AgentGym-style HTTP server:
 *    npx tsx scripts/guess-env-server.ts --port 36001                  # id dialect (TextCraft's routes)
 *    npx tsx scripts/guess-env-server.ts --port 36002 --dialect env_idx  # WebShop's routes
 *    npx tsx scripts/train-gsm8k-agent.ts --preset tiny --env http://127.0.0.1:36001 --max_turns 8
 *  Listens on 127.0.0.1 only. */
import { Command } from "commander";
import { parseChoice, parseIntArg, runMain } from "../src/run/cli.ts";
import { parseFlags } from "../src/run/flags.ts";
import { serveGuessNumber } from "./lib/guess-number.ts";

const program = new Command()
  .name("guess-env-server")
  .description("Serve the guess-the-number environment over AgentGym's HTTP API")
  .option("--port <n>", "port on 127.0.0.1 (0: any free port)", parseIntArg("port", 0, 65535), 36001)
  .option(
    "--dialect <kind>",
    "API dialect: id (TextCraft's routes) or env_idx (WebShop's)",
    parseChoice("dialect", ["id", "env_idx"] as const),
    "id",
  )
  .exitOverride()
  .configureOutput({ outputError: () => {} });

await runMain(async () => {
  parseFlags(program, {}, process.argv); // commander errors → one-line usage error, --help → exit 0
  const o = program.opts();
  const server = await serveGuessNumber(o.port, o.dialect);
  process.stdout.write(`guess-number environment (${o.dialect} dialect) at ${server.url}\n`);
});
