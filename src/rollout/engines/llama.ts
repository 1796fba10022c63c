/** --rollout_engine llama: rollouts from llama.cpp in this process (node-llama-cpp's prebuilt CPU,
 *  CUDA, Vulkan or Metal builds), the trainer's tfjs model kept for gradients only.
 *
 *  The base goes to GGUF once: the weights the trainer holds (an NF4/int8 base dequantized), as
 *  --engine_weights (f16 by default), with the real tokenizer, cached by content in
 *  ~/.cache/mini-agentic-rl/gguf (a second run reuses it). The adapter goes to a GGUF LoRA before every
 *  step's rollouts (and before any other generation) and is hot-swapped into the live context
 *  (adapter_swap_time). Rows are decoded by turns.ts's loop over LlamaTurns, a continuous batcher:
 *  every row asking for a token is decoded in the same llama_decode, a row's KV cache is kept across
 *  its turns (only the tool's answer is read after a tool call, no prefill again), and a row that
 *  waits for its tool leaves the batch meanwhile. Each rollout draws from its own seeded sampler.
 *
 *  The engine's log-probs (behaviourLogprobs) are those of the sampled tokens under the distribution
 *  they were drawn from, so they are the trainer's raw policy only with temperature 1 and top-p/top-k
 *  off: then they are read (a vocabulary sort per draw) and the update logs their gap and corrects
 *  with truncated importance sampling; otherwise they are not read, as with the local engine.
 *  A group's prompt is computed once and its KV copied into each sample's row (through a state file:
 *  node-llama-cpp has no llama_memory_seq_cp). Leaves out: speculative decoding, per-token streaming
 *  to chat. */
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { cachedModelGguf, writeLoraGguf } from "../../model/gguf.ts";
import { paramCount } from "../../model/load.ts";
import { hasWeightsOnHost, type ChatMessage, type Qwen2Config, type WeightsOnHost } from "../../model/types.ts";
import { resolveThreads } from "../../kernels/wasm/threads.ts";
import { UsageError } from "../../util/errors.ts";
import { flag, parseChoice, type OptionsOf } from "../../util/flag.ts";
import { encodePrompts } from "../rollout.ts";
import { turnRollouts, type TurnCompleter, type TurnCompletion, type TurnSampling } from "../turns.ts";
import type { RolloutConfig, Trajectory } from "../types.ts";
import { LlamaBatch } from "./llama-batch.ts";
import { importLlama } from "./llama-package.ts";
import { defineRolloutEngine, EngineError, type EngineContext, type RolloutEngine, type RunFlags, type StepRequest } from "./types.ts";

export const ENGINE_WEIGHTS = ["f32", "f16", "q8_0"] as const;
export const ENGINE_GPUS = ["auto", "cuda", "vulkan", "metal", "off"] as const;

const FLAGS = {
  engine_weights: flag(
    "--engine_weights <type>",
    `with --rollout_engine llama: the GGUF weight type of the engine's copy of the (dequantized) base: ` +
      `${ENGINE_WEIGHTS.join(", ")} (f32 samples the trainer's very policy; f16 and q8_0 are faster and ` +
      `differ slightly, which engine_logprob_gap shows and --tis_cap corrects)`,
    parseChoice("engine_weights", ENGINE_WEIGHTS),
    "f16" as (typeof ENGINE_WEIGHTS)[number],
    { free: true },
  ),
  engine_gpu: flag(
    "--engine_gpu <kind>",
    `with --rollout_engine llama: ${ENGINE_GPUS.join(", ")} (auto: what node-llama-cpp finds, printed once)`,
    parseChoice("engine_gpu", ENGINE_GPUS),
    "auto" as (typeof ENGINE_GPUS)[number],
    { free: true },
  ),
};
type LlamaFlags = RunFlags & OptionsOf<typeof FLAGS>;

export const llamaEngine = defineRolloutEngine({
  name: "llama",
  help:
    "llama (llama.cpp in this process through node-llama-cpp: the base as GGUF, once per checkpoint, the " +
    "adapter hot-swapped as a GGUF LoRA; CPU, CUDA, Vulkan or Metal)",
  flags: FLAGS,
  async prepare(f, log) {
    // The binaries are loaded now, so a platform without them is a usage error before anything is written.
    const gpu = await loadLlama(f.engine_gpu);
    // node-llama-cpp's own note on a GPU build that does not load is silenced (it came once per
    // load, twice a run); this line says it once.
    const fellBack =
      f.engine_gpu === "auto" && gpu === "cpu" ? " (--engine_gpu auto: no CUDA, Vulkan or Metal build of llama.cpp loads here)" : "";
    log(`rollout engine: llama.cpp (node-llama-cpp) on ${gpu}${fellBack}, ${f.engine_weights} weights`);
    return (ctx) => LlamaEngine.open(ctx, f, gpu);
  },
});

