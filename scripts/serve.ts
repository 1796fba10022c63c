/** AutoRL-Bench-compatible grading server over this project's evaluation:
 *    npx tsx scripts/serve.ts --workspace ws                      # tiny scenario on 127.0.0.1:8000
 *    npx tsx scripts/serve.ts --workspace ws --scenarios gsm8k --time_budget 43200
 *  Agents read GET /scenarios/{id}, train in the workspace, and POST /submit or /evaluate a model
 *  folder there. Ctrl-C (or SIGTERM) abandons the running evaluation at its next batch and exits.
 *  The server runs in a child process (superviseSelf) so that this one, idle, takes each signal at
 *  once and passes it on exactly once: an evaluation holds the event loop for a whole kernel, longer
 *  than tsx waits before it kills a child that has not acknowledged a signal. */
import { superviseSelf } from "../src/run/shutdown.ts";

await superviseSelf(); // only the child loads the server and the model code
const { shutdownCalculator } = await import("../src/agents/calculator.ts");
const { runMain } = await import("../src/run/cli.ts");
const { parseServeArgs } = await import("../src/serve/config.ts");
const { startServer } = await import("../src/serve/http.ts");

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
