/** Worker-thread side of the calculator: evaluates one expression per message, in order, and says
 *  when it is ready. Leaves out every limit — the parent (sandbox.ts) owns time, memory and restarts. */
import { isMainThread, workerData, type MessagePort } from "node:worker_threads";
import { evaluateExpression } from "./calculator-eval.ts";

if (isMainThread || !workerData?.port)
  throw new Error("calculator-worker.ts must run in a worker thread started by sandbox.ts (workerData.port), not as a script");
const port = workerData.port as MessagePort;
// Warm up before saying ready: the first parse compiles mathjs's parser lazily, which would otherwise
// be charged to the first request's time limit.
for (const warm of ["16-3-4", "(2.5*4)/2^2 + 10%", "max(round(1.005, 2), sqrt(9))"]) evaluateExpression(warm);
port.on("message", (msg: { id: number; input: unknown }) => {
  port.postMessage({ id: msg.id, output: evaluateExpression(msg.input) });
});
port.postMessage({ ready: true });
