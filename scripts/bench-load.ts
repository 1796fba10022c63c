/** The OpenAI-compatible server under load: a bounded mixed workload on 127.0.0.1 (plain, streamed,
 *  tools, n = 2, json_schema and bad bodies, in turn), each concurrency level in turn, every answer
 *  checked (scripts/lib/load-checks.ts). Prints, per level: answers by status, unexpected answers,
 *  p50/p99 latency, requests/s (all, and 200s only), completion tokens/s, and the server's RSS before and after.
 *  npx tsx scripts/bench-load.ts                          (starts serve-openai.ts on the tiny SFT model)
 *  npx tsx scripts/bench-load.ts --requests 2000 --concurrency 16,64 --max_tokens 16
 *  npx tsx scripts/bench-load.ts --url http://127.0.0.1:8001 --model tiny   (a server already running)
 *  Leaves out: adapters loaded at run time, /v1/responses, /v1/completions beyond a bad body. */
import { Command } from "commander";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import * as path from "node:path";
import { parseIntArg, parseList, runMain } from "../src/run/cli.ts";
import { TINY_BASE_DIR } from "../src/presets/tiny.ts";
import { UsageError } from "../src/util/errors.ts";
import { checkAnswer, requestOf, type LoadRequest } from "./lib/load-checks.ts";

const TINY_SFT = path.join("outputs", "tiny", "sft", "final");
const program = new Command("bench-load")
  .description("the OpenAI-compatible server under a bounded mixed load on 127.0.0.1")
  .option("--requests <n>", "requests per concurrency level", parseIntArg("requests", 1, 100_000), 2000)
  .option("--concurrency <list>", "requests in flight at once, one level after another", parseList("concurrency"), ["16", "64"])
  .option("--max_tokens <n>", "new tokens per answer at most (json_schema gets at least 32)", parseIntArg("max_tokens", 1), 16)
  .option("--url <url>", "a server already running on 127.0.0.1 (default: start scripts/serve-openai.ts)")
  .option("--model <name>", 'the "model" requests name (with --url)', "tiny")
  .option("--model_path <dir>", "checkpoint to serve (default: the tiny SFT output if present, else the tiny base)")
  .option(
    "--max_queue <n>",
    "the started server's --max_queue (low enough that the higher level meets 429s)",
    parseIntArg("max_queue", 0),
    48,
  )
  .option("--timeout_s <s>", "a request not answered in this long is unexpected", parseIntArg("timeout_s", 1), 120);

interface Result {
  kind: string;
  status: number;
  ms: number;
  tokens: number;
  problem: string | null;
}

await runMain(async () => {
  const o = program.parse(process.argv).opts();
  const levels = (o.concurrency as string[]).map((c) => parseIntArg("concurrency", 1, 1024)(c));
  const server = o.url ? null : await startServer(o.model_path ?? (existsSync(TINY_SFT) ? TINY_SFT : TINY_BASE_DIR), o.max_queue);
  const url: string = o.url ?? server!.url;
  if (!/^http:\/\/(127\.0\.0\.1|localhost|\[::1\])(:\d+)?$/.test(url.replace(/\/$/, "")))
    throw new UsageError(`--url ${url}: this load test runs against this machine only (http://127.0.0.1:PORT)`);
  const model: string = o.url ? o.model : "tiny";
  const rssMb = () => (server ? (rssOfTree(server.child.pid!) / 1024 / 1024).toFixed(0) : "-");
  try {
    // One request of each kind first, so the first level does not time the model's warm-up.
    for (let i = 0; i < 6; i++) await send(url, requestOf(i, model, o.max_tokens), o.timeout_s);
    process.stdout.write(`server ${url} | max_tokens ${o.max_tokens} | ${o.requests} requests per level\n`);
    process.stdout.write("conc  requests  200   4xx  429  unexpected  p50_ms  p99_ms  req/s  200/s  tok/s  rss_before_MB  rss_after_MB\n");
    let total = 0;
    for (const conc of levels) {
      const before = rssMb();
      const t0 = performance.now();
      const results = await runLevel(url, model, o.requests, conc, o.max_tokens, o.timeout_s);
      const seconds = (performance.now() - t0) / 1000;
      const after = rssMb();
      const bad = results.filter((r) => r.problem !== null);
      total += bad.length;
      const ms = results.map((r) => r.ms).sort((a, b) => a - b);
      const count = (f: (r: Result) => boolean) => results.filter(f).length;
      process.stdout.write(
        [
          String(conc).padStart(4),
          String(results.length).padStart(8),
          String(count((r) => r.status === 200)).padStart(4),
          String(count((r) => r.status >= 400 && r.status < 500 && r.status !== 429)).padStart(5),
          String(count((r) => r.status === 429)).padStart(4),
          String(bad.length).padStart(10),
          quantile(ms, 0.5).toFixed(0).padStart(6),
          quantile(ms, 0.99).toFixed(0).padStart(6),
          (results.length / seconds).toFixed(1).padStart(5),
          (count((r) => r.status === 200) / seconds).toFixed(1).padStart(5),
          (results.reduce((a, r) => a + r.tokens, 0) / seconds).toFixed(0).padStart(5),
          before.padStart(13),
          after.padStart(12),
        ].join("  ") + "\n",
      );
      for (const b of bad.slice(0, 10)) process.stdout.write(`  unexpected ${b.kind}: ${b.problem}\n`);
    }
    process.stdout.write(`unexpected answers: ${total}\n`);
    if (total > 0) process.exitCode = 1;
  } finally {
    server?.child.kill("SIGTERM");
  }
});

