/** Kill anywhere: a short tiny GRPO run SIGKILLed at a random moment, then `--resume`d until it
 *  finishes, many times over; each finished run's adapter bytes are compared with an uninterrupted
 *  run's. Where bits differ, it prints which tensors and the first step whose logged metrics differ.
 *  npx tsx scripts/bench-kill.ts                      (20 kills of a 6-step run, checkpoint every step)
 *  npx tsx scripts/bench-kill.ts --kills 10 --kills_per_run 3 --save_steps 2 --seed 1
 *  The trainer is started as the process it is (MARL_TRAINER_CHILD=1, no supervising parent), so the
 *  SIGKILL lands on the process that writes the checkpoints. With --kills_per_run N the resumes are
 *  killed too (each at its own random moment), N kills before the last resume runs to its end. */
import { Command } from "commander";
import { spawn } from "node:child_process";
import { existsSync, promises as fs } from "node:fs";
import * as path from "node:path";
import { parseIntArg, runMain } from "../src/run/cli.ts";
import { TRAINER_CHILD_ENV } from "../src/run/shutdown.ts";
import { Rng } from "../src/util/rng.ts";

const program = new Command("bench-kill")
  .description("SIGKILL a tiny GRPO run at random moments, resume it, compare the final adapter with an uninterrupted run's")
  .option("--kills <n>", "runs killed, each then resumed to its end", parseIntArg("kills", 1), 20)
  .option(
    "--kills_per_run <n>",
    "kills per run: the first start and the --resume after each kill but the last are killed",
    parseIntArg("kills_per_run", 1),
    1,
  )
  .option("--max_steps <n>", "GRPO steps per run", parseIntArg("max_steps", 1), 6)
  .option("--prompts_per_step <n>", "questions per step (8 samples each)", parseIntArg("prompts_per_step", 1), 2)
  .option("--save_steps <n>", "checkpoint every this many steps", parseIntArg("save_steps", 1), 1)
  .option("--seed <n>", "seed of the kill moments", parseIntArg("seed", 0), 0)
  .option("--output_dir <dir>", "folder for the reference and the killed runs", path.join("outputs", "bench-kill"));

const ADAPTER = path.join("final", "adapter_model.safetensors");

await runMain(async () => {
  const o = program.parse(process.argv).opts();
  const flags = ["--preset", "tiny", "--max_steps", String(o.max_steps), "--prompts_per_step", String(o.prompts_per_step)];
  flags.push("--save_steps", String(o.save_steps));
  await fs.rm(o.output_dir, { recursive: true, force: true });
  // Two uninterrupted runs: the reference, and a check that the run repeats its own bits at all.
  const refDir = path.join(o.output_dir, "reference");
  const t0 = performance.now();
  await runToEnd([...flags, "--output_dir", refDir]);
  const runMs = performance.now() - t0;
  const again = path.join(o.output_dir, "reference-again");
  await runToEnd([...flags, "--output_dir", again]);
  const ref = await fs.readFile(path.join(refDir, ADAPTER));
  const repeat = await differences(ref, await fs.readFile(path.join(again, ADAPTER)));
  process.stdout.write(
    `uninterrupted run: ${(runMs / 1000).toFixed(1)} s; a second one ${repeat.length === 0 ? "has the same adapter bits" : `differs: ${repeat.join("; ")}`}\n`,
  );
  process.stdout.write("run  killed at (s)    state each kill left                     resumes  same_bits\n");
  const rng = new Rng(o.seed);
  let same = 0;
  for (let k = 0; k < o.kills; k++) {
    const dir = path.join(o.output_dir, `killed-${k}`);
    // Nothing to continue from (killed before run.json was written): the same command again.
    const again = () => [...flags, "--output_dir", dir, ...(existsSync(path.join(dir, "run.json")) ? ["--resume"] : ["--overwrite"])];
    const done = () => existsSync(path.join(dir, "report.html")) && existsSync(path.join(dir, ADAPTER));
    const at: string[] = [],
      states: string[] = [];
    for (let i = 0; i < o.kills_per_run && !done(); i++) {
      const atMs = rng.next() * runMs;
      const killed = await runAndKill(i === 0 ? [...flags, "--output_dir", dir] : again(), atMs);
      at.push((atMs / 1000).toFixed(1));
      states.push(killed ? await stateOf(dir) : "finished first");
    }
    let resumes = 0;
    for (; !done(); resumes++) await runToEnd(again());
    const diff = await differences(ref, await fs.readFile(path.join(dir, ADAPTER)));
    if (diff.length === 0) same++;
    process.stdout.write(
      `${String(k).padStart(3)}  ${at.join(" ").padEnd(15)}  ${states.join(" | ").padEnd(39)}  ${String(resumes).padStart(7)}  ${diff.length === 0 ? "yes" : "NO"}\n`,
    );
    if (diff.length > 0) {
      process.stdout.write(`      tensors: ${diff.join("; ")}\n`);
      process.stdout.write(`      metrics: ${await firstMetricDifference(refDir, dir)}\n`);
    }
  }
  process.stdout.write(`same final adapter bits as the uninterrupted run: ${same} of ${o.kills}\n`);
  if (same !== o.kills) process.exitCode = 1;
});

