/** LlamaBatch against this project's own forward: the tiny preset written as an F32 GGUF
 *  (model/gguf.ts), decoded by llama.cpp with an F32 KV cache. Skips where node-llama-cpp's binaries
 *  cannot load, except under CI, where that fails. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { writeLoraGguf, writeModelGguf } from "../../src/model/gguf.ts";
import { loadModel } from "../../src/model/load.ts";
import { LoraAdapter } from "../../src/model/lora.ts";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { stateDict } from "../../src/model/save.ts";
import { loadTokenizerFromDir } from "../../src/model/tokenizer.ts";
import type { Tokenizer } from "../../src/model/types.ts";
import { TINY_BASE_DIR } from "../../src/presets/tiny.ts";
import { LlamaBatch, mixSeed, type SampleParams } from "../../src/rollout/engines/llama-batch.ts";
import { importLlama } from "../../src/rollout/engines/llama-package.ts";
import { rolloutGroups, stopTokenIds } from "../../src/rollout/rollout.ts";
import { Rng } from "../../src/util/rng.ts";

const loadError: unknown = await importLlama()
  .then(async ({ getLlama }) => (await getLlama({ gpu: false, build: "never" })).dispose())
  .then(() => null)
  .catch((e: unknown) => e ?? new Error("node-llama-cpp failed to load"));

let dir: string, gguf: string, lora: string;
let model: Qwen2ForCausalLM, tok: Tokenizer, batch: LlamaBatch;
const sampled = (seed: number, temperature = 1): SampleParams => ({ temperature, topP: 1, topK: 0, seed });

/** Prefill each row's prompt, then draw n tokens per row (every row in every step); rows end cleared. */
async function decode(prompts: number[][], n: number, params: (row: number) => SampleParams) {
  const out = prompts.map(() => ({ tokens: [] as number[], logprobs: [] as number[] }));
  let inputs = prompts.map((tokens, row) => ({ row, tokens, sample: params(row) }));
  for (let i = 0; i < n; i++) {
    const draws = await batch.step(inputs);
    draws.forEach((d, row) => (out[row].tokens.push(d!.token), out[row].logprobs.push(d!.logprob)));
    inputs = draws.map((d, row) => ({ row, tokens: [d!.token], sample: params(row) }));
  }
  for (let r = 0; r < prompts.length; r++) await batch.endRow(r);
  return out;
}

/** The project's log p(ids[t] | ids[<t]) for t ≥ from. */
function projectLogprobs(ids: number[], from: number): number[] {
  const lp = model.tokenLogprobs([ids], [ids.map(() => 1)]).logprobs;
  const row = lp.arraySync()[0].slice(from);
  lp.dispose();
  return row;
}

const promptIds = (text: string) => tok.encode(tok.applyChatTemplate([{ role: "user", content: text }], { addGenerationPrompt: true }));

