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
const { runMain } = await import("../src/run/cli.ts");
const { closeOnSignal } = await import("../src/run/shutdown.ts");
const { parseServeArgs } = await import("../src/serve/config.ts");
const { startServer } = await import("../src/serve/http.ts");

await runMain(async () => {
  const cfg = await parseServeArgs(process.argv);
  const server = await startServer(cfg);
  const log = (line: string) => process.stderr.write(line + "\n");
  log(
    `grading server on ${server.url} | workspace ${cfg.workspace} | scenarios ${cfg.scenarios.map((s) => s.id).join(", ")} | state ${cfg.stateDir}`,
  );
  if (!["127.0.0.1", "::1", "localhost"].includes(cfg.host)) log(`warning: bound to ${cfg.host}: other machines can reach this server`);
  closeOnSignal(server, log, "a running evaluation stops at its next batch");
});
