/** A batched multi-sequence decoder on llama.cpp (node-llama-cpp) for GRPO rollouts: one context with
 *  `sequences` KV slots ("rows"); each `step` reads some tokens into any subset of rows and draws the
 *  next token of those that ask, all rows' evaluations issued in the same tick so node-llama-cpp packs
 *  them into one llama_decode (its per-sequence generators decode one row per call: ~4× slower).
 *
 *  Sampling is node-llama-cpp's chain: top-k → top-p → temperature → draw. Note the order: top-p is
 *  taken on the temperature-1 probabilities (Hugging Face and rollout/sampler.ts temper first), so only
 *  T = 1 or top-p off gives this project's distribution. `logprob` is log `confidence`: the drawn
 *  token's probability under the distribution it was drawn from (greedy: the raw log-softmax of the
 *  argmax). Reading it sorts the kept candidates (the whole vocabulary when top-k is off): `logprobs:
 *  false` skips it. Each draw runs on a freshly seeded sampler (node-llama-cpp makes one per call), so
 *  the seed of a draw is mixed from the row's `seed` and the position drawn: give each rollout its own
 *  seed; the same seeds and inputs give the same tokens. The other rows of a batch move the logits by
 *  float rounding (~1e-6 with kvF32, ~3e-4 with F16 KV), so a draw on a boundary can depend on them.
 *
 *  Rows are KV slots, not rollouts: more rollouts than `sequences` reuse slots after `endRow`. A prompt
 *  shared by G samples can be prefilled once and copied (`fork`, or `saveRow` then `loadRow` into slots
 *  as they free up): llama.cpp's per-sequence state save/load through a temporary file, since
 *  node-llama-cpp exposes no llama_memory_seq_cp.
 *
 *  Leaves out: the turn loop, tool calls and stopping (turns.ts's job), tokenization, penalties,
 *  grammars, context shift (a row that would overflow `contextSize` throws). node-llama-cpp is imported
 *  lazily (llama-package.ts), so nothing else in the project needs it. Hot-swapping a LoRA uses internals of
 *  node-llama-cpp 3.21 (LlamaContext._setLoras, its addon's setLoras, the model's adapter cache). */
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { UsageError } from "../../util/errors.ts";
import { importLlama, type NodeLlamaCpp } from "./llama-package.ts";

type Llama = NodeLlamaCpp.Llama;
type LlamaContext = NodeLlamaCpp.LlamaContext;
type LlamaContextSequence = NodeLlamaCpp.LlamaContextSequence;
type LlamaModel = NodeLlamaCpp.LlamaModel;
type Token = NodeLlamaCpp.Token;

export interface LlamaBatchOptions {
  modelPath: string;
  /** LoRA GGUF applied from the start (scale 1). Default none. */
  loraPath?: string | null;
  /** KV slots decoded together, 1..256 (llama.cpp's LLAMA_MAX_SEQ). */
  sequences: number;
  /** Tokens each slot holds (prompt + everything read or drawn after it). */
  contextSize: number;
  /** CPU threads. Default: node-llama-cpp's (the machine's math cores). */
  threads?: number;
  /** Backend: false = CPU (default), "auto" = the best prebuilt one found. */
  gpu?: "auto" | "cuda" | "vulkan" | "metal" | false;
  /** Tokens per llama_decode over all rows. Default min(512, contextSize · sequences). */
  batchSize?: number;
  /** Exactness: F32 KV cache and flash attention off (default: F16 KV, flash attention where supported). */
  kvF32?: boolean;
  /** Return log-probs of drawn tokens (default true; false saves a vocabulary sort per draw: NaN then). */
  logprobs?: boolean;
}

export interface SampleParams {
  /** 0 = greedy. */
  temperature: number;
  /** 1 = off. */
  topP: number;
  /** 0 = off. */
  topK: number;
  /** The rollout's seed; the draw at position p uses mixSeed(seed, p). */
  seed: number;
}

export interface StepInput {
  row: number;
  /** Tokens to read: a prompt, forced tool-result tokens, or the last drawn token. At least one. */
  tokens: number[];
  /** Draw the token after `tokens`. */
  sample?: SampleParams;
}

export interface Draw {
  token: number;
  logprob: number;
}

// node-llama-cpp internals used by setAdapter (3.21.1): see the header.
interface LoraHandle {
  dispose(): Promise<void>;
}
interface ContextInternals {
  _setLoras(loras: { filePath: string; scale?: number }[]): Promise<void>;
  _ctx: { setLoras(loras: LoraHandle[], scales: number[]): void };
  _loraAdapters: Set<LoraHandle>;
}
interface ModelInternals {
  _loraAdapters: Map<string, LoraHandle>;
}

