/** LoRA adapters in PEFT's files: a factor's tensor name (`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`),
 *  adapter_config.json as PEFT writes it and as this project reads it (refusing what it leaves out), the
 *  factors read and checked against the model's shapes, and the folder written. On plain data: the
 *  adapter itself (its variables, init and products) is lora.ts'. How a local base model is recorded:
 *  relative to the adapter folder (run/policy.ts reads it back).
 *  Leaves out: DoRA, rsLoRA, per-module rank/alpha patterns (refused on load with a clear error). */
import { existsSync, promises as fs } from "node:fs";
import * as path from "node:path";
import { BadFileError } from "../util/errors.ts";
import { writeDirAtomic } from "../util/fs.ts";
import { encodeSafetensors, readSafetensorsAll, type HostTensor } from "./safetensors.ts";
import { LORA_TARGETS, type LoraConfig, type LoraTarget } from "./types.ts";

export function moduleGroup(m: LoraTarget): "self_attn" | "mlp" {
  return m.endsWith("_proj") && ["gate_proj", "up_proj", "down_proj"].includes(m) ? "mlp" : "self_attn";
}
/** `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` */
export function peftKey(layer: number, m: LoraTarget, which: "A" | "B"): string {
  return `base_model.model.model.layers.${layer}.${moduleGroup(m)}.${m}.lora_${which}.weight`;
}

/** What an adapter saved in `adapterDir` records as base_model_name_or_path: a local base folder as a
 *  path relative to the adapter folder (so the two move or are shared together; run/policy.ts
 *  adapterBaseOf resolves it from there), anything else (a hub id) as given. */
export function adapterBaseName(adapterDir: string, baseModel: string): string {
  if (baseModel === "" || !existsSync(path.resolve(baseModel))) return baseModel;
  return path.relative(path.resolve(adapterDir), path.resolve(baseModel)) || ".";
}

/** The adapter_config.json PEFT writes for a LoRA on a causal LM (keys sorted, as PEFT dumps them). */
export function adapterConfigJson(c: LoraConfig, baseModel: string): Record<string, unknown> {
  return {
    alpha_pattern: {},
    auto_mapping: null,
    base_model_name_or_path: baseModel,
    bias: "none",
    fan_in_fan_out: false,
    inference_mode: true,
    init_lora_weights: true,
    layer_replication: null,
    layers_pattern: null,
    layers_to_transform: null,
    loftq_config: {},
    lora_alpha: c.alpha,
    lora_bias: false,
    lora_dropout: c.dropout,
    megatron_config: null,
    megatron_core: "megatron.core",
    modules_to_save: null,
    peft_type: "LORA",
    r: c.r,
    rank_pattern: {},
    revision: null,
    target_modules: [...c.targetModules],
    task_type: "CAUSAL_LM",
    use_dora: false,
    use_rslora: false,
  };
}

/** "q_proj,v_proj" or "all" → validated target list. */
export function parseLoraTargets(spec: string | string[]): LoraTarget[] {
  const list = Array.isArray(spec)
    ? spec
    : spec
        .split(",")
        .map((s) => s.trim())
        .filter(Boolean);
  if (list.length === 1 && list[0] === "all") return [...LORA_TARGETS];
  for (const m of list)
    if (!(LORA_TARGETS as readonly string[]).includes(m))
      throw new Error(`unknown LoRA target module "${m}"; accepted: ${LORA_TARGETS.join(", ")} or all`);
  if (list.length === 0) throw new Error(`LoRA target modules are empty; accepted: ${LORA_TARGETS.join(", ")} or all`);
  return list as LoraTarget[];
}

/** A LoRA config this project can run: r a positive integer, alpha > 0, dropout in [0, 1), known targets. */
export function checkLoraConfig(c: LoraConfig): void {
  if (!Number.isInteger(c.r) || c.r <= 0) throw new Error(`LoRA r must be a positive integer, got ${c.r}`);
  if (!(c.alpha > 0)) throw new Error(`LoRA alpha must be positive, got ${c.alpha}`);
  if (!(c.dropout >= 0 && c.dropout < 1)) throw new Error(`LoRA dropout must be in [0, 1), got ${c.dropout}`);
  parseLoraTargets(c.targetModules);
}

