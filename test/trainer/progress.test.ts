import { describe, expect, it } from "vitest";
import { PassThrough } from "node:stream";
import { createProgress, formatDuration } from "../../src/trainer/progress.ts";

function sink(isTTY = false) {
  const s = new PassThrough() as PassThrough & { isTTY?: boolean; columns?: number };
  s.isTTY = isTTY;
  s.columns = 120;
  let text = "";
  s.on("data", (d) => (text += d));
  return { stream: s, text: () => text };
}

describe("progress", () => {
  it("prints plain lines every N% and every K seconds when not a terminal", () => {
    const out = sink(false);
    let t = 0;
    const p = createProgress(100, "grpo", { keyMetric: "reward", stream: out.stream, now: () => t, everyPercent: 50, everySeconds: 20 });
    for (let i = 1; i <= 60; i++) {
      t += 1000;
      p.update(i, { reward: i / 100 });
    }
    // every 20 s (t = 20, 40), and at 50%; t = 60 is only 10 s after the 50% line
    const lines = out.text().trim().split("\n");
    expect(lines).toEqual([
      "grpo 20/100 (20%) | reward 0.2 | elapsed 20s | eta 1:20",
      "grpo 40/100 (40%) | reward 0.4 | elapsed 40s | eta 1:00",
      "grpo 50/100 (50%) | reward 0.5 | elapsed 50s | eta 50s",
    ]);
    p.log("step 60/100 | reward 0.6");
    p.update(100);
    p.stop();
    const all = out.text().trim().split("\n");
    expect(all.slice(3)).toEqual(["step 60/100 | reward 0.6", "grpo 100/100 (100%) | reward 0.6 | elapsed 1:00 | done"]);
    expect(out.text()).not.toContain("\r");
  });

  it("counts the rate from a resumed start and prints the last value on stop", () => {
    const out = sink(false);
    let t = 0;
    const p = createProgress(200, "sft", { stream: out.stream, now: () => t, start: 100, everyPercent: 100, everySeconds: 1e9 });
    t = 10_000;
    p.update(110);
    p.stop();
    expect(out.text().trim()).toBe("sft 110/200 (55%) | elapsed 10s | eta 1:30");
  });

  it("draws a bar with the key metric on a terminal", () => {
    const out = sink(true);
    const p = createProgress(10, "eval", { keyMetric: "accuracy", stream: out.stream, plain: false });
    p.update(4, { accuracy: 0.5 });
    p.log("a line above the bar");
    p.stop();
    expect(out.text()).toContain("eval |");
    expect(out.text()).toContain("accuracy 0.5");
    expect(out.text()).toContain("a line above the bar");
  });

  it("formats durations", () => {
    expect(formatDuration(9.6)).toBe("10s");
    expect(formatDuration(75)).toBe("1:15");
    expect(formatDuration(3725)).toBe("1:02:05");
    expect(formatDuration(NaN)).toBe("?");
    expect(() => createProgress(-1, "x")).toThrow(/total -1/);
  });
});
