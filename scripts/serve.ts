/** AutoRL-Bench-compatible grading server over this project's evaluation:
 *    npx tsx scripts/serve.ts --workspace ws                      # tiny scenario on 127.0.0.1:8000
 *    npx tsx scripts/serve.ts --workspace ws --scenarios gsm8k --time_budget 43200
 *  Agents read GET /scenarios/{id}, train in the workspace, and POST /submit or /evaluate a model
 *  folder there. Ctrl-C (or SIGTERM) abandons the running evaluation at its next batch and exits. */
import { shutdownCalculator } from "../src/agents/calculator.ts";
import { runMain } from "../src/cli.ts";
import { parseServeArgs } from "../src/serve/config.ts";
import { startServer } from "../src/serve/http.ts";

await runMain(async () => {
  const cfg = await parseServeArgs(process.argv);
  const server = await startServer(cfg);
  const local = ["127.0.0.1", "::1", "localhost"].includes(cfg.host);
  process.stderr.write(`grading server on ${server.url} | workspace ${cfg.workspace} | scenarios ${cfg.scenarios.map((s) => s.id).join(", ")} | state ${cfg.stateDir}\n`);
  if (!local) process.stderr.write(`warning: bound to ${cfg.host}: other machines can reach this server\n`);
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) {
      process.stderr.write(`${signal} again: exiting now\n`);
      process.exit(130);
    }
    stopping = true;
    process.stderr.write(`${signal}: shutting down (a running evaluation stops at its next batch; ${signal} again to exit at once)\n`);
    void server.close().then(() => shutdownCalculator()).then(() => process.exit(0));
  };
  process.on("SIGINT", () => stop("SIGINT"));
  process.on("SIGTERM", () => stop("SIGTERM"));
});
