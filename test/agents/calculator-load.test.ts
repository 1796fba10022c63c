/** The trainer's thread imports the calculator for its limits only; mathjs (a few hundred ms of
 *  startup) is loaded by the first evaluation, which runs in the calculator's worker. */
import { createRequire } from "node:module";
import { expect, it } from "vitest";

const mathjsLoaded = () => Object.keys(createRequire(import.meta.url).cache).some((k) => /[\\/]mathjs[\\/]/.test(k));

it("importing the calculator does not load mathjs; the first evaluation does", async () => {
  await import("../../src/agents/calculator.ts");
  const { evaluateExpression, MAX_EXPRESSION_LENGTH } = await import("../../src/agents/calculator-eval.ts");
  expect(MAX_EXPRESSION_LENGTH).toBe(200);
  expect(mathjsLoaded()).toBe(false);
  expect(evaluateExpression("16-3-4")).toBe("9");
  expect(mathjsLoaded()).toBe(true);
});