/** dir/adapter_config.json → the LoRA config it describes, checked (checkLoraConfig). */
export async function readAdapterConfig(dir: string): Promise<LoraConfig> {
  const cfgFile = path.join(dir, "adapter_config.json");
  let raw: Record<string, unknown>;
  try {
    raw = JSON.parse(await fs.readFile(cfgFile, "utf8"));
  } catch (err) {
    throw new BadFileError(`${cfgFile}: cannot read adapter config (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw))
    throw new BadFileError(
      `${cfgFile}: holds ${raw === null ? "null" : Array.isArray(raw) ? "an array" : typeof raw}; expected ` +
        `a JSON object (a PEFT adapter config)`,
    );
  if (raw.peft_type !== undefined && raw.peft_type !== "LORA")
    throw new BadFileError(`${cfgFile}: peft_type ${JSON.stringify(raw.peft_type)} is not supported; accepted: "LORA"`);
  if (raw.use_dora === true) throw new BadFileError(`${cfgFile}: use_dora is true; only plain LoRA is supported`);
  if (raw.use_rslora === true) throw new BadFileError(`${cfgFile}: use_rslora is true; only alpha/r scaling is supported`);
  for (const k of ["rank_pattern", "alpha_pattern"])
    if (raw[k] && Object.keys(raw[k] as object).length)
      throw new BadFileError(`${cfgFile}: ${k} is not supported (one rank and alpha for every module)`);
  if (!Array.isArray(raw.target_modules))
    throw new BadFileError(
      `${cfgFile}: target_modules must be a list of module names, got ` +
        `${JSON.stringify(raw.target_modules)}; accepted: ${LORA_TARGETS.join(", ")}`,
    );
  let targets: LoraTarget[];
  try {
    targets = parseLoraTargets(raw.target_modules as string[]);
  } catch (err) {
    throw new BadFileError(`${cfgFile}: ${(err as Error).message}`);
  }
  const config: LoraConfig = {
    r: Number(raw.r),
    alpha: Number(raw.lora_alpha),
    dropout: Number(raw.lora_dropout ?? 0),
    targetModules: targets,
  };
  try {
    checkLoraConfig(config);
  } catch (err) {
    throw new BadFileError(`${cfgFile}: ${(err as Error).message}`);
  }
  return config;
}

/** One module's factors in torch's layout: A [r, in], B [out, r]. */
export interface PeftFactors {
  layer: number;
  module: LoraTarget;
  A: HostTensor;
  B: HostTensor;
}

/** dir/adapter_model.safetensors → every layer's factors of config's target modules, each checked
 *  against dims(module) = [in, out]; a missing, misshapen or extra tensor is an error naming it. */
export async function readPeftFactors(
  dir: string,
  config: LoraConfig,
  numLayers: number,
  dims: (m: LoraTarget) => [number, number],
): Promise<PeftFactors[]> {
  const wFile = path.join(dir, "adapter_model.safetensors");
  const tensors = await readSafetensorsAll(wFile);
  const targets = config.targetModules,
    expected = new Set<string>(),
    out: PeftFactors[] = [];
  for (let l = 0; l < numLayers; l++)
    for (const m of targets) {
      const [inD, outD] = dims(m);
      const ka = peftKey(l, m, "A"),
        kb = peftKey(l, m, "B");
      expected.add(ka).add(kb);
      const A = tensors[ka],
        B = tensors[kb];
      if (!A || !B) throw new BadFileError(`${wFile}: tensor ${A ? kb : ka} missing (adapter_config.json targets ${targets.join(", ")})`);
      if (A.shape.join() !== `${config.r},${inD}`)
        throw new BadFileError(`${wFile}: ${ka} has shape [${A.shape}], expected [${config.r}, ${inD}] (r ${config.r} × ${m} in_features)`);
      if (B.shape.join() !== `${outD},${config.r}`)
        throw new BadFileError(
          `${wFile}: ${kb} has shape [${B.shape}], expected [${outD}, ${config.r}] (${m} out_features × r ${config.r})`,
        );
      out.push({ layer: l, module: m, A, B });
    }
  const extra = Object.keys(tensors).filter((k) => !expected.has(k));
  if (extra.length) throw new Error(`${wFile}: tensor ${extra[0]} does not match the model or the target modules ${targets.join(", ")}`);
  return out;
}

/** An adapter folder as PEFT writes it, atomically: adapter_model.safetensors (`tensors`: PEFT names,
 *  torch layout) and adapter_config.json, its base recorded by adapterBaseName. */
export async function writePeftAdapter(
  dir: string,
  tensors: Record<string, HostTensor>,
  config: LoraConfig,
  baseModel: string,
): Promise<void> {
  await writeDirAtomic(dir, async (tmp) => {
    await fs.writeFile(path.join(tmp, "adapter_model.safetensors"), encodeSafetensors(tensors, { format: "pt" }));
    await fs.writeFile(
      path.join(tmp, "adapter_config.json"),
      // Relative to `dir`: the temp folder is its sibling, so the same path holds once renamed.
      JSON.stringify(adapterConfigJson(config, adapterBaseName(dir, baseModel)), null, 2) + "\n",
    );
  });
}