/** node-llama-cpp loaded once, to learn what it runs on; one line naming what is missing otherwise. */
async function loadLlama(gpu: LlamaFlags["engine_gpu"]): Promise<string> {
  const mod = await importLlama();
  try {
    const llama = await mod.getLlama({ gpu: llamaGpu(gpu), build: "never", logLevel: mod.LlamaLogLevel.error, progressLogs: false });
    const name = llama.gpu || "cpu";
    await llama.dispose();
    return name;
  } catch (err) {
    throw new UsageError(
      `--rollout_engine llama --engine_gpu ${gpu}: node-llama-cpp has no prebuilt binary that loads here ` +
        `(${(err as Error).message.split("\n")[0]}); try --engine_gpu off`,
    );
  }
}

const llamaGpu = (g: LlamaFlags["engine_gpu"]) => (g === "off" ? false : g);

/** llama.cpp's threads meet at a barrier after every op and spin there: for a model whose ops take
 *  microseconds (under 100 M parameters, e.g. the tiny preset) one thread decodes as fast as two and
 *  cannot stall on a core this process's JavaScript needs (on 2 cores a tiny GRPO step's rollouts took
 *  4× longer with two). Larger models use the --threads count. */
export function llamaThreads(c: Qwen2Config, threads: RunFlags["threads"]): number {
  return paramCount(c) < 100e6 ? 1 : resolveThreads(threads ?? "auto");
}

/** Sampling that leaves the model's distribution as it is: the drawn tokens' log-probs are then the
 *  policy's the trainer computes. */
export const rawDistribution = (s: { temperature: number; topP: number; topK: number }) =>
  s.temperature === 1 && s.topP >= 1 && s.topK === 0;

export function ggufCacheDir(): string {
  return path.join(process.env.XDG_CACHE_HOME ?? path.join(os.homedir(), ".cache"), "mini-agentic-rl", "gguf");
}

class LlamaEngine implements RolloutEngine {
  readonly name = "llama";
  readonly offPolicy = false;
  readonly behaviourLogprobs: boolean;
  private batch: LlamaBatch | null = null;
  private contextSize = 0; // the open batch's, per slot
  private logprobs = false; // whether the open batch reads the drawn tokens' log-probs
  private readonly adapterFile: string;

  private constructor(
    private readonly ctx: EngineContext,
    private readonly model: WeightsOnHost,
    private readonly f: LlamaFlags,
    private readonly gpu: string,
    private readonly modelFile: string,
  ) {
    // Read only where the update uses them: reading sorts the vocabulary for every draw (0.5B, batch
    // 32: decode 24% slower), so --tis_cap 0 skips them (and engine_logprob_gap with them).
    this.behaviourLogprobs = rawDistribution(ctx.sampling) && (f.tis_cap ?? 2) > 0;
    this.adapterFile = path.join(ctx.workDir, "engine-adapter.gguf");
  }

  static async open(ctx: EngineContext, f: LlamaFlags, gpu: string): Promise<LlamaEngine> {
    const model = ctx.model;
    if (!hasWeightsOnHost(model)) throw new UsageError("--rollout_engine llama: this model cannot hand its weights to llama.cpp");
    const t0 = performance.now();
    const cacheDir = ggufCacheDir();
    await fs.mkdir(cacheDir, { recursive: true });
    const { file, cached, replaced, removedTemps } = await cachedModelGguf(model, ctx.modelDir, {
      type: f.engine_weights,
      cacheDir,
    });
    if (removedTemps > 0) ctx.log(`llama engine: removed ${removedTemps} unfinished GGUF file(s) of killed runs from ${cacheDir}`);
    if (replaced) ctx.log(`llama engine: the cached base ${file} was damaged (${replaced}); removed, and written again`);
    ctx.log(`llama engine: base ${cached ? "reused" : "written"} as ${file} (${((performance.now() - t0) / 1000).toFixed(1)} s)`);
    return new LlamaEngine(ctx, model, f, gpu, file);
  }

  async rollouts(req: StepRequest) {
    const s = this.ctx.sampling;
    const swap = await this.publish();
    const c = { ...s, tools: this.ctx.tools, envs: req.envs, seed: req.seedOf(req.step) };
    const trajs = await this.turns(req.prompts(req.step), c, this.behaviourLogprobs);
    return { trajs, metrics: { adapter_swap_time: swap } };
  }