/** null removes a sampler from node-llama-cpp's chain, where undefined means its defaults (top-k 40,
 *  top-p 0.95) and topK 0 a top-k of the whole vocabulary (a sort). Its types do not admit null. */
const OFF = null as unknown as number;

export class LlamaBatch {
  private adapter: string | null = null;
  private inflight: Promise<unknown> = Promise.resolve(); // the last step: an adapter is not freed under it
  private saves = 0;
  private constructor(
    private readonly llama: Llama,
    private readonly model: LlamaModel,
    private readonly ctx: LlamaContext,
    private readonly seqs: LlamaContextSequence[],
    private readonly tmpDir: string,
    private readonly logprobs: boolean,
    /** What node-llama-cpp runs on: "cpu", "cuda", "vulkan" or "metal". */
    readonly gpu: string,
  ) {}

  static async open(o: LlamaBatchOptions): Promise<LlamaBatch> {
    if (!(Number.isInteger(o.sequences) && o.sequences >= 1 && o.sequences <= 256))
      throw new UsageError(`sequences ${o.sequences} is invalid; accepted: an integer in 1..256`);
    if (!(Number.isInteger(o.contextSize) && o.contextSize >= 2)) throw new UsageError(`contextSize ${o.contextSize} is invalid`);
    const { getLlama, LlamaLogLevel } = await importLlama();
    // progressLogs off: the note that a GPU build does not load here (the engine says it once)
    const llama = await getLlama({ gpu: o.gpu ?? false, build: "never", logLevel: LlamaLogLevel.warn, progressLogs: false });
    try {
      const model = await llama.loadModel({ modelPath: o.modelPath });
      const ctx = await model.createContext({
        sequences: o.sequences,
        contextSize: o.contextSize,
        batchSize: o.batchSize,
        threads: o.threads,
        failedCreationRemedy: false,
        ...(o.kvF32 ? { flashAttention: false, experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32" } : {}),
      });
      const seqs = Array.from({ length: o.sequences }, () => ctx.getSequence());
      const tmpDir = await fs.mkdtemp(path.join(os.tmpdir(), "llama-batch-"));
      const batch = new LlamaBatch(llama, model, ctx, seqs, tmpDir, o.logprobs ?? true, llama.gpu || "cpu");
      if (o.loraPath) await batch.setAdapter(o.loraPath);
      return batch;
    } catch (e) {
      await llama.dispose();
      throw e;
    }
  }

  get sequences(): number {
    return this.seqs.length;
  }

  /** Tokens held in a row's KV. */
  length(row: number): number {
    return this.seq(row).nextTokenIndex;
  }

  /** Replace the LoRA for what is read from now on (rows' KV already computed stays as it is); null =
   *  none. The previous adapter is freed and the file re-read, so a path rewritten in place gets its
   *  new weights and nothing accumulates. Returns seconds taken (the graph is re-reserved on the next
   *  step, which that step pays). */
  async setAdapter(loraPath: string | null): Promise<number> {
    const t0 = performance.now();
    await this.inflight;
    const ctx = this.ctx as unknown as ContextInternals;
    const cache = (this.model as unknown as ModelInternals)._loraAdapters;
    if (this.adapter !== null) {
      ctx._ctx.setLoras([], []); // detach before freeing
      const key = path.resolve(this.adapter);
      const old = cache.get(key);
      cache.delete(key); // node-llama-cpp caches adapters by path until the model is disposed
      if (old) {
        ctx._loraAdapters.delete(old);
        await old.dispose();
      }
      this.adapter = null;
    }
    if (loraPath !== null) {
      await ctx._setLoras([{ filePath: loraPath }]);
      this.adapter = loraPath;
    }
    return (performance.now() - t0) / 1000;
  }

  /** One tick: read each input's tokens into its row and, where `sample` is set, draw the next token.
   *  All rows are evaluated in one batch. Returns, per input, the draw or null. */
  async step(inputs: StepInput[]): Promise<(Draw | null)[]> {
    const seen = new Set<number>();
    for (const { row, tokens, sample: p } of inputs) {
      const seq = this.seq(row);
      if (seen.has(row)) throw new UsageError(`row ${row} appears twice in one step`);
      seen.add(row);
      if (tokens.length === 0) throw new UsageError(`row ${row}: no tokens to read`);
      if (seq.nextTokenIndex + tokens.length > seq.contextSize - 1)
        throw new UsageError(`row ${row}: ${seq.nextTokenIndex} + ${tokens.length} tokens exceed contextSize ${seq.contextSize} − 1`);
      if (p && !(p.temperature >= 0 && p.topP > 0 && p.topP <= 1 && Number.isInteger(p.topK) && p.topK >= 0))
        throw new UsageError(
          `row ${row}: sampling ${JSON.stringify(p)} is invalid; accepted: temperature >= 0, topP in (0, 1], topK integer >= 0`,
        );
    }
    const all = this.evaluate(inputs);
    this.inflight = all.catch(() => {});
    return all;
  }

  /** Two batches, each in ascending row order. llama.cpp keeps one KV stream per sequence here
   *  (node-llama-cpp leaves kv_unified off) and splits a batch into micro-batches of consecutive
   *  sequences with equal token counts; when that puts the outputs out of the batch's order it swaps
   *  them back lazily, inside the logits reads that node-llama-cpp's samplers make from several
   *  threads at once, and rows then draw from one another's logits (seen: greedy rollouts of 64 rows
   *  diverging after a tool result). So first every multi-token read but its last token, with no
   *  output; then one token per row, every output in the batch's order. Within each, no await
   *  between the calls: node-llama-cpp queues them all and dispatches one batch on the next cycle. */
  private async evaluate(inputs: StepInput[]): Promise<(Draw | null)[]> {
    const sorted = inputs.map((x, k) => ({ ...x, k })).sort((a, b) => a.row - b.row);
    const reads = sorted.filter((x) => x.tokens.length > 1);
    if (reads.length > 0) await Promise.all(reads.map((x) => this.seqs[x.row].controlledEvaluate(x.tokens.slice(0, -1) as Token[])));
    const out = new Array<Draw | null>(inputs.length).fill(null);
    await Promise.all(
      sorted.map(({ row, tokens, sample, k }) => {
        const seq = this.seqs[row];
        const t = tokens[tokens.length - 1];
        const input = sample
          ? [[t, { generateNext: { token: true, confidence: this.logprobs, options: this.options(sample, seq.nextTokenIndex) } }] as const]
          : [t];
        type Evaluated = Awaited<ReturnType<LlamaContextSequence["controlledEvaluate"]>>;
        return seq.controlledEvaluate(input as Parameters<LlamaContextSequence["controlledEvaluate"]>[0]).then((res: Evaluated) => {
          if (!sample) return;
          const next = res[0]?.next;
          if (next?.token == null) throw new Error(`row ${row}: llama.cpp drew no token`);
          out[k] = { token: next.token, logprob: this.logprobs ? Math.log(next.confidence!) : NaN };
        });
      }),
    );
    return out;
  }

  /** Save a row's KV and tokens (a prefilled prompt) to a temporary file for loadRow; returns its
   *  path. dropSaved deletes it (close deletes all). */
  async saveRow(row: number): Promise<string> {
    const file = path.join(this.tmpDir, `state-${this.saves++}.bin`);
    await this.seq(row).saveStateToFile(file);
    return file;
  }

  /** Replace a row's KV and tokens with a saved row's. */
  async loadRow(row: number, saved: string): Promise<void> {
    await this.seq(row).loadStateFromFile(saved, { acceptRisk: true }); // the risk is a file from another model
  }

  async dropSaved(saved: string): Promise<void> {
    await fs.rm(saved, { force: true });
  }

  /** Copy row `src`'s KV and tokens into each of `dsts` (prefill a shared prompt once). */
  async fork(src: number, dsts: number[]): Promise<void> {
    const saved = await this.saveRow(src);
    for (const d of dsts) await this.loadRow(d, saved);
    await this.dropSaved(saved);
  }

  /** Clear a row's KV so the slot can take a new rollout. */
  async endRow(row: number): Promise<void> {
    await this.seq(row).clearHistory();
  }

  async close(): Promise<void> {
    await this.inflight;
    await this.ctx.dispose();
    await this.model.dispose(); // frees cached adapters too
    await this.llama.dispose();
    await fs.rm(this.tmpDir, { recursive: true, force: true });
  }

  private seq(row: number): LlamaContextSequence {
    const s = this.seqs[row];
    if (!Number.isInteger(row) || !s) throw new UsageError(`row ${row} is out of range 0..${this.seqs.length - 1}`);
    return s;
  }

  private options(s: SampleParams, position: number) {
    return {
      temperature: s.temperature,
      topK: s.topK > 0 ? s.topK : OFF,
      topP: s.topP < 1 ? s.topP : OFF,
      seed: mixSeed(s.seed, position),
    };
  }
}

/** A 32-bit seed for the draw at `position` of a rollout seeded `seed` (murmur3's finaliser). */
export function mixSeed(seed: number, position: number): number {
  let h = (Math.imul(seed >>> 0, 0x9e3779b1) ^ (position >>> 0)) >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}
