/** Convert a GSM8K split to SFT conversations, re-run every calculator call with the real calculator
 *  and report how the annotated results compare (ok / format / rounded / wrong / error), with examples.
 *  Usage: npx tsx scripts/check-sft-conversion.ts [--data PATH|gsm8k] [--split train] [--max-samples N]
 *         npx tsx scripts/check-sft-conversion.ts --synthetic 5000 [--seed 0]   (the tiny preset's data) */
import * as fs from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { Command } from "commander";
import { calculatorTool, shutdownCalculator } from "../src/agents/calculator.ts";
import { loadGsm8k, type Gsm8kSplit } from "../src/datasets/gsm8k.ts";
import { buildSftConversations, type ToolCheckStatus } from "../src/agents/sft.ts";
import { generateSynthetic } from "../src/datasets/synthetic.ts";

const here = path.dirname(fileURLToPath(import.meta.url));
const sharedTrain = path.resolve(here, "../../shared/data/gsm8k/train.jsonl");

const opts = new Command()
  .description("Check the GSM8K -> tool-calling SFT conversion against the real calculator")
  .option("--data <source>", "JSONL or parquet path, or the dataset name gsm8k", fs.existsSync(sharedTrain) ? sharedTrain : "gsm8k")
  .option("--split <split>", "train or test (picks the split of a dataset name; names the ids)", "train")
  .option("--max-samples <n>", "only the first N rows", (v) => Number(v))
  .option("--synthetic <n>", "check N synthetic problems instead of --data", (v) => Number(v))
  .option("--seed <n>", "seed of the synthetic problems", (v) => Number(v), 0)
  .option("--show <n>", "examples shown per category", (v) => Number(v), 5)
  .parse()
  .opts<{ data: string; split: Gsm8kSplit; maxSamples?: number; synthetic?: number; seed: number; show: number }>();

const t0 = Date.now();
const examples =
  opts.synthetic !== undefined
    ? generateSynthetic({ n: opts.synthetic, seed: opts.seed })
    : await loadGsm8k(opts.data, { split: opts.split, maxSamples: opts.maxSamples });
const source = opts.synthetic !== undefined ? `synthetic (seed ${opts.seed})` : `${opts.data} (${opts.split})`;
const built = await buildSftConversations(examples, calculatorTool);
const seconds = (Date.now() - t0) / 1000;
await shutdownCalculator();

const total = Object.values(built.counts).reduce((a, b) => a + b, 0);
const calls = built.conversations.map((c) => c.filter((m) => m.role === "tool").length);
console.log(`${source}: ${examples.length} examples, ${total} calculator calls re-run in ${seconds.toFixed(1)} s`);
console.log(`kept ${built.conversations.length} conversations, dropped ${built.dropped.length} (a wrong or failing call)`);
console.log(
  `calls per kept conversation: mean ${(calls.reduce((a, b) => a + b, 0) / Math.max(1, calls.length)).toFixed(2)}, ` +
    `max ${Math.max(0, ...calls)}, without any call ${calls.filter((n) => n === 0).length}`,
);
const meaning: Record<ToolCheckStatus, string> = {
  ok: "calculator text equals the annotation",
  format: "same value, other text (tool message uses the calculator's)",
  rounded: "annotation is the value rounded/cut (kept, calculator text in the tool message)",
  wrong: "annotation has another value (example dropped)",
  error: "calculator returned no number (example dropped)",
};
for (const status of Object.keys(meaning) as ToolCheckStatus[]) {
  console.log(`${status.padEnd(8)} ${String(built.counts[status]).padStart(6)}  ${meaning[status]}`);
  for (const m of built.mismatches.filter((x) => x.check.status === status).slice(0, opts.show))
    console.log(`    ${m.id}: ${m.check.expression}  annotated ${m.check.annotated}  calculator ${JSON.stringify(m.check.computed)}`);
}
