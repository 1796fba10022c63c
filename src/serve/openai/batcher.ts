/** The batcher behind the OpenAI-compatible server: a FIFO of requests, each one or more rows
 *  (prompt × n), decoded as shared batches over one KV cache. When the batcher is idle it waits
 *  `batchWaitMs` for more arrivals, then takes every queued request of the same adapter (up to
 *  `maxBatchRows` rows, in arrival order) into one batch, waiting again while a burst keeps arriving;
 *  requests that arrive meanwhile form the next.
 *  Every row has its own sampling settings, stop conditions and seeded Rng (one per request, drawn in
 *  row order), so what a request gets does not depend on what it was batched with.
 *  LoRA adapters are held by name and swapped into the model per batch (vLLM's runtime LoRA
 *  updating); one unloaded while a batch uses it is freed when that batch ends.
 *  The decoding itself (left-padded prefill, one token per row per step, finished rows leaving the
 *  cache) is rollout/decode-batch.ts, the loop local rollouts run; what stays here is the server's
 *  own: the queue, adapters, and each row's sampling settings, log-probs and stop conditions.
 *  A request with a grammar has its rows masked to the tokens the grammar allows (token-mask.ts)
 *  before they are drawn, and each row ends once its value is complete.
 *  Leaves out: continuous batching (joining a running batch), prefix caching, penalties. */
import { LoraAdapter } from "../../model/lora.ts";
import type { Qwen2ForCausalLM } from "../../model/qwen2.ts";
import type { Tokenizer } from "../../model/types.ts";
import { DecodeBatch, type DecodeRows } from "../../rollout/decode-batch.ts";
import { CompiledBatch } from "../../kernels/webgpu/decode/batch.ts";
import { Decoder, decoderUnsupported } from "../../kernels/webgpu/decode/decoder.ts";
import { sampleRow, Scratch, topIndices, uniformFor } from "../../rollout/sample-row.ts";
import { Rng } from "../../util/rng.ts";
import { ApiError } from "./errors.ts";
import { initialState, type Node, type State } from "./json-grammar.ts";
import { takeToken, tokenMask, vocabOf, type Vocab } from "./token-mask.ts";

export interface GenParams {
  temperature: number; // 0 = greedy
  topP: number;
  topK: number; // 0 = off
  maxTokens: number;
  stop: string[]; // stop strings: the text ends before the first one
  stopTokenIds: number[]; // beside the tokenizer's eos and <|endoftext|>
  seed?: number;
  topLogprobs: number; // alternatives reported per token (0: none)
}

export interface GenToken {
  id: number;
  logprob: number; // log_softmax(logits)[id] at temperature 1, as vLLM reports by default
  top: { id: number; logprob: number }[];
}

export interface GenChoice {
  promptIndex: number;
  tokens: GenToken[]; // what was generated, a closing stop token included
  text: string; // decoded without special tokens, cut before a stop string
  finishReason: "stop" | "length";
}

export interface GenRequest {
  adapter: string | null; // a loaded adapter's name; null: the model as started
  prompts: number[][];
  n: number;
  params: GenParams;
  /** What every row must write (response_format, a forced tool call): a token mask each step. */
  grammar?: Node;
  /** Each token as it is taken (streaming): choice index = promptIndex·n + sample. */
  onToken?: (choice: number, token: GenToken) => void;
  signal?: AbortSignal;
}

export interface BatcherOptions {
  maxQueue: number; // requests that may wait; more get 429
  maxBatchRows: number;
  batchWaitMs: number;
}

interface Pending {
  req: GenRequest;
  resolve: (c: GenChoice[]) => void;
  reject: (e: Error) => void;
}

interface Row {
  p: Pending;
  choice: number;
  prompt: number[];
  rng: Rng;
  tokens: GenToken[];
  text: string;
  done: boolean;
  finish: "stop" | "length";
  grammar?: State; // the recognizer after what the row wrote; absent: unconstrained
}

interface Held {
  adapter: LoraAdapter;
  path: string;
  users: number;
  unloaded: boolean;
}

