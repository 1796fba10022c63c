/** Saving a Qwen2 model: its adapter in PEFT's format (adapter_config.json +
 *  adapter_model.safetensors), or the whole model as a Hugging Face folder (config.json +
 *  model.safetensors, F32, HF names, torch's [out, in] layout, fused modules written as their members).
 *  Folders are written atomically. Leaves out: sharded output, F16/BF16 output. */
import * as tf from "@tensorflow/tfjs";
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { writeDirAtomic, writeFileAtomic } from "../util/fs.ts";
import { configToJson } from "./config.ts";
import { moduleDims, type LoraAdapter } from "./lora.ts";
import { moduleGroup, writePeftAdapter } from "./peft.ts";
import { encodeSafetensors, type HostTensor } from "./safetensors.ts";
import { FUSED, FUSED_MODULES, type Qwen2Config } from "./types.ts";
import type { BaseWeight, Qwen2Weights } from "./weight.ts";

/** What saving reads of a model (Qwen2ForCausalLM has it; this file does not import the class). */
export interface SavableModel {
  readonly config: Qwen2Config;
  readonly weights: Qwen2Weights;
  readonly loraAdapter: LoraAdapter | null;
  readonly baseModelName: string;
}

export async function saveAdapter(model: SavableModel, dir: string): Promise<void> {
  const ad = model.loraAdapter;
  if (!ad) throw new Error(`saveAdapter(${dir}): the model has no LoRA adapter attached`);
  await writePeftAdapter(dir, await ad.toPeft(), ad.config, model.baseModelName);
}

/** HF names → torch-layout f32 tensors (W [out, in]); the tied head is written once (as embed_tokens). */
export async function stateDict(model: SavableModel): Promise<Record<string, HostTensor>> {
  const out: Record<string, HostTensor> = {};
  const put = async (name: string, t: tf.Tensor) => {
    out[name] = { shape: t.shape.slice(), data: (await t.data()) as Float32Array };
  };
  // A fused module is written as its members, each torch's [out, in] (HF names, as loaded). The
  // rows come back on the host (outInData also reassembles a matrix held in column blocks).
  const putT = async (names: string[], outDims: number[], w: BaseWeight) => {
    const data = await w.outInData(); // [out, in] row-major
    let row = 0;
    names.forEach((n, i) => {
      out[n] = { shape: [outDims[i], w.inDim], data: data.slice(row * w.inDim, (row + outDims[i]) * w.inDim) };
      row += outDims[i];
    });
  };
  const c = model.config;
  const w = model.weights;
  await putT(["model.embed_tokens.weight"], [c.vocabSize], w.embedT);
  if (w.lmHeadT) await putT(["lm_head.weight"], [c.vocabSize], w.lmHeadT);
  await put("model.norm.weight", w.norm);
  for (let i = 0; i < w.layers.length; i++) {
    const l = w.layers[i],
      p = `model.layers.${i}`;
    await put(`${p}.input_layernorm.weight`, l.inputNorm);
    await put(`${p}.post_attention_layernorm.weight`, l.postNorm);
    for (const f of FUSED_MODULES)
      await putT(
        FUSED[f].map((m) => `${p}.${moduleGroup(m)}.${m}.weight`),
        FUSED[f].map((m) => moduleDims(c, m)[1]),
        l.proj[f],
      );
    const biases = tf.split(
      l.qkvBias,
      FUSED.qkv_proj.map((m) => moduleDims(c, m)[1]),
    );
    for (let j = 0; j < biases.length; j++) await put(`${p}.self_attn.${FUSED.qkv_proj[j]}.bias`, biases[j]);
    tf.dispose(biases);
  }
  return out;
}

/** A Hugging Face folder: config.json and model.safetensors (F32), written atomically. */
export async function savePretrained(model: SavableModel, dir: string): Promise<void> {
  const tensors = await stateDict(model);
  const cfg = JSON.stringify(configToJson(model.config), null, 2) + "\n";
  await writeDirAtomic(dir, async (tmp) => {
    await fs.writeFile(path.join(tmp, "model.safetensors"), encodeSafetensors(tensors, { format: "pt" }));
    await writeFileAtomic(path.join(tmp, "config.json"), cfg);
  });
}
