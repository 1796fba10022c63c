/** Pretrains the tiny preset's base model (src/presets/tiny/): tokenizer + a small Qwen2 trained as a
 *  plain language model on synthetic GSM8K-format text. The shipped files were made with the defaults. */
import { Command } from "commander";
import { initBackend } from "../src/kernels/backend.ts";
import { parseChoice, parseFloatArg, parseIntArg, runMain } from "../src/run/cli.ts";
import { BACKENDS, threadsOption } from "../src/run/options.ts";
import { makeTinyBase } from "./lib/make-tiny-base.ts";
import { TINY_BASE_DIR } from "../src/presets/tiny.ts";

const program = new Command()
  .name("make-tiny-base")
  .description("Pretrain the tiny preset's base model on synthetic GSM8K-format text")
  .option("--output_dir <dir>", "where to write config.json, model.safetensors and the tokenizer", TINY_BASE_DIR)
  .option("--steps <n>", "optimizer steps", parseIntArg("steps", 1), 1500)
  .option("--batch_size <n>", "problems per step", parseIntArg("batch_size", 1), 16)
  .option("--learning_rate <x>", "peak learning rate (cosine schedule with warmup)", parseFloatArg("learning_rate", 0), 3e-3)
  .option("--seed <n>", "weights and data-order seed", parseIntArg("seed", 0), 0)
  .option("--chat_share <x>", "share of the data rendered as chat transcripts with tool calls", parseFloatArg("chat_share", 0, 1), 0)
  .option("--save_every <n>", "also save every N steps", parseIntArg("save_every", 0), 0)
  .option("--init_from <dir>", "continue pretraining the model in this folder (its tokenizer is kept)")
  .option("--backend <name>", `tfjs backend: ${BACKENDS.join(", ")}`, parseChoice("backend", BACKENDS), "auto")
  .addOption(threadsOption());

await runMain(async () => {
  const o = program.parse().opts();
  await initBackend(o.backend, { threads: o.threads });
  await makeTinyBase({
    outDir: o.output_dir,
    steps: o.steps,
    batchSize: o.batch_size,
    lr: o.learning_rate,
    seed: o.seed,
    initFrom: o.init_from,
    chatShare: o.chat_share,
    saveEvery: o.save_every,
  });
});
