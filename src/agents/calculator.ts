/** The calculator tool the agent calls: `{"expression": "16-3-4"}` → "9". The model writes the
 *  expression, so it is treated as hostile: checked here for type and length, then parsed, whitelisted
 *  and evaluated (calculator-eval.ts) inside a worker thread with a 250 ms limit and a small heap
 *  (sandbox.ts), so nothing one call does can leak into the next or take the process down.
 *  run() always resolves to result text or a one-line "Error: ..." for the tool message.
 *  The tool is listed in builtin.ts; its close() (shutdownCalculator) stops the worker, which the tool
 *  set calls (optional: the idle worker does not keep the process alive). */
import type { Tool } from "./types.ts";
import { MAX_EXPRESSION_LENGTH } from "./calculator-eval.ts";
import { WorkerSandbox, type SandboxOptions } from "./sandbox.ts";

export const CALCULATOR_LIMITS: SandboxOptions = {
  timeoutMs: 250,
  startupTimeoutMs: 60_000, // tsx + mathjs take ~2 s alone, 10+ s on a loaded 2-core machine
  // Heap for tsx + mathjs's parser plus room to parse; anything that needs more is an attack.
  resourceLimits: { maxOldGenerationSizeMb: 128, maxYoungGenerationSizeMb: 16, stackSizeMb: 4 },
};

const WORKER_URL = new URL("./calculator-worker.mjs", import.meta.url);
let sandbox: WorkerSandbox<string, string> | null = null;

export const calculatorTool: Omit<Tool, "run"> & { run(args: Record<string, unknown>): Promise<string> } = {
  // text: "Error…" on failure
  name: "calculator",
  description: "Evaluate an arithmetic expression",
  // Key order matters: the chat template renders this object verbatim into the system prompt.
  parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] },
  run: (args) => calculate(args),
  promptHint: "Use the calculator tool for arithmetic.",
  limitsOwnTime: true,
  start: async () => void (await evaluate("0")),
  close: () => shutdownCalculator(),
};

/** The tool's run(): validates the arguments object, then evaluates in the sandbox. Never rejects. */
export async function calculate(args: unknown): Promise<string> {
  try {
    if (typeof args !== "object" || args === null || Array.isArray(args))
      return `Error: arguments must be an object like {"expression": "2+2"}`;
    if (!Object.hasOwn(args, "expression")) return `Error: missing "expression"; call like {"expression": "2+2"}`;
    const expression = (args as { expression: unknown }).expression;
    if (typeof expression === "number" && Number.isFinite(expression)) return await evaluate(String(expression));
    if (typeof expression !== "string") {
      const got = expression === null ? "null" : Array.isArray(expression) ? "array" : typeof expression;
      return `Error: "expression" must be a string, got ${got}`;
    }
    if (expression.length > MAX_EXPRESSION_LENGTH)
      return `Error: expression is ${expression.length} characters; at most ${MAX_EXPRESSION_LENGTH} accepted`;
    return await evaluate(expression);
  } catch (e) {
    return `Error: calculator failed (${String((e as Error)?.message ?? e).slice(0, 80)})`;
  }
}

async function evaluate(expression: string): Promise<string> {
  sandbox ??= new WorkerSandbox<string, string>(WORKER_URL, CALCULATOR_LIMITS);
  const r = await sandbox.run(expression);
  if (r.ok) return typeof r.value === "string" ? r.value : "Error: calculator failed (no result)";
  if (r.reason === "timeout") return `Error: evaluation took longer than ${CALCULATOR_LIMITS.timeoutMs} ms`;
  if (r.message === "out of memory") return "Error: evaluation ran out of memory";
  return `Error: calculator failed (${r.message})`;
}

/** Stop the calculator's worker. A later call starts a fresh one. */
export async function shutdownCalculator(): Promise<void> {
  const s = sandbox;
  sandbox = null;
  await s?.shutdown();
}

/** Workers started so far in this process (restarts show up here); for logs and tests. */
export function calculatorWorkersStarted(): number {
  return sandbox?.started ?? 0;
}
