/** Export a checkpoint as GGUF files for llama.cpp, LM Studio and Ollama:
 *    npx tsx scripts/export-gguf.ts --model_path Qwen/Qwen2.5-0.5B --adapter outputs/grpo/final --output_dir outputs/gguf
 *    npx tsx scripts/export-gguf.ts --model_path outputs/tiny/grpo --type f32 --merge --output_dir outputs/tiny/gguf
 *  Writes model-<type>.gguf (the base as the trainer holds it: with --quantize nf4 or int8, the
 *  dequantized weights the adapter was trained on), adapter.gguf (F32) when there is an adapter, and
 *  with --merge merged-<type>.gguf (the adapter added into the base), then prints the Ollama Modelfile
 *  lines. --model_path takes what the other scripts take: a hub id, a model folder, a PEFT adapter
 *  folder (its base from adapter_config.json) or a training run's folder. */
import * as path from "node:path";
import { mergeLora, WEIGHT_TYPES, writeLoraGguf, writeModelGguf, type WeightType } from "../src/model/gguf.ts";
import { stateDict } from "../src/model/save.ts";
import { parseChoice, runMain } from "../src/run/cli.ts";
import { checkWritableFolder, folderWriteError } from "../src/util/fs.ts";
import { commandOf, flag, optional, parseFlags, toggle, type FlagTable } from "../src/run/flags.ts";
import { defaultOutputDir, modelFlags } from "../src/run/options.ts";
import { checkModelSource, openPolicy } from "../src/run/policy.ts";
import { UsageError } from "../src/util/errors.ts";

const { model_path, quantize, backend, threads } = modelFlags({ modelPath: "Qwen/Qwen2.5-0.5B", quantize: "none" });
const FLAGS = {
  model_path,
  adapter: optional("--adapter <dir>", "PEFT adapter folder to export beside the base (and merge with --merge)"),
  quantize: { ...quantize, help: "base weights as the trainer held them: none, int8, nf4 (exported dequantized)" },
  output_dir: optional("--output_dir <dir>", "folder for the .gguf files (default: outputs/<model name>/gguf)"),
  type: flag(
    "--type <kind>",
    `base weights in the file: ${WEIGHT_TYPES.join(", ")}`,
    parseChoice("type", WEIGHT_TYPES),
    "f16" as WeightType,
  ),
  merge: toggle("--merge", "also write merged-<type>.gguf: the adapter added into the base (W += alpha/r · B·A)", false),
  backend,
  threads,
} satisfies FlagTable;

await runMain(async () => {
  const { o } = parseFlags(commandOf("export-gguf", "Write a checkpoint (and its LoRA adapter) as GGUF files", FLAGS), FLAGS, process.argv);
  await checkModelSource(o.model_path, "--model_path", o.adapter);
  const out = o.output_dir ?? defaultOutputDir(o.model_path, "gguf");
  await checkWritableFolder(out, "--output_dir"); // before the model loads

  const policy = await openPolicy({
    modelPath: o.model_path,
    adapter: o.adapter,
    quantize: o.quantize,
    backend: o.backend,
    threads: o.threads,
  });
  const { model } = policy;
  const adapter = model.loraAdapter;
  if (o.merge && !adapter) throw new UsageError(`--merge: ${o.model_path} has no adapter to merge; pass --adapter <dir>`);
  const name = path.basename(policy.base.replace(/[\\/]+$/, ""));
  const log = (line: string) => process.stderr.write(line + "\n");
  const write = async (file: string, fn: () => Promise<number>) => {
    const t0 = Date.now();
    const bytes = await fn().catch((err: unknown) => {
      throw folderWriteError(err, out, "--output_dir");
    });
    log(`wrote ${path.join(out, file)} (${(bytes / 2 ** 20).toFixed(1)} MiB, ${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  };

  const sd = await stateDict(model); // f32, HF names, [out, in]; a quantized base dequantized
  const base = { config: model.config, tokenizerDir: policy.tokenizerDir, type: o.type, name };
  await write(`model-${o.type}.gguf`, () => writeModelGguf({ ...base, file: path.join(out, `model-${o.type}.gguf`), tensors: sd }));
  if (adapter) {
    const peft = await adapter.toPeft();
    const alpha = adapter.config.alpha;
    await write("adapter.gguf", () => writeLoraGguf({ file: path.join(out, "adapter.gguf"), tensors: peft, alpha, name: `${name}-lora` }));
    if (o.merge) {
      const merged = mergeLora(sd, peft, alpha / adapter.config.r);
      await write(`merged-${o.type}.gguf`, () =>
        writeModelGguf({ ...base, file: path.join(out, `merged-${o.type}.gguf`), tensors: merged, name: `${name}-merged` }),
      );
    }
  }
  model.dispose();

  const lora = adapter ? ` --lora ${path.join(out, "adapter.gguf")}` : "";
  const lines = [
    `# Ollama Modelfile: save these lines as ${path.join(out, "Modelfile")}, then ollama create <name> -f Modelfile`,
    `FROM ./model-${o.type}.gguf`,
    ...(adapter ? ["ADAPTER ./adapter.gguf"] : []),
    ...(o.merge ? [`# or, with the adapter merged in: FROM ./merged-${o.type}.gguf`] : []),
    `# llama.cpp: llama-cli -m ${path.join(out, `model-${o.type}.gguf`)}${lora}`,
  ];
  process.stdout.write(lines.join("\n") + "\n");
});