describe.skipIf(loadError !== null && !process.env.CI)("LlamaBatch on the tiny preset", () => {
  beforeAll(async () => {
    if (loadError) throw loadError; // only reached under CI (the suite is skipped otherwise)
    await initBackend("wasm");
    dir = await fs.mkdtemp(path.join(os.tmpdir(), "llama-batch-test-"));
    model = await loadModel(TINY_BASE_DIR);
    tok = await loadTokenizerFromDir(TINY_BASE_DIR);
    gguf = path.join(dir, "tiny-f32.gguf");
    lora = path.join(dir, "adapter.gguf");
    await writeModelGguf({ file: gguf, config: model.config, tensors: await stateDict(model), tokenizerDir: TINY_BASE_DIR, type: "f32" });
    batch = await LlamaBatch.open({ modelPath: gguf, sequences: 4, contextSize: 256, threads: 1, kvF32: true });
  });
  afterAll(async () => {
    await batch?.close();
    model?.dispose();
    if (dir) await fs.rm(dir, { recursive: true, force: true });
  });

  it("greedy tokens of 2 prompts × 2 samples equal rolloutGroups' greedy tokens", async () => {
    const messages = ["Janet has 16 eggs and sells 3. How many are left?", "What is 12 + 30?"].map((content) => [
      { role: "user" as const, content },
    ]);
    const maxNewTokens = 24;
    const ref = await rolloutGroups(model, tok, messages, {
      samplesPerPrompt: 2,
      maxNewTokens,
      maxTurns: 1,
      temperature: 0,
      topP: 1,
      topK: 0,
      rng: new Rng(1),
      tools: [],
    });
    const got = await decode(
      ref.map((t) => t.promptIds),
      maxNewTokens,
      () => sampled(0, 0),
    );
    const stop = stopTokenIds(tok);
    for (let r = 0; r < 4; r++) {
      const end = got[r].tokens.findIndex((t) => stop.has(t));
      expect(got[r].tokens.slice(0, end < 0 ? maxNewTokens : end + 1)).toEqual(ref[r].completionIds);
    }
    // greedy log-probs: the raw log-softmax of the argmax
    const ids = [...ref[0].promptIds, ...got[0].tokens];
    const want = projectLogprobs(ids, ref[0].promptIds.length);
    got[0].logprobs.forEach((lp, i) => expect(lp).toBeCloseTo(want[i], 3));
  });

  it("draws at temperature 1 are reproducible by seed, differ with other seeds, and carry the model's log-probs", async () => {
    const prompt = promptIds("Tom has 7 apples and buys 5 more. How many now?");
    const prompts = [prompt, prompt, prompt, prompt];
    const a = await decode(prompts, 16, (r) => sampled(100 + r));
    const again = await decode(prompts, 16, (r) => sampled(100 + r));
    const other = await decode(prompts, 16, (r) => sampled(200 + r));
    expect(again.map((x) => x.tokens)).toEqual(a.map((x) => x.tokens));
    expect(other.map((x) => x.tokens)).not.toEqual(a.map((x) => x.tokens));
    expect(new Set(a.map((x) => x.tokens.join())).size).toBeGreaterThan(1); // rows of one prompt draw apart
    for (const row of a) {
      const want = projectLogprobs([...prompt, ...row.tokens], prompt.length);
      row.logprobs.forEach((lp, i) => expect(Math.abs(lp - want[i])).toBeLessThan(1e-3));
    }
  });

  it("tokens read mid-sequence give the same next draw as a fresh prefill of the whole sequence", async () => {
    const prompt = promptIds("What is 4 times 9?");
    const forced = tok.encode("<tool_response>\n36\n</tool_response>");
    const [first] = await batch.step([{ row: 0, tokens: prompt, sample: sampled(7) }]);
    const [mid] = await batch.step([{ row: 0, tokens: [first!.token, ...forced], sample: sampled(7) }]);
    const [fresh] = await batch.step([{ row: 1, tokens: [...prompt, first!.token, ...forced], sample: sampled(7) }]);
    expect(batch.length(0)).toBe(batch.length(1));
    expect(fresh!.token).toBe(mid!.token);
    expect(Math.abs(fresh!.logprob - mid!.logprob)).toBeLessThan(1e-4);
    await batch.endRow(0);
    await batch.endRow(1);
  });

  it("fork (saveRow + loadRow) copies a prefilled prompt into other rows, replacing what they held", async () => {
    const prompt = promptIds("Sam reads 20 pages a day for 3 days.");
    await batch.step([
      { row: 0, tokens: prompt },
      { row: 3, tokens: [1, 2, 3] },
    ]);
    await batch.fork(0, [1, 2, 3]);
    expect([1, 2, 3].map((r) => batch.length(r))).toEqual([prompt.length, prompt.length, prompt.length]);
    const draws = await batch.step([0, 1, 2, 3].map((row) => ({ row, tokens: [prompt[prompt.length - 1]], sample: sampled(5) })));
    for (let r = 0; r < 4; r++) await batch.endRow(r);
    // the same as reading prompt + its last token again from scratch, row by row
    const ref = await batch.step([{ row: 0, tokens: [...prompt, prompt[prompt.length - 1]], sample: sampled(5) }]);
    await batch.endRow(0);
    for (const d of draws) {
      expect(d!.token).toBe(ref[0]!.token);
      expect(d!.logprob).toBeCloseTo(ref[0]!.logprob, 5);
    }
  });

  it("setAdapter changes the outputs, reloads a rewritten file, and null restores the base", async () => {
    const prompt = promptIds("Lily has 3 boxes of 12 pens.");
    const prompts = [prompt, prompt];
    const base = await decode(prompts, 8, (r) => sampled(r + 1));
    const writeAdapter = async (seed: number) => {
      const ad = LoraAdapter.init(model.config, { r: 4, alpha: 8, dropout: 0, targetModules: ["q_proj", "v_proj", "down_proj"] }, seed);
      const rng = new Rng(seed);
      for (const v of ad.variables())
        tf.tidy(() =>
          v.assign(
            tf.tensor(
              Float32Array.from({ length: v.size }, () => 0.3 * rng.normal()),
              v.shape,
            ),
          ),
        );
      await writeLoraGguf({ file: lora, tensors: await ad.toPeft(), alpha: ad.config.alpha });
      return ad;
    };
    const ad1 = await writeAdapter(1);
    expect(await batch.setAdapter(lora)).toBeGreaterThanOrEqual(0);
    const with1 = await decode(prompts, 8, (r) => sampled(r + 1));
    expect(with1[0].logprobs).not.toEqual(base[0].logprobs);
    // llama.cpp's LoRA is the project's LoRA: log-probs of the same tokens with the adapter attached
    model.swapAdapter(ad1);
    const want = projectLogprobs([...prompt, ...with1[0].tokens], prompt.length);
    model.swapAdapter(null)?.dispose();
    with1[0].logprobs.forEach((lp, i) => expect(Math.abs(lp - want[i])).toBeLessThan(1e-3));

    (await writeAdapter(2)).dispose(); // same path, new weights: setAdapter must not serve the cached ones
    await batch.setAdapter(lora);
    const with2 = await decode(prompts, 8, (r) => sampled(r + 1));
    expect(with2[0].logprobs).not.toEqual(with1[0].logprobs);

    await batch.setAdapter(null);
    expect(await decode(prompts, 8, (r) => sampled(r + 1))).toEqual(base);
  });

  it("checks its inputs", async () => {
    await expect(batch.step([{ row: 4, tokens: [1] }])).rejects.toThrow(/row 4 is out of range 0..3/);
    await expect(batch.step([{ row: 0, tokens: [] }])).rejects.toThrow(/no tokens/);
    await expect(batch.step([{ row: 0, tokens: new Array(300).fill(1) }])).rejects.toThrow(/exceed contextSize 256/);
    const bad = { row: 1, tokens: [1], sample: { ...sampled(1), topP: 0 } };
    await expect(batch.step([{ row: 0, tokens: [1] }, bad])).rejects.toThrow(/row 1: sampling .* is invalid/);
    expect(batch.length(0)).toBe(0); // nothing was read
    expect(mixSeed(1, 2)).not.toBe(mixSeed(1, 3));
    expect(mixSeed(1, 2)).not.toBe(mixSeed(2, 2));
  });
});
