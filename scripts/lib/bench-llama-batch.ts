/** Dev benchmark of LlamaBatch (src/rollout/engines/llama-batch.ts), the llama.cpp decoder for GRPO
 *  rollouts: prefill and decode tokens/s at each --batch, with and without log-probs and a LoRA;
 *  prompt sharing (prefill once + fork vs prefill every row); adapter swap time and RSS over swaps.
 *    npx tsx scripts/lib/bench-llama-batch.ts --gguf model.gguf --batch 8,32 --prompt 220 --new 256 --threads 2
 *    npx tsx scripts/lib/bench-llama-batch.ts --random_base /tmp/qwen05b-random-q8_0.gguf --batch 32
 *  --random_base writes a Qwen2.5-0.5B-shape base with random weights (Q8_0, the tiny preset's
 *  tokenizer padded to 151,936 ids) to that path first unless it exists. The LoRA is random, rank
 *  --lora_rank on all seven projections, shaped from the GGUF's metadata. Prompts are random byte
 *  tokens; every row draws at temperature 1 with top-k and top-p off until --new tokens. */
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { writeLoraGguf, writeModelGguf } from "../../src/model/gguf.ts";
import { moduleDims } from "../../src/model/lora.ts";
import { moduleGroup, peftKey } from "../../src/model/peft.ts";
import type { HostTensor } from "../../src/model/safetensors.ts";
import { LORA_TARGETS, type Qwen2Config } from "../../src/model/types.ts";
import { TINY_BASE_DIR } from "../../src/presets/tiny.ts";
import { LlamaBatch, type StepInput } from "../../src/rollout/engines/llama-batch.ts";
import { importLlama } from "../../src/rollout/engines/llama-package.ts";
import { parseIntArg, parseList, runMain } from "../../src/run/cli.ts";
import { commandOf, flag, optional, parseFlags, type FlagTable } from "../../src/run/flags.ts";
import { UsageError } from "../../src/util/errors.ts";
import { Rng } from "../../src/util/rng.ts";
import { BENCH_CONFIGS } from "./bench.ts";

const FLAGS = {
  gguf: optional("--gguf <file>", "the base GGUF to decode with"),
  random_base: optional("--random_base <file>", "write a random Qwen2.5-0.5B-shape Q8_0 base here (unless it exists) and use it"),
  batch: flag("--batch <list>", "rows decoded together, one run each", parseList("batch"), ["8", "32"]),
  prompt: flag("--prompt <n>", "prompt tokens per row", parseIntArg("prompt", 1), 220),
  new: flag("--new <n>", "tokens drawn per row", parseIntArg("new", 1), 256),
  threads: flag("--threads <n>", "llama.cpp CPU threads", parseIntArg("threads", 1), 2),
  batch_size: flag("--batch_size <n>", "tokens per llama_decode", parseIntArg("batch_size", 1), 512),
  group: flag("--group <n>", "rows sharing a prompt in the prefix-sharing run", parseIntArg("group", 1), 8),
  lora_rank: flag("--lora_rank <n>", "rank of the random LoRA", parseIntArg("lora_rank", 1), 16),
  swaps: flag("--swaps <n>", "adapter swaps timed (RSS measured over them)", parseIntArg("swaps", 1), 20),
} satisfies FlagTable;

/** The GGUF's shape as a Qwen2Config (what moduleDims needs). */
async function ggufConfig(file: string): Promise<Qwen2Config> {
  const { readGgufFileInfo } = await importLlama();
  const m = (await readGgufFileInfo(file)).metadata as unknown as { qwen2?: Record<string, any> };
  const q = m.qwen2;
  if (!q) throw new UsageError(`${file}: not a qwen2 GGUF`);
  const heads = q.attention.head_count as number;
  return {
    ...BENCH_CONFIGS["0.5b"],
    hiddenSize: q.embedding_length,
    intermediateSize: q.feed_forward_length,
    numHiddenLayers: q.block_count,
    numAttentionHeads: heads,
    numKeyValueHeads: q.attention.head_count_kv,
    headDim: q.attention.key_length ?? q.embedding_length / heads,
  };
}