export class Batcher {
  private readonly queue: Pending[] = [];
  private readonly adapters = new Map<string, Held>();
  private busy = false;
  private readonly startAdapter: LoraAdapter | null;
  readonly stopIds: Set<number>; // tokens that end a row: eos (<|im_end|>) and <|endoftext|>
  /** Batches run and rows decoded so far (tests and /health read them). */
  readonly stats = { batches: 0, rows: 0, maxRowsInBatch: 0 };
  /** The compiled decoder (kernels/webgpu/decode/) on webgpu; null: tfjs' forward (DecodeBatch). */
  readonly decoder: Decoder | null;

  constructor(
    readonly model: Qwen2ForCausalLM,
    readonly tokenizer: Tokenizer,
    readonly o: BatcherOptions,
  ) {
    this.startAdapter = model.loraAdapter;
    this.stopIds = new Set([tokenizer.eosTokenId, tokenizer.tokenToId("<|endoftext|>") ?? tokenizer.padTokenId]);
    // On webgpu the compiled decoder runs the batches, reading the base as it is held; elsewhere the
    // server never trains: a quantized base is unpacked once, for good (adapter factors are held per batch).
    this.decoder = decoderUnsupported(model) === null ? new Decoder(model) : null;
    if (this.decoder) return;
    model.swapAdapter(null);
    model.unpackBase();
    model.swapAdapter(this.startAdapter);
  }

  get contextLength(): number {
    return this.model.config.maxPositionEmbeddings;
  }

  get waiting(): number {
    return this.queue.length;
  }

  adapterNames(): { name: string; path: string }[] {
    return [...this.adapters].filter(([, h]) => !h.unloaded).map(([name, h]) => ({ name, path: h.path }));
  }

  hasAdapter(name: string): boolean {
    return this.adapters.has(name) && !this.adapters.get(name)!.unloaded;
  }

  async loadAdapter(name: string, dir: string): Promise<void> {
    if (this.hasAdapter(name))
      throw new ApiError(400, `the LoRA adapter "${name}" has already been loaded; unload it first or use another lora_name`, "lora_name");
    let adapter: LoraAdapter;
    try {
      adapter = await LoraAdapter.load(dir, this.model.config);
    } catch (err) {
      throw new ApiError(400, `lora_path ${dir}: ${(err as Error).message.split("\n")[0]}`, "lora_path");
    }
    if (this.hasAdapter(name)) {
      adapter.dispose(); // loaded twice at once: the first one wins
      throw new ApiError(400, `the LoRA adapter "${name}" has already been loaded`, "lora_name");
    }
    this.adapters.set(name, { adapter, path: dir, users: 0, unloaded: false });
  }

  unloadAdapter(name: string): void {
    const h = this.adapters.get(name);
    if (!h || h.unloaded) throw new ApiError(404, `the LoRA adapter "${name}" cannot be found`, "lora_name", "model_not_found");
    h.unloaded = true;
    if (h.users === 0) this.free(name, h);
  }

  private free(name: string, h: Held): void {
    h.adapter.dispose();
    if (this.adapters.get(name) === h) this.adapters.delete(name);
  }

  /** Free the model and every adapter; requests still queued are refused. */
  dispose(): void {
    for (const p of this.queue.splice(0)) p.reject(new ApiError(503, "the server is shutting down"));
    for (const [name, h] of this.adapters) this.free(name, h);
    this.decoder?.dispose();
    this.model.dispose(); // with the adapter it was started with
  }

  /** A 429 if the queue is full (a stream asks before it answers 200). */
  checkRoom(): void {
    if (this.queue.length >= this.o.maxQueue)
      throw new ApiError(
        429,
        `${this.queue.length} requests are waiting (--max_queue ${this.o.maxQueue}); retry later`,
        null,
        "rate_limit_exceeded",
        "rate_limit_error",
      );
  }

  /** Queue a request; resolves with its choices (prompt-major, n per prompt). */
  generate(req: GenRequest): Promise<GenChoice[]> {
    this.checkRoom();
    return new Promise((resolve, reject) => {
      this.queue.push({ req, resolve, reject });
      if (!this.busy) void this.pump();
    });
  }