  async generate(prompts: ChatMessage[][], cfg: RolloutConfig): Promise<Trajectory[]> {
    await this.publish();
    return this.turns(prompts, { ...cfg, seed: Math.floor(cfg.rng.next() * 2 ** 31) }, false);
  }

  /** The trainer's adapter as it is now, written as a GGUF LoRA (same file each time) and swapped in.
   *  Returns the seconds it took. */
  private async publish(): Promise<number> {
    const t0 = performance.now();
    const ad = this.model.loraAdapter;
    if (!ad) return 0;
    await writeLoraGguf({ file: this.adapterFile, tensors: await ad.toPeft(), alpha: ad.config.alpha });
    const batch = this.batch;
    if (batch) await died("the adapter swap", () => batch.setAdapter(this.adapterFile));
    return (performance.now() - t0) / 1000;
  }

  /** Rollouts on the batch (opened, or reopened larger, as the call needs); `logprobs`: read the
   *  drawn tokens' log-probs. */
  private async turns(
    prompts: ChatMessage[][],
    c: Omit<RolloutConfig, "rng"> & { seed: number },
    logprobs: boolean,
  ): Promise<Trajectory[]> {
    const maxPositions = this.ctx.model.config.maxPositionEmbeddings;
    const rows = prompts.length * c.samplesPerPrompt;
    // KV for the longest prompt and the budget (at least 1024 a slot, so later steps rarely need more;
    // a call that needs more rows or room reopens the batch).
    const longest = Math.max(...encodePrompts(this.ctx.tokenizer, prompts, c).map((p) => p.length));
    const room = Math.min(maxPositions, Math.max(1024, Math.ceil((longest + c.maxNewTokens + 1) / 256) * 256));
    if (this.batch && (this.batch.sequences < Math.min(256, rows) || this.contextSize < room || this.logprobs !== logprobs)) {
      await this.batch.close();
      this.batch = null;
    }
    if (!this.batch) {
      const sequences = Math.min(256, rows); // more rows than that wait for a slot (LlamaTurns)
      this.batch = await died("opening a context", () =>
        LlamaBatch.open({
          modelPath: this.modelFile,
          loraPath: this.model.loraAdapter ? this.adapterFile : null,
          sequences,
          contextSize: room,
          gpu: llamaGpu(this.f.engine_gpu),
          threads: llamaThreads(this.ctx.model.config, this.f.threads),
          kvF32: this.f.engine_weights === "f32", // f32 weights: the trainer's policy as exactly as llama.cpp computes it
          logprobs,
        }),
      );
      this.contextSize = room;
      this.logprobs = logprobs;
    }
    const turns = new LlamaTurns(this.batch);
    try {
      return await turnRollouts(turns, this.ctx.tokenizer, prompts, { ...c, maxPositions });
    } finally {
      await turns.dispose();
    }
  }

  async close(): Promise<void> {
    await this.batch?.close();
    this.batch = null;
    await fs.rm(this.adapterFile, { force: true });
  }
}

/** llama.cpp failing under a run (a decode, a context that does not open, an adapter swap): an
 *  EngineError, so GRPO saves its checkpoint and says to continue with --resume. */
const diedOf = (what: string, err: unknown): EngineError =>
  err instanceof EngineError
    ? err
    : new EngineError(`llama engine: ${what} failed: ${String((err as Error)?.message ?? err).split("\n")[0]}`, "died");

async function died<T>(what: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw diedOf(what, err);
  }
}

/** turns.ts's completer on a LlamaBatch: continuous batching over KV slots. A row takes a slot at its
 *  first turn and keeps it (and its KV) until it is released; rows beyond the slots wait for one. */
export class LlamaTurns implements TurnCompleter {
  private readonly slotOf = new Map<number, number>();
  private readonly held: number[][]; // per slot: the tokens its KV holds
  private readonly free: number[];
  private readonly waiting: (() => void)[] = [];
  private readonly active = new Map<number, Turn>(); // slot → its row's turn in progress
  private readonly prompts = new Map<string, Promise<string>>(); // a prompt → its KV saved once prefilled
  private pumping = false;

  constructor(private readonly batch: LlamaBatch) {
    this.held = Array.from({ length: batch.sequences }, () => []);
    this.free = Array.from({ length: batch.sequences }, (_, i) => i);
  }

