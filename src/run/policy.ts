/** Opening what a run trains or evaluates: a base model (id, Hugging Face folder, or a full-weights
 *  SFT output), optionally with a PEFT adapter (given, or the folder itself is one), quantized as
 *  asked, plus its tokenizer. A PEFT folder names its base in adapter_config.json, as PEFT's do. */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { UsageError } from "../util/errors.ts";
import { loadModel } from "../model/load.ts";
import { resolveModelDir } from "../model/model-dir.ts";
import { loadTokenizerFromDir } from "../model/tokenizer.ts";
import type { Qwen2ForCausalLM } from "../model/qwen2.ts";
import type { LoraConfig, Quantize, Tokenizer } from "../model/types.ts";
import { writeDirAtomic, exists } from "../util/fs.ts";
import { isHubId } from "../util/hub.ts";
import type { ThreadsSpec } from "../kernels/wasm/threads.ts";
import { initBackend } from "../kernels/backend.ts";
import { loraTargets, type trainingFlags } from "./options.ts";
import type { OptionsOf } from "../util/flag.ts";

export interface OpenPolicyOptions {
  modelPath: string; // hub id, HF folder, full SFT output, or a PEFT adapter folder
  adapter?: string; // PEFT folder to attach (continues training it when trainable)
  quantize: Quantize;
  lora?: LoraConfig; // a fresh adapter, when none is loaded
  trainable?: "lora" | "full";
  seed?: number;
  backend?: string;
  threads?: ThreadsSpec;
  unpackBase?: boolean; // hold a quantized base unpacked while generating (default true)
}

/** The flags a training run opens its policy with (both runs' model, LoRA and backend flags). */
export type TrainingPolicyFlags = Pick<
  OptionsOf<ReturnType<typeof trainingFlags>>,
  "quantize" | "lora_r" | "lora_alpha" | "lora_dropout" | "lora_targets" | "seed" | "backend" | "threads" | "unpack_base"
>;

/** A training run's policy: `full` trains every weight, else a fresh LoRA adapter from the flags (or
 *  the one at `adapter`) on the quantized base. */
export function trainingPolicy(f: TrainingPolicyFlags, o: { modelPath: string; adapter?: string; full: boolean }): OpenPolicyOptions {
  const lora = { r: f.lora_r, alpha: f.lora_alpha, dropout: f.lora_dropout, targetModules: loraTargets(f.lora_targets) };
  return {
    modelPath: o.modelPath,
    adapter: o.adapter,
    quantize: f.quantize,
    lora: o.full ? undefined : lora,
    trainable: o.full ? "full" : "lora",
    seed: f.seed,
    backend: f.backend,
    threads: f.threads,
    unpackBase: f.unpack_base,
  };
}

export interface Policy {
  model: Qwen2ForCausalLM;
  tokenizer: Tokenizer;
  base: string; // what adapters trained on this policy record as base_model_name_or_path
  adapterDir: string | null;
  tokenizerDir: string;
}

/** A local folder resolves to its absolute path (so saved adapters find their base from anywhere);
 *  anything else is a hub id. A path-looking argument that does not exist is a usage error. */
async function localOrId(p: string, flag: string): Promise<string> {
  const run = await runFolderModel(p, flag);
  if (run !== null) return run;
  if (await exists(p)) return path.resolve(p);
  if (!isHubId(p))
    throw new UsageError(
      `${flag} ${p}: no such folder; expected a Hugging Face model folder, a PEFT adapter folder or a hub id like Qwen/Qwen2.5-0.5B`,
    );
  return p;
}

const noted = new Set<string>();
const noteOnce = (line: string) => {
  if (!noted.has(line)) process.stderr.write(line + "\n");
  noted.add(line);
};

const isModelFolder = async (d: string) =>
  (await exists(path.join(d, "config.json"))) || (await exists(path.join(d, "adapter_config.json")));

/** The model in a training run's folder, for the command lines of the project this one grew from
 *  (its SFT wrote the model into --output_dir itself, its GRPO wrote `epoch_N/` folders):
 *    RUN (holds final/, no model of its own)  → RUN/final
 *    RUN/epoch_N (absent)                      → RUN/final when N is the run's last step (--total_epochs
 *                                                is --max_steps here), else RUN/checkpoint-N if saved
 *  Says what it chose on stderr; a missing epoch_N is a usage error listing what the run holds.
 *  Returns null for anything else. */