function randomTensor(shape: number[], rng: Rng, std: number): HostTensor {
  const data = new Float32Array(shape.reduce((a, b) => a * b, 1));
  for (let i = 0; i < data.length; i++) data[i] = std * (2 * rng.next() - 1) * 1.732; // uniform, that std
  return { shape, data };
}

async function writeRandomBase(file: string): Promise<void> {
  const c = BENCH_CONFIGS["0.5b"],
    rng = new Rng(1);
  const t0 = performance.now();
  const ones = (n: number): HostTensor => ({ shape: [n], data: new Float32Array(n).fill(1) });
  const sd: Record<string, HostTensor> = {
    "model.embed_tokens.weight": randomTensor([c.vocabSize, c.hiddenSize], rng, 0.02),
    "model.norm.weight": ones(c.hiddenSize),
  };
  for (let l = 0; l < c.numHiddenLayers; l++) {
    const p = `model.layers.${l}`;
    sd[`${p}.input_layernorm.weight`] = ones(c.hiddenSize);
    sd[`${p}.post_attention_layernorm.weight`] = ones(c.hiddenSize);
    for (const m of LORA_TARGETS) {
      const [inD, outD] = moduleDims(c, m);
      sd[`${p}.${moduleGroup(m)}.${m}.weight`] = randomTensor([outD, inD], rng, 0.02);
      if (["q_proj", "k_proj", "v_proj"].includes(m)) sd[`${p}.self_attn.${m}.bias`] = randomTensor([outD], rng, 0.02);
    }
  }
  await writeModelGguf({ file, config: c, tensors: sd, tokenizerDir: TINY_BASE_DIR, type: "q8_0", name: "qwen2.5-0.5b-random" });
  console.log(`wrote ${file} in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}

async function writeRandomLora(file: string, c: Qwen2Config, r: number, seed: number): Promise<void> {
  const rng = new Rng(seed),
    peft: Record<string, HostTensor> = {};
  for (let l = 0; l < c.numHiddenLayers; l++)
    for (const m of LORA_TARGETS) {
      const [inD, outD] = moduleDims(c, m);
      peft[peftKey(l, m, "A")] = randomTensor([r, inD], rng, 1 / Math.sqrt(inD));
      peft[peftKey(l, m, "B")] = randomTensor([outD, r], rng, 0.01);
    }
  await writeLoraGguf({ file, tensors: peft, alpha: 2 * r });
}

const rssMiB = () => process.memoryUsage().rss / 2 ** 20;
const fmt = (x: number, d = 1) => x.toFixed(d);

/** Prefill every row (drawing its first token), then decode until each row has `n` tokens. */
async function run(b: LlamaBatch, prompts: number[][], n: number): Promise<{ prefillS: number; decodeS: number }> {
  const sample = (row: number) => ({ temperature: 1, topP: 1, topK: 0, seed: 1000 + row });
  let t0 = performance.now();
  let draws = await b.step(prompts.map((tokens, row) => ({ row, tokens, sample: sample(row) })));
  const prefillS = (performance.now() - t0) / 1000;
  t0 = performance.now();
  for (let i = 1; i < n; i++) draws = await b.step(draws.map((d, row): StepInput => ({ row, tokens: [d!.token], sample: sample(row) })));
  const decodeS = (performance.now() - t0) / 1000;
  for (let r = 0; r < prompts.length; r++) await b.endRow(r);
  return { prefillS, decodeS };
}

await runMain(async () => {
  const { o } = parseFlags(commandOf("bench-llama-batch", "Benchmark the llama.cpp rollout decoder", FLAGS), FLAGS, process.argv);
  if (!o.gguf === !o.random_base) throw new UsageError("give one of --gguf <file> and --random_base <file>");
  const gguf = (o.gguf ?? o.random_base)!;
  if (o.random_base && !(await fs.stat(gguf).catch(() => null))) await writeRandomBase(gguf);
  const cfg = await ggufConfig(gguf);
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "bench-llama-batch-"));
  const lora = path.join(dir, "lora.gguf");
  await writeRandomLora(lora, cfg, o.lora_rank, 1);
  const rng = new Rng(7);
  const prompts = (rows: number) => Array.from({ length: rows }, () => Array.from({ length: o.prompt }, () => rng.int(0, 255)));
  const base = { modelPath: gguf, contextSize: o.prompt + o.new + 8, threads: o.threads, batchSize: o.batch_size };
  console.log(`${gguf}: ${cfg.numHiddenLayers} layers, hidden ${cfg.hiddenSize}; prompt ${o.prompt}, new ${o.new}, threads ${o.threads}`);

  for (const rows of o.batch.map(Number)) {
    for (const [logprobs, withLora] of [
      [false, false],
      [true, false],
      [true, true],
    ]) {
      const b = await LlamaBatch.open({ ...base, sequences: rows, logprobs, loraPath: withLora ? lora : null });
      const { prefillS, decodeS } = await run(b, prompts(rows), o.new);
      await b.close();
      console.log(
        `batch ${rows} | logprobs ${logprobs ? "on " : "off"} | lora ${withLora ? `r${o.lora_rank}` : "off"} | ` +
          `prefill ${fmt((rows * o.prompt) / prefillS)} tok/s (${fmt(prefillS, 2)} s) | decode ${fmt((rows * (o.new - 1)) / decodeS)} tok/s (${fmt(decodeS, 2)} s)`,
      );
    }
  }

  // Prompt sharing: rows/group prompts, each read by `group` rows.
  const rows = Number(o.batch[o.batch.length - 1]),
    G = Math.min(o.group, rows),
    P = Math.floor(rows / G);
  const b = await LlamaBatch.open({ ...base, sequences: P * G, logprobs: true });
  const shared = prompts(P);
  let t0 = performance.now();
  await b.step(shared.flatMap((tokens, p) => Array.from({ length: G }, (_, g) => ({ row: p * G + g, tokens }))));
  const everyRow = (performance.now() - t0) / 1000;
  for (let r = 0; r < P * G; r++) await b.endRow(r);
  t0 = performance.now();
  await b.step(shared.map((tokens, p) => ({ row: p * G, tokens })));
  for (let p = 0; p < P; p++)
    await b.fork(
      p * G,
      Array.from({ length: G - 1 }, (_, g) => p * G + g + 1),
    );
  const forked = (performance.now() - t0) / 1000;
  console.log(
    `prefix sharing | ${P} prompts × ${G} rows | prefill every row ${fmt(everyRow, 2)} s | prefill once + fork ${fmt(forked, 2)} s`,
  );

  // Adapter swaps: a rewritten file at one path, then a new path each time; RSS after one warm-up swap.
  const oneToken = async (seed: number) => {
    const t = performance.now();
    await b.step([{ row: 0, tokens: [1], sample: { temperature: 1, topP: 1, topK: 0, seed } }]);
    return (performance.now() - t) / 1000;
  };
  const plain = await oneToken(0);
  await b.setAdapter(lora);
  await oneToken(0);
  for (const mode of ["same path", "new paths"]) {
    const rss0 = rssMiB(),
      times: number[] = [],
      next: number[] = [];
    for (let i = 0; i < o.swaps; i++) {
      const file = mode === "same path" ? lora : path.join(dir, `lora-${i}.gguf`);
      await writeRandomLora(file, cfg, o.lora_rank, 2 + i);
      times.push(await b.setAdapter(file));
      next.push(await oneToken(i)); // pays the graph re-reserve
      if (mode === "new paths") await fs.rm(file);
    }
    const mean = (xs: number[]) => (1000 * xs.reduce((a, x) => a + x, 0)) / xs.length;
    console.log(
      `adapter swaps | ${mode} × ${o.swaps} | setAdapter ${fmt(mean(times))} ms | next 1-token step ${fmt(mean(next))} ms ` +
        `(${fmt(1000 * plain)} ms without a swap) | RSS ${fmt(rss0, 0)} → ${fmt(rssMiB(), 0)} MiB`,
    );
  }
  await b.close();
  await fs.rm(dir, { recursive: true, force: true });
});