  async complete(row: number, ids: number[], p: TurnSampling): Promise<TurnCompletion> {
    let slot = this.slotOf.get(row);
    if (slot === undefined) {
      while (this.free.length === 0) await new Promise<void>((resolve) => this.waiting.push(resolve));
      slot = this.free.shift()!;
      this.slotOf.set(row, slot);
    }
    const held = this.held[slot];
    // The KV holds a prefix of ids (the row's earlier turns): read only what came since.
    if (ids.length <= held.length || held.some((t, i) => ids[i] !== t)) {
      await this.batch.endRow(slot);
      held.length = 0;
    }
    // A first turn: the prompt (but its last token, which each row reads to draw from) is computed
    // once for all the rows that share it and copied into theirs (a group's G samples).
    if (held.length === 0 && ids.length > 1) {
      const prefix = ids.slice(0, -1);
      const key = prefix.join(",");
      const saved = this.prompts.get(key);
      if (saved) {
        await this.batch.loadRow(slot, await saved);
        held.push(...prefix);
      } else {
        const state = this.run(slot, new Turn(prefix, p, false)).then(() => this.batch.saveRow(slot)); // the pump records what it read
        this.prompts.set(key, state);
        await state;
      }
    }
    return this.run(slot, new Turn(ids.slice(held.length), p));
  }

  /** The saved prompt states go (the KV slots stay with the batch). */
  async dispose(): Promise<void> {
    const states = await Promise.allSettled(this.prompts.values());
    for (const s of states) if (s.status === "fulfilled") await this.batch.dropSaved(s.value);
    this.prompts.clear();
  }

  private run(slot: number, turn: Turn): Promise<TurnCompletion> {
    this.active.set(slot, turn);
    if (!this.pumping) void this.pump();
    return turn.done;
  }

  release(row: number): void {
    const slot = this.slotOf.get(row);
    if (slot === undefined) return;
    this.slotOf.delete(row);
    void this.batch.endRow(slot).then(() => {
      this.held[slot].length = 0;
      this.free.push(slot);
      this.waiting.shift()?.();
    });
  }

  /** One llama_decode per tick for every row that has a turn in progress, until none has. */
  private async pump(): Promise<void> {
    this.pumping = true;
    try {
      while (this.active.size > 0) {
        const slots = [...this.active.keys()];
        const turns = slots.map((s) => this.active.get(s)!);
        let draws;
        try {
          draws = await this.batch.step(slots.map((s, i) => ({ row: s, tokens: turns[i].feed, sample: turns[i].sample() })));
        } catch (err) {
          for (const [s, t] of slots.map((s, i) => [s, turns[i]] as const)) {
            this.active.delete(s);
            t.fail(diedOf("a decode", err));
          }
          continue;
        }
        slots.forEach((s, i) => {
          const t = turns[i];
          this.held[s].push(...t.feed);
          if (t.take(draws[i])) this.active.delete(s);
        });
      }
    } finally {
      this.pumping = false;
    }
  }
}

/** One row's turn: the tokens to read next and what it drew so far. */
class Turn {
  readonly ids: number[] = [];
  readonly logprobs: number[] = [];
  feed: number[];
  readonly done: Promise<TurnCompletion>;
  private resolve!: (c: TurnCompletion) => void;
  fail!: (err: unknown) => void;
  private readonly stops: Set<number>;

  constructor(
    feed: number[],
    private readonly p: TurnSampling,
    private readonly draws = true, // false: read `feed` only (a shared prompt's prefill)
  ) {
    this.feed = feed;
    this.stops = new Set(p.stopTokenIds);
    this.done = new Promise((resolve, reject) => ((this.resolve = resolve), (this.fail = reject)));
  }

  sample() {
    return this.draws ? { temperature: this.p.temperature, topP: this.p.topP, topK: this.p.topK, seed: this.p.seed } : undefined;
  }

  /** The step's draw (null when it read only); true when the turn is over (a stop token, the budget,
   *  an abort, or the read done). */
  take(draw: { token: number; logprob: number } | null): boolean {
    if (!draw) {
      this.resolve({ ids: [], logprobs: [], finishReason: "length" });
      return true;
    }
    const { token, logprob } = draw;
    this.ids.push(token);
    this.logprobs.push(logprob);
    this.feed = [token];
    const stop = this.stops.has(token);
    if (!stop && this.ids.length < this.p.maxTokens && !this.p.signal?.aborted) return false;
    this.resolve({ ids: this.ids, logprobs: this.logprobs, finishReason: stop ? "stop" : "length" });
    return true;
  }
}
