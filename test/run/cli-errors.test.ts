/** The training scripts' bad-input contract, checked on real processes: one line on stderr, exit
 *  code 2, and nothing written. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { makeTinyModelDir } from "./helpers/tiny-fixture.ts";
import { ROOT, runScript } from "./helpers/run-script.ts";

const LORA_FIXTURE = path.join(ROOT, "test", "fixtures", "qwen2-tiny", "lora");

const run = runScript;

let model: string;
let tmp: string;
let existingRun: string;
beforeAll(async () => {
  model = await makeTinyModelDir();
  tmp = await fs.mkdtemp(path.join(os.tmpdir(), "marl-cli-"));
  existingRun = path.join(tmp, "existing");
  await fs.mkdir(existingRun);
  await fs.writeFile(path.join(existingRun, "run.json"), "{}\n");
  await fs.writeFile(path.join(existingRun, "metrics.jsonl"), '{"step":1}\n');
});
afterAll(async () => {
  await fs.rm(tmp, { recursive: true, force: true });
});

const errorLines = (stderr: string) => stderr.split("\n").filter((l) => l.startsWith("error:"));

describe.each([
  ["train-sft.ts", ["--learning_rate", "abc"], /--learning_rate "abc"/],
  ["train-sft.ts", ["--quantize", "fp8"], /--quantize .*fp8.*none, int8, nf4/],
  ["train-sft.ts", ["--model_path", "./no/such/model"], /--model_path \.\/no\/such\/model: no such folder/],
  ["train-sft.ts", ["--dataset", "no-such.jsonl"], /--dataset no-such.jsonl: no such file/],
  ["train-sft.ts", ["--bogus"], /unknown option '--bogus'/],
  ["train-gsm8k-agent.ts", ["--threads", "9"], /--threads "9": expected auto or a whole number from 1 to 8/],
  ["train-gsm8k-agent.ts", ["--bogus"], /unknown option '--bogus'/],
  ["train-sft.ts", ["--inline_share", "1.5"], /--inline_share "1.5"/],
  ["train-sft.ts", ["--inline_ops", "+,sqrt"], /--inline_ops "\+,sqrt": unknown sqrt/],
  ["train-gsm8k-agent.ts", ["--loss_type", "ppo"], /--loss_type .*ppo/],
  ["train-gsm8k-agent.ts", ["--reward_weights", "bogus=1"], /--reward_weights: .*bogus/],
  ["train-gsm8k-agent.ts", ["--samples_per_prompt", "1"], /--samples_per_prompt "1"/],
  ["train-gsm8k-agent.ts", ["--init_adapter", "LORA"], /lora_B\.weight has shape \[32,4\], expected \[64, 4\]/],
  // Found only once the model is loaded (or by the run's own checks): still nothing left behind.
  ["train-gsm8k-agent.ts", ["--top_p", "0"], /--top_p 0: expected a number above 0/],
  ["train-gsm8k-agent.ts", ["--epsilon", "5"], /--epsilon 5: expected a number >= 0 and below 1/],
  ["train-gsm8k-agent.ts", ["--max_new_tokens", "99999999"], /--max_new_tokens 99999999: the model holds 1024 positions/],
  [
    "train-gsm8k-agent.ts",
    ["--max_new_tokens", "1000"],
    /the system prompt with 1 tool is \d+ tokens; with 1000 new tokens it does not fit the model's context of 1024/,
  ],
  ["train-sft.ts", ["--max_length", "8", "--max_samples", "4"], /no training conversations left/],
  ["train-gsm8k-agent.ts", ["--tools", "nosuch"], /--tools: unknown tool "nosuch"; built in: calculator/],
  ["train-gsm8k-agent.ts", ["--tools", "calculator,mcp:"], /mcp: needs a command line/],
  [
    "train-gsm8k-agent.ts",
    ["--tools", "mcp:/no/such/mcp-server --stdio"],
    /--tools mcp:\/no\/such\/mcp-server --stdio: server did not start \(command not found\)/,
  ],
  [
    "train-gsm8k-agent.ts",
    ["--env", "http://127.0.0.1:9"],
    /--env http:\/\/127\.0\.0\.1:9: connect ECONNREFUSED 127\.0\.0\.1:9 \(is the server running\?\)/,
  ],
  [
    "train-gsm8k-agent.ts",
    ["--env_tasks", "0-99,50-20"],
    /--env_tasks "0-99,50-20": 50-20 ends before it starts; expected data_idx ranges like 0-99,200-249/,
  ],
  ["eval.ts", ["--env_tasks", "1000-"], /--env_tasks "1000-": "1000-" is not a number or a range; expected data_idx ranges/],
  ["train-gsm8k-agent.ts", ["--tools", "mcp:http://127.0.0.1:9/mcp"], /--tools mcp:http:\/\/127\.0\.0\.1:9\/mcp: server did not start/],
])("%s %j", (script, args, message) => {
  it("exits 2 with one error line and writes nothing", async () => {
    const out = path.join(tmp, `out-${script}-${args.join("_").replace(/[^\w]/g, "")}`);
    const argv = args.map((a) => (a === "LORA" ? LORA_FIXTURE : a));
    const needsModel = !argv.includes("--model_path");
    const r = await run(script, [
      ...(needsModel ? ["--model_path", model] : []),
      "--dataset",
      "synthetic",
      ...argv,
      "--output_dir",
      out,
      "--backend",
      "wasm",
    ]);
    expect(r.code, r.stderr).toBe(2);
    const lines = errorLines(r.stderr);
    expect(lines, r.stderr).toHaveLength(1);
    expect(lines[0]).toMatch(message);
    expect(r.stderr).not.toMatch(/\n\s+at /); // no stack trace
    await expect(fs.stat(out)).rejects.toThrow();
  });
});

describe("npm run bench", () => {
  it("answers an unknown workload or config with one error line and exit 2, before starting a backend", async () => {
    for (const [args, message] of [
      [["--workloads", "forward,prefill"], /^error: unknown workload "prefill"; accepted: forward, fwd_bwd, decode, grpo_step$/],
      [["--config", "7b"], /^error: unknown bench config "7b"; accepted: small, 0\.5b, all$/],
      [["--repeat", "0"], /^error: --repeat must be a whole number ≥ 1, got "0"$/],
      [["--layers", "0"], /^error: --layers must be a whole number ≥ 1, got "0"$/],
    ] as const) {
      const r = await run("bench.ts", [...args]);
      expect(r.code, r.stderr).toBe(2);
      expect(errorLines(r.stderr), r.stderr).toHaveLength(1);
      expect(errorLines(r.stderr)[0]).toMatch(message);
      expect(r.stderr).not.toMatch(/tfjs backend|\n\s+at /);
      expect(r.stdout).toBe("");
    }
  });
});

describe("a folder that holds another run", () => {
  it("is refused without --overwrite or --resume and left as it was", async () => {
    for (const script of ["train-sft.ts", "train-gsm8k-agent.ts"]) {
      const r = await run(script, ["--model_path", model, "--dataset", "synthetic", "--output_dir", existingRun, "--backend", "wasm"]);
      expect(r.code, r.stderr).toBe(2);
      expect(errorLines(r.stderr)[0]).toMatch(/already holds a run; pass --resume to continue it or --overwrite to replace it/);
      expect((await fs.readdir(existingRun)).sort()).toEqual(["metrics.jsonl", "run.json"]);
    }
  });
});
