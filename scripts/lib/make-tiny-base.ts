/** Builds the tiny preset's base model: learns the tokenizer from synthetic text, then pretrains a
 *  small Qwen2 from random weights as a plain language model on GSM8K-format solutions (question,
 *  worked solution with <<expr=result>> annotations, `#### N`). No chat format and no tool calls are
 *  in its data: SFT adds those. Deterministic for a given seed and step count (same machine). */
import { Template } from "@huggingface/jinja";
import { toolSchema } from "../../src/agents/types.ts";
import { calculatorTool } from "../../src/agents/calculator.ts";
import { generateSynthetic } from "../../src/datasets/synthetic.ts";
import { toConversation } from "../../src/agents/sft.ts";
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { createModel, loadModel } from "../../src/model/load.ts";
import { buildTinyTokenizer, QWEN2_5_CHAT_TEMPLATE, saveTinyTokenizer, type TinyTokenizerFiles } from "./tiny-tokenizer.ts";
import { tokenizerFromJson } from "../../src/model/tokenizer.ts";
import { AdamW } from "../../src/trainer/optimizer.ts";
import { lrAt } from "../../src/trainer/schedule.ts";
import { rightPad } from "../../src/trainer/batch.ts";
import { sftStep } from "../../src/trainer/sft.ts";
import { Rng } from "../../src/util/rng.ts";
import { TINY_PRETRAIN_PROBLEMS, TINY_SEEDS, TINY_VOCAB_SIZE, tinyModelConfig } from "../../src/presets/tiny.ts";

export interface MakeTinyBaseOptions {
  outDir: string;
  steps: number;
  batchSize: number;
  lr: number;
  seed: number;
  initFrom?: string; // continue pretraining this folder's model (its tokenizer is kept)
  chatShare?: number; // share of the data rendered as chat transcripts with tool calls (default 0)
  saveEvery?: number; // also save every N steps (0: only at the end)
  log?: (line: string) => void;
}

/** Text the tokenizer learns from: solutions as the base sees them and conversations as SFT renders
 *  them (so the template's pieces get merges too, like a real chat model's vocabulary). */
export function tokenizerCorpus(n: number): string[] {
  const examples = generateSynthetic({ n, seed: TINY_SEEDS.tokenizer, ...TINY_PRETRAIN_PROBLEMS });
  const template = new Template(QWEN2_5_CHAT_TEMPLATE);
  const tools = [toolSchema(calculatorTool)];
  const out: string[] = [];
  examples.forEach((ex, i) => {
    out.push(pretrainText(ex.question, ex.answer));
    const messages = toConversation(ex);
    out.push(template.render({ messages, tools: i % 2 ? tools : undefined, add_generation_prompt: false }));
  });
  return out;
}

export function pretrainText(question: string, answer: string): string {
  return `${question}\n${answer}`;
}

export async function makeTinyBase(o: MakeTinyBaseOptions): Promise<void> {
  const log = o.log ?? ((l: string) => process.stderr.write(l + "\n"));
  const files: TinyTokenizerFiles = o.initFrom
    ? {
        tokenizerJson: await readJson(path.join(o.initFrom, "tokenizer.json")),
        tokenizerConfig: await readJson(path.join(o.initFrom, "tokenizer_config.json")),
      }
    : buildTinyTokenizer(tokenizerCorpus(2000), { vocabSize: TINY_VOCAB_SIZE });
  const tokenizer = tokenizerFromJson(files.tokenizerJson, files.tokenizerConfig);
  const endId = tokenizer.tokenToId("<|endoftext|>")!;
  const model = o.initFrom
    ? await loadModel(o.initFrom, { trainable: "full" })
    : await createModel(tinyModelConfig(TINY_VOCAB_SIZE), { trainable: "full", seed: o.seed });
  const optimizer = new AdamW(model.trainableVariables(), { lr: o.lr, weightDecay: 0.01 });
  const rng = new Rng(o.seed);
  const template = new Template(QWEN2_5_CHAT_TEMPLATE);
  // Each --seed draws its own problems, so a continued run sees new ones.
  const pool = generateSynthetic({ n: o.steps * o.batchSize, seed: TINY_SEEDS.pretrain + 1000 * o.seed, ...TINY_PRETRAIN_PROBLEMS });
  rng.shuffle(pool);
  const t0 = Date.now();
  try {
    for (let step = 0; step < o.steps; step++) {
      const texts = pool.slice(step * o.batchSize, (step + 1) * o.batchSize);
      // A share of the data is chat transcripts with tool calls, as web-scale pretraining data holds
      // some; the rest is plain solutions.
      const seqs = texts.map((ex) => [
        ...tokenizer.encode(
          rng.next() < (o.chatShare ?? 0)
            ? template.render({ messages: toConversation(ex), add_generation_prompt: false })
            : pretrainText(ex.question, ex.answer),
        ),
        endId,
      ]);
      const batch = rightPad(
        seqs,
        seqs.map((s) => s.map(() => 1)),
        endId,
      );
      const lr = lrAt(step, { type: "cosine", lr: o.lr, warmupSteps: Math.min(50, Math.floor(o.steps / 10)), totalSteps: o.steps });
      const r = await sftStep(model, optimizer, [batch], { lr, maxGradNorm: 1 });
      if (o.saveEvery && (step + 1) % o.saveEvery === 0 && step + 1 < o.steps) {
        await model.savePretrained(o.outDir);
        await saveTinyTokenizer(o.outDir, files);
      }
      if (step % 25 === 0 || step === o.steps - 1)
        log(
          `pretrain step ${step + 1}/${o.steps} | loss ${r.loss.toFixed(3)} | lr ${lr.toExponential(2)} | ${((Date.now() - t0) / 1000).toFixed(0)} s`,
        );
    }
    await model.savePretrained(o.outDir);
    await saveTinyTokenizer(o.outDir, files);
  } finally {
    optimizer.dispose();
    model.dispose();
  }
}

async function readJson(file: string): Promise<Record<string, unknown>> {
  return JSON.parse(await fs.readFile(file, "utf8"));
}
