/** PEFT's names and adapter_config.json as this project writes them: a factor's tensor name, the
 *  config's fields for a LoRA on a causal LM, and how a local base model is recorded (relative to the
 *  adapter folder). Read back by lora.ts'
 *  LoraAdapter.load and run/policy.ts. */
import { existsSync } from "node:fs";
import * as path from "node:path";
import type { LoraConfig, LoraTarget } from "./types.ts";

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
