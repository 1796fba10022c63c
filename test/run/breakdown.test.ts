/** gpu-check's breakdowns (scripts/lib/breakdown.ts): the printed parts of a time add up to it, the
 *  rest named, or the line says that the parts overlap. */
import { describe, expect, it } from "vitest";
import { formatBreakdown } from "../../scripts/lib/breakdown.ts";

describe("formatBreakdown", () => {
  it("names the rest, so the printed figures add up", () => {
    expect(
      formatBreakdown(0.6, [
        ["the host encoding the steps", 0.1],
        ["the draws", 0.45],
      ]),
    ).toBe("0.60 s, of which 0.10 s the host encoding the steps, 0.45 s the draws and 0.05 s the rest");
    // rounded parts: 0.33 + 0.33 + 0.33 = 0.99 of a printed 1.00
    expect(
      formatBreakdown(1, [
        ["a", 1 / 3],
        ["b", 1 / 3],
        ["c", 1 / 3],
      ]),
    ).toBe("1.00 s, of which 0.33 s a, 0.33 s b, 0.33 s c and 0.01 s the rest");
  });

  it("says when parts overlap instead of a negative rest (gpu-check's decode 0.6 s with parts of 0.1 s and 0.64 s)", () => {
    expect(
      formatBreakdown(0.6, [
        ["the host encoding the steps", 0.1],
        ["the draws", 0.64],
      ]),
    ).toBe(
      "0.60 s, of which 0.10 s the host encoding the steps and 0.64 s the draws (these overlap: together 0.74 s, more than the whole)",
    );
  });

  it("leaves out zero parts and a zero rest", () => {
    expect(
      formatBreakdown(2.5, [
        ["prefill", 0.5],
        ["decode", 2],
        ["reference", 0],
      ]),
    ).toBe("2.50 s, of which 0.50 s prefill and 2.00 s decode");
    expect(formatBreakdown(0.25, [["old", 0]])).toBe("0.25 s");
  });
});
