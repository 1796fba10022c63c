import { describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { writeRunConfig } from "../../src/run/output-dir.ts";
import { MetricsLogger } from "../../src/trainer/metrics.ts";
import { chartedKeys, escapeHtml, niceTicks, renderEvalReport, writeEvalReport, writeReport } from "../../src/report/report.ts";

import { expectSelfContained } from "./helpers/report-helpers.ts";

const tmp = () => fs.mkdtemp(path.join(os.tmpdir(), "marl-report-"));

describe("training report", () => {
  it("draws one chart per metric present, a final-values table and the config", async () => {
    const run = await tmp();
    await writeRunConfig(run, { lr: 1e-5, model: "<tiny>" }, "grpo");
    const log = new MetricsLogger(path.join(run, "metrics.jsonl"));
    for (let s = 1; s <= 40; s++) {
      const m: Record<string, number | string> = {
        reward: s / 40,
        reward_std: 0.2,
        kl: 0.001 * s,
        completion_len: 100 + s,
        lr: 1e-5,
        my_custom: s % 3,
        phase: "rl",
      };
      if (s % 10 === 0) m.eval_accuracy = s / 50;
      log.log(s, m);
    }
    const file = await writeReport(run, { title: "GRPO <run>", extra: { "final eval accuracy": 0.8 } });
    expect(file).toBe(path.join(run, "report.html"));
    const html = await fs.readFile(file, "utf8");
    expectSelfContained(html);
    // reward (with its std as a band, not a chart of its own), eval_accuracy, kl, completion_len, my_custom;
    // lr never moves: one line of text instead of a chart
    expect(html.match(/<svg/g)).toHaveLength(5);
    expect(html).toContain("<li><b>lr</b>: 1e-5 throughout (40 steps, 1–40)</li>");
    expect(html).not.toContain('aria-label="Learning rate"');
    expect(html).toContain('aria-label="Completion length (tokens)"');
    expect(html).toContain('aria-label="Reward (mean ± std)"');
    expect(html).toContain('class="band"');
    expect(html).toContain('aria-label="my_custom"');
    expect(html).not.toContain('aria-label="reward_std"');
    expect(html).toContain("GRPO &lt;run&gt;");
    expect(html).toContain("&lt;tiny&gt;");
    expect(html).not.toContain("<tiny>");
    expect(html).toContain("40 logged steps, step 1 to 40");
    expect(html).toMatch(/<tr><th>reward<\/th><td class="n">1<\/td><td class="n">40<\/td>/);
    expect(html).toContain("final eval accuracy");
  });

  it("orders known curves first and handles a single logged step", async () => {
    expect(chartedKeys([{ step: 1, time: 0, zeta: 1, loss: 2, reward: 1, reward_std: 0 }])).toEqual(["reward", "loss", "zeta"]);
    expect(chartedKeys([{ step: 1, time: 0, loss: 2, reward_std: 0.3 }])).toEqual(["loss", "reward_std"]);
    const run = await tmp();
    await fs.writeFile(path.join(run, "metrics.jsonl"), '{"step":1,"time":5,"loss":2.5}\n');
    const html = await fs.readFile(await writeReport(run, { title: "SFT" }), "utf8");
    expectSelfContained(html);
    expect(html).not.toContain("<svg");
    expect(html).toContain("<li><b>loss</b>: 2.5 (step 1 only)</li>");
    // a step logged twice (resume without truncation) is drawn once, with its last value
    await fs.writeFile(
      path.join(run, "metrics.jsonl"),
      '{"step":1,"time":0,"loss":3}\n{"step":2,"time":1,"loss":2}\n{"step":2,"time":2,"loss":1.5}\n',
    );
    const again = await fs.readFile(await writeReport(run, { title: "SFT" }), "utf8");
    expect(again).toContain("2 logged steps, step 1 to 2");
    expect(again.match(/<circle/g)).toHaveLength(2);
    expect(again).toMatch(/<tr><th>loss<\/th><td class="n">1.5<\/td><td class="n">2<\/td><td class="n">1.5<\/td><td class="n">3<\/td>/);
    expect(html).not.toContain("NaN");
  });

  it("picks round tick values", () => {
    expect(niceTicks(0, 1, 4)).toEqual([0, 0.5, 1]);
    expect(niceTicks(-0.3, 0.3, 4)).toEqual([-0.2, 0, 0.2]);
    expect(niceTicks(2, 2)).toEqual([2]);
    expect(niceTicks(0.13, 0.87, 4)).toEqual([0.2, 0.4, 0.6, 0.8]);
    expect(niceTicks(1, 200, 5)).toEqual([50, 100, 150, 200]);
    expect(escapeHtml(`<a href="x">&'`)).toBe("&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
  });
});

describe("evaluation report", () => {
  it("tables accuracy with Wilson intervals and pass@k, escapes names", async () => {
    const html = renderEvalReport({
      title: "GSM8K test",
      rows: [
        { name: "base", n: 10, correct: 8, extra: { "format ok": 0.9 } },
        { name: "grpo <step 200>", n: 100, correct: 50, passAtK: { 1: 0.5, 4: 0.71 } },
        { name: "pass@1 of 4 samples", n: 20, correct: 0, interval: { value: 0.625, lo: 0.5, hi: 0.75 } },
      ],
      config: { split: "test" },
    });
    expectSelfContained(html);
    expect(html).toContain('80.0%</td><td class="n">49.0% – 94.3%');
    expect(html).toContain('50.0%</td><td class="n">40.4% – 59.6%');
    expect(html).toContain('62.5%</td><td class="n">50.0% – 75.0%');
    expect(html).toContain("<th>pass@4</th>");
    expect(html).toContain("71.0%");
    expect(html).toContain("grpo &lt;step 200&gt;");
    expect(() => renderEvalReport({ title: "x", rows: [{ name: "a", n: 3, correct: 4 }] })).toThrow(/successes = 4 > n = 3/);
    const file = await writeEvalReport(path.join(await tmp(), "eval", "eval.html"), { title: "t", rows: [] });
    expect(await fs.readFile(file, "utf8")).toContain("No evaluations.");
  });
});