/** `n` requests, `conc` in flight at once; request i is requestOf(i). */
async function runLevel(url: string, model: string, n: number, conc: number, maxTokens: number, timeoutS: number): Promise<Result[]> {
  const results: Result[] = [];
  let next = 0;
  const worker = async () => {
    while (next < n) results.push(await send(url, requestOf(next++, model, maxTokens), timeoutS));
  };
  await Promise.all(Array.from({ length: conc }, worker));
  return results;
}

async function send(url: string, req: LoadRequest, timeoutS: number): Promise<Result> {
  const t0 = performance.now();
  try {
    const r = await fetch(url + req.path, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: req.body,
      signal: AbortSignal.timeout(timeoutS * 1000),
    });
    const text = await r.text();
    const check = checkAnswer(req, { status: r.status, headers: r.headers, text });
    return {
      kind: req.kind,
      status: r.status,
      ms: performance.now() - t0,
      tokens: r.status === 200 ? tokensOf(text) : 0,
      problem: check === "ok" ? null : check,
    };
  } catch (err) {
    return { kind: req.kind, status: 0, ms: performance.now() - t0, tokens: 0, problem: `no answer: ${(err as Error).message}` };
  }
}

/** Completion tokens from `usage` (the last one, for a stream that asked for it). */
function tokensOf(text: string): number {
  const m = [...text.matchAll(/"completion_tokens":(\d+)/g)].at(-1);
  return m ? Number(m[1]) : 0;
}

function quantile(sorted: number[], q: number): number {
  return sorted.length === 0 ? NaN : sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

/** RSS of a process and its descendants (the script's supervisor and the server it runs), from /proc. */
function rssOfTree(pid: number): number {
  const read = (p: number): number => {
    try {
      const kb = /VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${p}/status`, "utf8"));
      const kids = readFileSync(`/proc/${p}/task/${p}/children`, "utf8").trim().split(/\s+/).filter(Boolean).map(Number);
      return (kb ? Number(kb[1]) * 1024 : 0) + kids.reduce((a, k) => a + read(k), 0);
    } catch {
      return 0;
    }
  };
  return read(pid);
}

/** scripts/serve-openai.ts on a free port of 127.0.0.1; resolves once it says where it listens. */
function startServer(modelPath: string, maxQueue: number): Promise<{ child: ChildProcess; url: string }> {
  const args = ["--import", "tsx", path.join("scripts", "serve-openai.ts"), "--model_path", modelPath, "--quantize", "nf4"];
  args.push("--served_model_name", "tiny", "--no-tools_in_prompt", "--port", "0", "--max_queue", String(maxQueue));
  const child = spawn(process.execPath, args, { stdio: ["ignore", "ignore", "pipe"] });
  return new Promise((resolve, reject) => {
    let log = "";
    child.stderr!.on("data", (c: Buffer) => {
      log += c.toString();
      const m = /server on (http:\/\/[^\s/]+)\/v1/.exec(log);
      if (m) resolve({ child, url: m[1] });
    });
    child.on("exit", (code) => reject(new Error(`serve-openai.ts exited ${code} before listening:\n${log}`)));
  });
}