  private async pump(): Promise<void> {
    this.busy = true;
    try {
      while (this.queue.length > 0) {
        await this.gather();
        const batch = this.take();
        await this.run(batch);
      }
    } finally {
      this.busy = false;
    }
  }

  /** Let requests sent together arrive: wait batchWaitMs, and again while more keep arriving and the
   *  batch is not full (a burst of concurrent requests reaches the server over a few ms), at most 8 times. */
  private async gather(): Promise<void> {
    const rows = () => this.queue.reduce((a, p) => a + p.req.prompts.length * p.req.n, 0);
    for (let k = 0, seen = -1; k < 8 && this.queue.length !== seen && rows() < this.o.maxBatchRows; k++) {
      seen = this.queue.length;
      await new Promise((r) => setTimeout(r, this.o.batchWaitMs));
    }
  }

  /** The next batch: the oldest request's adapter, and every queued request of it that fits. */
  private take(): Pending[] {
    const key = this.queue[0].req.adapter;
    const out: Pending[] = [];
    let rows = 0;
    for (let i = 0; i < this.queue.length;) {
      const p = this.queue[i];
      const n = p.req.prompts.length * p.req.n;
      if (p.req.adapter === key && (out.length === 0 || rows + n <= this.o.maxBatchRows)) {
        out.push(p);
        rows += n;
        this.queue.splice(i, 1);
      } else i++;
    }
    return out;
  }

  private async run(batch: Pending[]): Promise<void> {
    const name = batch[0].req.adapter;
    const held = name === null ? null : this.adapters.get(name);
    if (name !== null && (!held || held.unloaded)) {
      for (const p of batch)
        p.reject(new ApiError(404, `the model "${name}" does not exist (its adapter was unloaded)`, "model", "model_not_found"));
      return;
    }
    if (held) held.users++;
    const rows: Row[] = [];
    for (const p of batch) {
      const rng = new Rng(p.req.params.seed ?? Math.floor(Math.random() * 2 ** 32));
      p.req.prompts.forEach((prompt, i) => {
        for (let k = 0; k < p.req.n; k++)
          rows.push({
            p,
            choice: i * p.req.n + k,
            prompt,
            rng,
            tokens: [],
            text: "",
            done: false,
            finish: "length",
            ...(p.req.grammar ? { grammar: initialState(p.req.grammar) } : {}),
          });
      });
    }
    this.stats.batches++;
    this.stats.rows += rows.length;
    this.stats.maxRowsInBatch = Math.max(this.stats.maxRowsInBatch, rows.length);
    this.model.swapAdapter(held ? held.adapter : this.startAdapter);
    const release = this.decoder ? () => {} : this.model.unpackBase(); // holds this adapter's fused factors for the batch
    try {
      await this.decode(rows);
      for (const p of batch) {
        const mine = rows.filter((r) => r.p === p).sort((a, b) => a.choice - b.choice);
        p.resolve(
          mine.map((r) => ({ promptIndex: Math.floor(r.choice / p.req.n), tokens: r.tokens, text: r.text, finishReason: r.finish })),
        );
      }
    } catch (err) {
      for (const p of batch) p.reject(err as Error);
    } finally {
      release();
      this.model.swapAdapter(this.startAdapter);
      if (held) {
        held.users--;
        if (held.unloaded && held.users === 0) this.free(name!, held);
      }
    }
  }

