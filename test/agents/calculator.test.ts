import { afterAll, describe, expect, it } from "vitest";
import { execFile } from "node:child_process";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { calculate, calculatorTool, calculatorWorkersStarted, shutdownCalculator } from "../../src/agents/calculator.ts";
import { BUILTIN_TOOLS } from "../../src/agents/builtin.ts";
import { toolSchema } from "../../src/agents/types.ts";

const run = (expression: unknown) => calculatorTool.run({ expression });
afterAll(() => shutdownCalculator());

describe("calculator tool", () => {
  it("has the schema the chat template renders, key order included, and registers itself", () => {
    expect(JSON.stringify(toolSchema(calculatorTool))).toBe(
      '{"type":"function","function":{"name":"calculator","description":"Evaluate an arithmetic expression",' +
        '"parameters":{"type":"object","properties":{"expression":{"type":"string"}},"required":["expression"]}}}',
    );
    expect(BUILTIN_TOOLS.get("calculator")).toBe(calculatorTool);
  });

  it("computes in the worker", async () => {
    expect(await run("16-3-4")).toBe("9");
    expect(await run("0.1+0.2")).toBe("0.3");
    expect(await run("(80000 + 50000) * 1.5 / 100")).toBe("1950");
    expect(await run(42)).toBe("42"); // a bare number is its own value
  });

  it("answers many concurrent calls from a batched rollout, each with its own result", async () => {
    const exprs = Array.from({ length: 200 }, (_, i) => `${i}*3+${i % 7}/2`);
    const outs = await Promise.all(exprs.map(run));
    expect(outs).toEqual(exprs.map((_, i) => String(i * 3 + (i % 7) / 2)));
  });

  it("refuses hostile input with one error line, and the worker stays healthy and unchanged", async () => {
    const startedBefore = calculatorWorkersStarted();
    const hostile = [
      "import({add: f}, {override: true})",
      'createUnit("apple")',
      'evaluate("2+2")',
      'parse("2+2").compile().evaluate()',
      "config({number: 'BigNumber', precision: 64})",
      '[].constructor.constructor("return process")()',
      'cos.constructor("return process.exit(1)")()',
      "f(x) = x^2",
      "a = 1",
      '"1" + "2"',
      "ones(1e8)",
      "zeros(1e4, 1e4)",
      "range(1, 1e9)",
      "9^9^9",
      "factorial(1e6)",
      "(".repeat(150) + "1" + ")".repeat(150),
      "9".repeat(10_000),
      "ℵ + 1",
      "",
    ];
    for (const h of hostile) {
      const out = await run(h);
      expect(out, h).toMatch(/^Error: [^\n]{1,150}$/);
      expect(out, h).not.toMatch(/took longer|ran out of memory|calculator failed/); // refused up front, not cut off
    }
    // Nothing a call does leaks into the next: the BigNumber config and the `add` override never happened.
    expect(await run("2/3")).toBe("0.6666666667");
    expect(await run("1+1")).toBe("2");
    expect(calculatorWorkersStarted()).toBe(startedBefore);
  });

  it("checks the arguments object", async () => {
    expect(await calculatorTool.run({})).toBe('Error: missing "expression"; call like {"expression": "2+2"}');
    expect(await calculatorTool.run({ expr: "1+1" })).toMatch(/missing "expression"/);
    expect(await run(null)).toBe('Error: "expression" must be a string, got null');
    expect(await run(["1+1"])).toBe('Error: "expression" must be a string, got array');
    expect(await run({ valueOf: () => 2 })).toBe('Error: "expression" must be a string, got object');
    expect(await calculate(null)).toMatch(/arguments must be an object/);
    expect(await calculate("1+1")).toMatch(/arguments must be an object/);
    expect(await run("1+".repeat(500) + "1")).toBe("Error: expression is 1001 characters; at most 200 accepted");
  });

  it("starts a fresh worker after shutdown", async () => {
    await shutdownCalculator();
    expect(await run("6*7")).toBe("42");
  });

  it("runs under tsx, and an idle worker does not keep the process alive", async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), "calc-"));
    const script = path.join(dir, "use-calculator.mts");
    const calcPath = fileURLToPath(new URL("../../src/agents/calculator.ts", import.meta.url));
    // No shutdownCalculator(): the process must still exit on its own.
    await fs.writeFile(
      script,
      `import { calculatorTool } from ${JSON.stringify(calcPath)};\nconsole.log(await calculatorTool.run({ expression: "16-3-4" }));\n`,
    );
    const tsxCli = fileURLToPath(new URL("../../node_modules/tsx/dist/cli.mjs", import.meta.url));
    const { code, stdout, stderr } = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
      execFile(process.execPath, [tsxCli, script], { timeout: 90_000 }, (err, stdout, stderr) =>
        resolve({ code: err ? ((err as { code?: number }).code ?? -1) : 0, stdout, stderr }),
      );
    });
    await fs.rm(dir, { recursive: true, force: true });
    expect({ code, stdout: stdout.trim() }, stderr).toEqual({ code: 0, stdout: "9" });
  });
});