/** The trainer process itself (no supervising parent), so a SIGKILL reaches what writes the files. */
function trainer(args: string[]) {
  const script = path.join("scripts", "train-gsm8k-agent.ts");
  return spawn(process.execPath, ["--import", "tsx", script, ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, [TRAINER_CHILD_ENV]: "1" },
  });
}

async function runToEnd(args: string[]): Promise<void> {
  const child = trainer(args);
  let log = "";
  for (const s of [child.stdout, child.stderr]) s.on("data", (c: Buffer) => (log += c.toString()));
  const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
  if (code !== 0) throw new Error(`train-gsm8k-agent.ts ${args.join(" ")} exited ${code}:\n${log.slice(-2000)}`);
}

/** Start a run and SIGKILL it after `ms`; false if it finished first. */
async function runAndKill(args: string[], ms: number): Promise<boolean> {
  const child = trainer(args);
  child.stdout.resume();
  child.stderr.resume();
  const exited = new Promise<number | null>((resolve) => child.on("exit", resolve));
  const timer = setTimeout(() => child.kill("SIGKILL"), ms);
  const code = await exited;
  clearTimeout(timer);
  if (code === 0) return false;
  if (child.signalCode !== "SIGKILL") throw new Error(`train-gsm8k-agent.ts ${args.join(" ")} exited ${code} before the kill`);
  return true;
}

/** What the killed run left: its newest checkpoint, temp folders, metrics lines. */
async function stateOf(dir: string): Promise<string> {
  const names = await fs.readdir(dir).catch(() => [] as string[]);
  if (names.length === 0) return "nothing written";
  const latest = await fs.readFile(path.join(dir, "latest"), "utf8").catch(() => "");
  const steps = (await fs.readFile(path.join(dir, "metrics.jsonl"), "utf8").catch(() => "")).split("\n").filter(Boolean).length;
  const tmp = names.filter((n) => /tmp|\.old/.test(n)).length;
  return `${latest.trim() || "no ckpt"}, ${steps} logged${tmp ? `, ${tmp} tmp` : ""}${names.includes("final") ? ", final" : ""}`;
}

/** Tensors whose bytes differ between two safetensors files, with the largest absolute difference. */
async function differences(a: Buffer, b: Buffer): Promise<string[]> {
  if (a.equals(b)) return [];
  const ta = tensorsOf(a),
    tb = tensorsOf(b);
  const out: string[] = [];
  for (const [name, x] of ta) {
    const y = tb.get(name);
    if (!y) out.push(`${name} missing`);
    else if (!x.equals(y)) {
      const fx = new Float32Array(x.buffer, x.byteOffset, x.length / 4),
        fy = new Float32Array(y.buffer, y.byteOffset, y.length / 4);
      let max = 0;
      for (let i = 0; i < fx.length; i++) max = Math.max(max, Math.abs(fx[i] - fy[i]));
      out.push(`${name} max |Δ| ${max.toExponential(2)}`);
    }
  }
  return out.length > 0 ? out : ["same tensors, different header bytes"];
}

function tensorsOf(file: Buffer): Map<string, Buffer> {
  const n = Number(file.readBigUInt64LE(0));
  const header = JSON.parse(file.subarray(8, 8 + n).toString("utf8")) as Record<string, { data_offsets: [number, number] }>;
  const body = Buffer.from(file.subarray(8 + n)); // copied: aligned for Float32Array
  return new Map(
    Object.entries(header)
      .filter(([k]) => k !== "__metadata__")
      .map(([k, v]) => [k, body.subarray(v.data_offsets[0], v.data_offsets[1])]),
  );
}

/** The first step whose metrics line differs in loss or reward (timings and memory left out). */
async function firstMetricDifference(refDir: string, dir: string): Promise<string> {
  const read = async (d: string) =>
    (await fs.readFile(path.join(d, "metrics.jsonl"), "utf8"))
      .split("\n")
      .filter(Boolean)
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  const [a, b] = [await read(refDir), await read(dir)];
  for (const r of a) {
    const s = b.find((x) => x.step === r.step);
    for (const k of ["loss", "reward", "grad_norm"]) if (s && s[k] !== r[k]) return `step ${r.step}: ${k} ${r[k]} vs ${s[k]}`;
  }
  return "loss, reward and grad_norm equal at every step";
}