export async function runFolderModel(p: string, flag: string, note: (line: string) => void = noteOnce): Promise<string | null> {
  const abs = path.resolve(p);
  if ((await exists(abs)) && !(await isModelFolder(abs)) && (await isModelFolder(path.join(abs, "final")))) {
    note(`${flag} ${p} is a training run's folder: using its final model, ${path.join(p, "final")}`);
    return path.join(abs, "final");
  }
  const m = /^epoch_(\d+)$/.exec(path.basename(abs));
  if (m === null || (await exists(abs)) || !(await exists(path.join(path.dirname(abs), "run.json")))) return null;
  const run = path.dirname(abs);
  const n = Number(m[1]);
  // run.json holds the run's flags under "config" (run/flags.ts); unreadable: no step count.
  const maxSteps = await fs
    .readFile(path.join(run, "run.json"), "utf8")
    .then((t) => (JSON.parse(t) as { config?: { max_steps?: unknown } }).config?.max_steps)
    .catch(() => undefined);
  const final = path.join(run, "final");
  const ckpt = path.join(run, `checkpoint-${n}`);
  const pick = n === maxSteps && (await isModelFolder(final)) ? final : (await isModelFolder(ckpt)) ? ckpt : null;
  if (pick !== null) {
    note(
      `${flag} ${p}: this project's runs write checkpoint-<step>/ and final/ instead of epoch_N/ ` +
        `(--total_epochs counts RL steps); using ${pick}`,
    );
    return pick;
  }
  const held = (await fs.readdir(run)).filter((d) => d === "final" || /^checkpoint-\d+$/.test(d)).sort();
  throw new UsageError(
    `${flag} ${p}: no such folder; this project's runs write checkpoint-<step>/ and final/ instead of ` +
      `epoch_N/ (--total_epochs counts RL steps), and ${run} holds ${held.length ? held.map((d) => d + "/").join(", ") : "neither"}`,
  );
}

/** --adapter (or --init_adapter): an existing folder with adapter_config.json, as an absolute path. */
async function adapterFolder(p: string, flag = "--adapter"): Promise<string> {
  const dir = await localOrId(p, flag);
  if (!path.isAbsolute(dir) || !(await exists(path.join(dir, "adapter_config.json"))))
    throw new UsageError(`${flag} ${p}: no adapter_config.json there; expected a PEFT adapter folder`);
  return dir;
}

async function readAdapterBase(dir: string): Promise<string> {
  const file = path.join(dir, "adapter_config.json");
  let cfg: { base_model_name_or_path?: unknown };
  try {
    cfg = JSON.parse(await fs.readFile(file, "utf8"));
  } catch (err) {
    throw new UsageError(`${file}: cannot read it as JSON (${(err as Error).message.split("\n")[0]})`);
  }
  if (typeof cfg !== "object" || cfg === null || Array.isArray(cfg))
    throw new UsageError(`${file}: expected a JSON object (a PEFT adapter config)`);
  if (typeof cfg.base_model_name_or_path !== "string" || !cfg.base_model_name_or_path)
    throw new UsageError(`${file}: base_model_name_or_path is missing; pass the base with --model_path and this folder with --adapter`);
  return cfg.base_model_name_or_path;
}

/** The base a PEFT adapter folder names, as openPolicy loads it: an absolute path, a path relative to
 *  the adapter folder when one exists there, or else the name as given (a hub id). */
export async function adapterBaseOf(adapterDir: string): Promise<string> {
  const named = await readAdapterBase(adapterDir);
  return path.isAbsolute(named) || !(await exists(path.resolve(adapterDir, named))) ? named : path.resolve(adapterDir, named);
}

/** An adapter opened through --model_path whose base is not found: say that the name is the adapter's
 *  base, where a relative one was looked for, and how to give the base instead. */
