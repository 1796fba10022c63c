import { describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs";
import { formatNumber, formatStepLine, meanStd, memoryStats, MetricsLogger, readMetrics, SFT_LINE } from "../../src/trainer/metrics.ts";

const tmp = () => fs.mkdtemp(path.join(os.tmpdir(), "marl-metrics-"));

describe("meanStd", () => {
  it("is the population mean and std", () => {
    const r = meanStd([2, 4, 4, 4, 5, 5, 7, 9]);
    expect(r.mean).toBe(5);
    expect(r.std).toBe(2);
    expect(meanStd([1])).toEqual({ mean: 1, std: 0 });
    expect(Number.isNaN(meanStd([]).mean)).toBe(true);
  });
});

describe("formatStepLine", () => {
  it("prints the same fields every step, compactly", () => {
    const m = {
      reward: 0.4123,
      reward_std: 0.381,
      accuracy: 0.375,
      kl: 0.00412,
      clip_ratio: 0.02,
      completion_len: 143.2,
      tool_calls: 2.1,
      step_time: 9.84,
    };
    expect(formatStepLine(12, 200, m)).toBe(
      "step 12/200 | reward 0.41±0.38 | acc 0.38 | kl 0.0041 | clip 0.02 | len 143 | tools 2.1 | 9.8 s",
    );
    expect(formatStepLine(1, 200, { reward: 0 })).toBe("step 1/200 | reward 0 | acc - | kl - | clip - | len - | tools - | - s");
    expect(formatStepLine(3, 10, { loss: 1.23456, lr: 3e-5, grad_norm: 0.5, step_time: 0.25 }, SFT_LINE)).toBe(
      "step 3/10 | loss 1.23 | lr 3e-5 | grad 0.5 | 0.25 s",
    );
  });

  it("formats numbers compactly", () => {
    expect(formatNumber(0)).toBe("0");
    expect(formatNumber(1)).toBe("1");
    expect(formatNumber(-0.5)).toBe("-0.5");
    expect(formatNumber(12.34)).toBe("12");
    expect(formatNumber(99.96)).toBe("100");
    expect(formatNumber(1234.5)).toBe("1235");
    expect(formatNumber(2.5e-4)).toBe("2.5e-4");
    expect(formatNumber(NaN)).toBe("nan");
  });
});

describe("MetricsLogger", () => {
  it("appends one JSON object per line and reads them back", async () => {
    const file = path.join(await tmp(), "run", "metrics.jsonl");
    const log = new MetricsLogger(file);
    log.log(1, { reward: 0.5, note: "warmup" });
    log.log(2, { reward: NaN, loss: 1.5 });
    const text = await fs.readFile(file, "utf8");
    expect(text.trim().split("\n")).toHaveLength(2);
    const recs = await readMetrics(file);
    expect(recs.map((r) => r.step)).toEqual([1, 2]);
    expect(recs[0]).toMatchObject({ step: 1, reward: 0.5, note: "warmup" });
    expect(recs[1].reward).toBeNull();
    expect(Math.abs(recs[0].time - Date.now() / 1000)).toBeLessThan(60);
    expect(() => log.log(-1, {})).toThrow(/step -1/);
  });

  it("drops steps after the resume point, tolerates a torn last line, rejects damage elsewhere", async () => {
    const file = path.join(await tmp(), "metrics.jsonl");
    const log = new MetricsLogger(file);
    for (let s = 1; s <= 5; s++) log.log(s, { loss: s });
    await fs.appendFile(file, '{"step":6,"lo'); // crash mid-line
    expect((await readMetrics(file)).map((r) => r.step)).toEqual([1, 2, 3, 4, 5]);
    new MetricsLogger(file).log(6, { loss: 6 }); // reopened without a resume point: torn line cut first
    expect((await readMetrics(file)).map((r) => r.step)).toEqual([1, 2, 3, 4, 5, 6]);
    const resumed = new MetricsLogger(file, { resumeStep: 3 });
    resumed.log(4, { loss: 40 });
    const recs = await readMetrics(file);
    expect(recs.map((r) => [r.step, r.loss])).toEqual([
      [1, 1],
      [2, 2],
      [3, 3],
      [4, 40],
    ]);

    await fs.writeFile(file, '{"step":1}\nnot json\n{"step":2}\n');
    await expect(readMetrics(file)).rejects.toThrow(/metrics.jsonl:2: not a JSON object/);
    await expect(readMetrics(path.join(path.dirname(file), "none.jsonl"))).rejects.toThrow(/not found/);
  });
});

describe("memoryStats", () => {
  it("counts live tensors", () => {
    const before = memoryStats();
    const t = tf.zeros([4, 4]);
    const mid = memoryStats();
    expect(mid.tensors).toBe(before.tensors + 1);
    expect(mid.tensorBytes).toBe(before.tensorBytes + 64);
    expect(mid.rssBytes).toBeGreaterThan(0);
    t.dispose();
    expect(memoryStats().tensors).toBe(before.tensors);
  });
});
