/** What an AutoRL-Bench agent does, with this project's trainer: read the scenario from the grading
 *  server, train in the server's workspace (the tiny preset's SFT, then GRPO on its output), submit the
 *  result and print the improvement over the base model.
 *
 *    npx tsx scripts/serve.ts --workspace ws &          # the grading server (tiny scenario)
 *    npx tsx examples/autorl-agent.ts                    # this agent, ~10 min on a 2-core CPU
 *    npx tsx examples/autorl-agent.ts --sft_samples 160 --grpo_steps 4   # a quick run
 *
 *  Training runs the project's own scripts as child processes, the way an agent runs commands; the
 *  data comes from the scenario's `train_data`, and outputs go under `<workspace>/output/`. */
import { spawn } from "node:child_process";
import * as http from "node:http";
import * as path from "node:path";
import { Command } from "commander";
import { parseIntArg, runMain } from "../src/run/cli.ts";

const o = new Command()
  .name("autorl-agent")
  .description("Train on a grading server's scenario with the tiny preset's SFT + GRPO, submit, print the improvement")
  .option("--server <url>", "grading server", process.env.GRADING_SERVER_URL ?? "http://127.0.0.1:8000")
  .option("--scenario <id>", "scenario to train for", "tiny")
  .option("--sft_samples <n>", "SFT conversations (the preset: 640)", parseIntArg("sft_samples", 16), 640)
  .option("--grpo_steps <n>", "GRPO steps (the preset: 24)", parseIntArg("grpo_steps", 1), 24)
  .parse()
  .opts();

/** One JSON request. node:http rather than fetch: a /submit is answered when its evaluation is done,
 *  which on a busy CPU can take longer than fetch's fixed 300 s wait for the response headers. */
function api(method: "GET" | "POST", route: string, body?: unknown): Promise<any> {
  return new Promise((resolve, reject) => {
    const req = http.request(o.server + route, { method, headers: { "Content-Type": "application/json" } }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("error", reject);
      res.on("end", () => {
        let json: any;
        try {
          json = JSON.parse(Buffer.concat(chunks).toString("utf8"));
        } catch {
          return reject(new Error(`${method} ${route}: HTTP ${res.statusCode}: the answer is not JSON`));
        }
        if (res.statusCode !== 200) return reject(new Error(`${method} ${route}: HTTP ${res.statusCode}: ${json.error}`));
        resolve(json);
      });
    });
    req.on("error", (err) => reject(new Error(`${method} ${o.server}${route}: ${err.message} (is scripts/serve.ts running?)`)));
    req.end(body === undefined ? undefined : JSON.stringify(body));
  });
}

const ROOT = path.resolve(import.meta.dirname, ".."); // the checkout: scripts/ and tsx are found from here

/** Run one of the project's scripts; its output goes to this terminal. */
function run(script: string, args: string[]): Promise<void> {
  console.log(`$ npx tsx ${script} ${args.join(" ")}`);
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, ["--import", "tsx", script, ...args], { stdio: "inherit", cwd: ROOT });
    p.on("error", reject);
    p.on("close", (code) => (code === 0 ? resolve() : reject(new Error(`${script} exited with ${code}`))));
  });
}

await runMain(async () => {
  const { workspace } = await api("GET", "/health");
  const s = await api("GET", `/scenarios/${o.scenario}`);
  console.log(
    `scenario ${s.id}: ${s.name}\n  base model ${s.base_model_path ?? s.base_model}\n  train data ${s.train_data}\n  baseline ${s.baseline_score ?? `(${s.baseline.status})`}, n ${s.evaluation.n}, time left ${s.time.remaining ?? "unlimited"} s`,
  );
  if (s.id !== "tiny")
    throw new Error(
      `this example trains with the tiny preset; scenario ${s.id} needs the full-size recipe (README: Training Qwen2.5-0.5B on GSM8K)`,
    );

  const out = (name: string) => path.join(workspace, "output", name);
  // 1. SFT: the preset's full fine-tune of the base, on the scenario's training problems.
  await run("scripts/train-sft.ts", [
    "--preset",
    "tiny",
    "--model_path",
    s.base_model_path,
    "--dataset",
    s.train_data,
    "--max_samples",
    String(o.sft_samples),
    "--eval_samples",
    "0",
    "--output_dir",
    out("sft"),
    "--overwrite",
  ]);
  // 2. GRPO: LoRA on the NF4-quantized SFT model, rewards from the calculator-using rollouts.
  await run("scripts/train-gsm8k-agent.ts", [
    "--preset",
    "tiny",
    "--model_path",
    path.join(out("sft"), "final"),
    "--dataset",
    s.train_data,
    "--max_steps",
    String(o.grpo_steps),
    "--output_dir",
    out("grpo"),
    "--overwrite",
  ]);

  // 3. Submit both, as an agent iterating within its budget would; the server keeps the best.
  for (const stage of ["sft", "grpo"]) {
    const r = await api("POST", "/submit", { model_path: `output/${stage}/final`, scenario_id: s.id });
    if (r.error) {
      console.log(`submission ${r.submission_id} (${stage}): evaluation failed: ${r.error}`);
      continue;
    }
    // Scores are percent, as AutoRL-Bench gives them; improvements are points.
    const pts = (x: number) => `${x >= 0 ? "+" : ""}${x.toFixed(1)}`;
    const ci = r.improvement_ci ? ` [${pts(r.improvement_ci.lo)}, ${pts(r.improvement_ci.hi)}]` : "";
    const vs =
      r.baseline_score === null
        ? "no baseline yet"
        : `baseline ${r.baseline_score.toFixed(1)}%: improvement ${pts(r.improvement)} points${ci}`;
    console.log(
      `submission ${r.submission_id} (${stage}): score ${r.score.toFixed(1)}% vs ${vs} over ${r.n} questions; best so far ${r.best.score.toFixed(1)}% (submission ${r.best.submission_id})`,
    );
  }
});