async function missingAdapterBase(adapterDir: string, reason: string): Promise<string> {
  const file = path.join(adapterDir, "adapter_config.json");
  const named = await readAdapterBase(adapterDir);
  const how = "copy the base there, or pass the base with --model_path and this folder with --adapter";
  if (path.isAbsolute(named)) return `${file}: the adapter's base ${named} is not there; ${how}`;
  const relative = `${path.resolve(adapterDir, named)}, relative to the adapter folder`;
  if (!isHubId(named)) return `${file}: the adapter's base "${named}" is not there (looked for ${relative}); ${how}`;
  const rest = reason.replace(/^model "[^"]*" not found: /, "");
  return (
    `${file}: the adapter's base "${named}" was not found (looked for ${relative}, then by hub id: ${rest}); ` +
    "or pass the base with --model_path and this folder with --adapter"
  );
}

export async function openPolicy(o: OpenPolicyOptions): Promise<Policy> {
  let base = await localOrId(o.modelPath, "--model_path");
  let adapterDir: string | null = null;
  if (path.isAbsolute(base) && (await exists(path.join(base, "adapter_config.json")))) {
    adapterDir = base;
    base = await adapterBaseOf(base);
  }
  if (o.adapter) adapterDir = await adapterFolder(o.adapter);
  if (adapterDir && o.trainable === "full")
    throw new UsageError(`--full trains all weights of a plain model, but ${adapterDir} is a LoRA adapter; merge it first or drop --full`);
  let baseDir: string;
  try {
    baseDir = await resolveModelDir(base);
  } catch (err) {
    const message = (err as Error).message;
    throw new UsageError(adapterDir && !o.adapter ? await missingAdapterBase(adapterDir, message) : message);
  }
  await initBackend(o.backend, { threads: o.threads }); // the run starts the backend; the model only uses it
  let model: Qwen2ForCausalLM;
  try {
    model = await loadModel(base, {
      quantize: o.quantize,
      adapter: adapterDir ?? undefined,
      lora: adapterDir ? undefined : o.lora,
      trainable: o.trainable,
      seed: o.seed,
    });
  } catch (err) {
    // An adapter that does not fit the base (another model, rank or modules) is the user's input.
    const msg = (err as Error).message;
    if (adapterDir && msg.includes(adapterDir)) throw new UsageError(msg.split("\n")[0]);
    throw err;
  }
  model.unpackForGeneration = o.unpackBase ?? true;
  const tokenizerDir = adapterDir && (await exists(path.join(adapterDir, "tokenizer.json"))) ? adapterDir : baseDir;
  let tokenizer: Tokenizer;
  try {
    tokenizer = await loadTokenizerFromDir(tokenizerDir);
  } catch (err) {
    model.dispose();
    throw err;
  }
  return { model, tokenizer, base, adapterDir, tokenizerDir };
}

/** Save the trained part (PEFT adapter, or the full model) into `dir`, with the tokenizer files
 *  beside it so the folder works on its own as --model_path. The folder is filled under a temp name
 *  and renamed into place: it is either complete or absent (or the previous one). */
export async function savePolicy(p: Policy, dir: string, full: boolean): Promise<void> {
  await writeDirAtomic(dir, async (tmp) => {
    if (full) await p.model.savePretrained(tmp);
    else await p.model.saveAdapter(tmp);
    for (const f of ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]) {
      const src = path.join(p.tokenizerDir, f);
      if (await exists(src)) await fs.copyFile(src, path.join(tmp, f));
    }
  });
}

/** Cheap checks of --model_path (and --adapter) before anything is loaded or written. */
export async function checkModelSource(modelPath: string, flag: string, adapter?: string, adapterFlag = "--adapter"): Promise<void> {
  const p = await localOrId(modelPath, flag);
  if (path.isAbsolute(p)) {
    const ok =
      (await fs.stat(p)).isDirectory() &&
      ((await exists(path.join(p, "config.json"))) || (await exists(path.join(p, "adapter_config.json"))));
    if (!ok)
      throw new UsageError(
        `${flag} ${modelPath}: no config.json or adapter_config.json there; expected a Hugging Face model folder or a PEFT adapter folder`,
      );
  }
  if (adapter !== undefined) await adapterFolder(adapter, adapterFlag);
}
