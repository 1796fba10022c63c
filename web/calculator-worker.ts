/** The calculator's Web Worker (web/adapters/sandbox.ts starts it): src/'s evaluateExpression over
 *  mathjs's parser, one expression per message, as src/agents/calculator-worker.ts does in a Node
 *  worker thread. */
import * as mathjs from "mathjs";
import { provideModule } from "./node/module.ts";
import { evaluateExpression } from "../src/agents/calculator-eval.ts";

provideModule("mathjs", mathjs);
for (const warm of ["16-3-4", "(2.5*4)/2^2 + 10%", "max(round(1.005, 2), sqrt(9))"]) evaluateExpression(warm);
self.onmessage = (e: MessageEvent<{ id: number; input: unknown }>) => {
  self.postMessage({ id: e.data.id, output: evaluateExpression(e.data.input) });
};
self.postMessage({ ready: true });