  /** One decode batch: left-padded prefill, then one token per live row per step. */
  private async decode(rows: Row[]): Promise<void> {
    const V = this.model.config.vocabSize;
    const pad = this.tokenizer.padTokenId;
    const scratch = new Scratch(V);
    const masked = { vocab: null as Vocab | null, allowed: new Uint8Array(V), logits: new Float32Array(V) };
    const prompts = rows.map((r) => r.prompt);
    const budget = Math.max(...rows.map((r) => r.p.req.params.maxTokens));
    const batch: DecodeRows = this.decoder
      ? new CompiledBatch(this.decoder, prompts, { maxNewTokens: Math.min(budget, this.contextLength) })
      : new DecodeBatch(this.model, prompts, { pad });
    try {
      for (;;) {
        const data = await batch.read(); // [cache rows × V]
        const feed: number[] = [];
        batch.rows.forEach((r, pos) => {
          const row = rows[r];
          if (!row.done && row.p.req.signal?.aborted) row.done = true;
          if (row.done) return void feed.push(pad);
          let logits = data.subarray(pos * V, (pos + 1) * V);
          if (row.grammar !== undefined) {
            masked.vocab ??= vocabOf(this.tokenizer, V);
            const allowed = tokenMask(row.grammar, masked.vocab, [...this.stopIds, ...row.p.req.params.stopTokenIds], masked.allowed);
            // Every path of the grammar can be completed, so this is a bug, not the model: end the row.
            if (allowed.indexOf(1) === -1) return void (feed.push(pad), Object.assign(row, { done: true, text: this.text(row) }));
            for (let j = 0; j < V; j++) masked.logits[j] = allowed[j] ? logits[j] : -Infinity;
            logits = masked.logits;
          }
          const tok = this.sample(row, logits, scratch);
          feed.push(tok.id);
          this.take1(row, tok);
        });
        if (rows.every((r) => r.done)) break;
        batch.step(feed, (r) => rows[r].done);
      }
    } finally {
      batch.dispose();
    }
  }

  private sample(row: Row, logits: Float32Array, scratch: Scratch): GenToken {
    const prm = row.p.req.params;
    const params = { temperature: prm.temperature, topP: prm.topP, topK: prm.topK };
    const draw = sampleRow(logits, params, uniformFor(params, row.rng), scratch);
    const { max, logZ } = logSoftmaxStats(logits);
    const lp = (j: number) => logits[j] - max - logZ;
    const top =
      prm.topLogprobs > 0
        ? topIndices(logits, prm.topLogprobs)
            .filter((j) => logits[j] > -Infinity) // masked out by a grammar
            .map((j) => ({ id: j, logprob: lp(j) }))
        : [];
    return { id: draw.token, logprob: lp(draw.token), top };
  }

  /** Append a sampled token to its row and decide whether the row is finished. */
  private take1(row: Row, tok: GenToken): void {
    const prm = row.p.req.params;
    row.tokens.push(tok);
    row.p.req.onToken?.(row.choice, tok);
    const isStop = this.stopIds.has(tok.id) || prm.stopTokenIds.includes(tok.id);
    if (row.grammar !== undefined && !isStop) {
      row.grammar = takeToken(row.grammar, vocabOf(this.tokenizer, this.model.config.vocabSize), tok.id);
      if (row.grammar === null) return void Object.assign(row, { done: true, finish: "stop", text: this.text(row) }); // the value is whole
    }
    if (prm.stop.length > 0 && !isStop) {
      // Stop strings: the text so far is searched after every token (and cut before the first one).
      const text = this.text(row);
      const cut = firstStop(text, prm.stop);
      if (cut !== -1) return void Object.assign(row, { done: true, finish: "stop", text: text.slice(0, cut) });
    }
    if (isStop) return void Object.assign(row, { done: true, finish: "stop", text: this.text(row) });
    if (row.tokens.length >= prm.maxTokens || row.prompt.length + row.tokens.length >= this.contextLength)
      Object.assign(row, { done: true, finish: "length", text: this.text(row) });
  }

  private text(row: Row): string {
    return this.tokenizer.decode(
      row.tokens.map((t) => t.id),
      { skipSpecialTokens: true },
    );
  }
}

/** Max and log-sum-exp of a row of logits (temperature 1). */
function logSoftmaxStats(row: Float32Array): { max: number; logZ: number } {
  let max = -Infinity;
  for (let j = 0; j < row.length; j++) if (row[j] > max) max = row[j];
  let sum = 0;
  for (let j = 0; j < row.length; j++) sum += Math.exp(row[j] - max);
  return { max, logZ: Math.log(sum) };
}

/** Index of the earliest stop string in `text`, or -1. */
export function firstStop(text: string, stops: string[]): number {
  let at = -1;
  for (const s of stops) {
    const i = text.indexOf(s);
    if (i !== -1 && (at === -1 || i < at)) at = i;
  }
  return at;
}
