/** npm run bench — model throughput on this machine, one JSON line per measurement.
 *  Flags choose configs, quantization, workloads and backend; the workloads live in scripts/lib/bench.ts
 *  (import another workload file here to register it). */
import { Command } from "commander";
import { BACKEND_NAMES, initBackend } from "../src/kernels/backend.ts";
import { runMain } from "../src/run/cli.ts";
import { UsageError } from "../src/util/errors.ts";
import * as tf from "@tensorflow/tfjs";
import { benchContext, BENCH_CONFIGS, kernelCounts, layerTracedCounts, profileTop, WORKLOADS } from "./lib/bench.ts";
import { grpoStepOptions } from "./lib/grpo-shape.ts"; // registers grpo_step
import { webgpuIsSoftware } from "../src/kernels/webgpu/device.ts";
import type { Quantize } from "../src/model/types.ts";
import { threadsOption } from "../src/run/options.ts";
import type { ThreadsSpec } from "../src/kernels/wasm/threads.ts";

const defaults = { config: "small", quantize: "none", workloads: "forward,fwd_bwd,decode", backend: "wasm", profile: false };
const opts = new Command()
  .description("Benchmark forward, forward+backward (LoRA) and KV-cache decoding on random-weight Qwen2 models")
  .option("--config <name>", `small | 0.5b | all`, defaults.config)
  .option("--quantize <kind>", "none | int8 | nf4 (frozen base)", defaults.quantize)
  .option("--workloads <list>", `comma list of ${WORKLOADS.map((w) => w.name).join(", ")}`, defaults.workloads)
  .option("--backend <name>", BACKEND_NAMES.join(" | "), defaults.backend)
  .option("--repeat <n>", "timed runs per workload, median reported (default: 5 on small, 1 on 0.5b)")
  .option(
    "--layers <n>",
    "decoder layers of the models (default: the config's own; e.g. 4 of 0.5b's 24, reported as 0.5b-4l: the layers' cost scales with the count, the head's is paid in full; weights are laid out as in the whole model)",
  )
  .option("--beta <x>", "KL weight of the grpo_step workload (0: no reference pass, GRPO's default)", "0")
  .option(
    "--rollout_engine <kind>",
    "grpo_step's rollouts: local (this process's tfjs model) | llama (llama.cpp through node-llama-cpp)",
    "local",
  )
  .option("--engine_weights <type>", "with --rollout_engine llama: f32 | f16 | q8_0", "f16")
  .option(
    "--llama_adapter <how>",
    "with --rollout_engine llama: lora (swapped in unmerged, as runs do) | merged (the base alone, and what remaking a merged model costs)",
    "lora",
  )
  .option("--engine_gpu <kind>", "with --rollout_engine llama: auto | cuda | vulkan | metal | off", "off")
  .option("--no_update", "grpo_step: time the rollouts only (the update is the same whichever engine sampled)")
  .addOption(threadsOption())
  .option(
    "--profile",
    "also print the slowest kernels of each workload and the kernels per decode and per training step to stderr (tf.profile; slows the run)",
    defaults.profile,
  )
  .parse()
  .opts<
    typeof defaults & {
      threads: ThreadsSpec;
      repeat?: string;
      layers?: string;
      beta: string;
      rollout_engine: string;
      engine_weights: string;
      llama_adapter: string;
      engine_gpu: string;
      no_update?: boolean;
    }
  >();

await runMain(async () => {
  const configs = opts.config === "all" ? Object.keys(BENCH_CONFIGS) : opts.config.split(",");
  const names = opts.workloads
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean); // "" = none (--profile then prints the step budget only)
  if (opts.repeat !== undefined && !/^[1-9][0-9]*$/.test(opts.repeat))
    throw new UsageError(`--repeat must be a whole number ≥ 1, got "${opts.repeat}"`);
  if (opts.layers !== undefined && !/^[1-9][0-9]*$/.test(opts.layers))
    throw new UsageError(`--layers must be a whole number ≥ 1, got "${opts.layers}"`);
  const layers = opts.layers ? { numHiddenLayers: Number(opts.layers) } : {};
  grpoStepOptions.beta = Number(opts.beta);
  if (!(grpoStepOptions.beta >= 0)) throw new UsageError(`--beta must be a number ≥ 0, got "${opts.beta}"`);
  const choice = <T extends string>(flag: string, v: string, ok: readonly T[]): T => {
    if (!ok.includes(v as T)) throw new UsageError(`--${flag} ${v}: expected one of ${ok.join(", ")}`);
    return v as T;
  };
  grpoStepOptions.update = !opts.no_update;
  if (choice("rollout_engine", opts.rollout_engine, ["local", "llama"]) === "llama") {
    const gpu = choice("engine_gpu", opts.engine_gpu, ["auto", "cuda", "vulkan", "metal", "off"]);
    grpoStepOptions.llama = {
      weights: choice("engine_weights", opts.engine_weights, ["f32", "f16", "q8_0"]),
      adapter: choice("llama_adapter", opts.llama_adapter, ["lora", "merged"]),
      gpu: gpu === "off" ? false : gpu,
      threads: opts.threads,
    };
  }
  for (const c of configs)
    if (!BENCH_CONFIGS[c]) throw new UsageError(`unknown bench config "${c}"; accepted: ${Object.keys(BENCH_CONFIGS).join(", ")}, all`);
  for (const n of names)
    if (!WORKLOADS.some((w) => w.name === n))
      throw new UsageError(`unknown workload "${n}"; accepted: ${WORKLOADS.map((w) => w.name).join(", ")}`);
  await initBackend(opts.backend, { threads: opts.threads });
  for (const c of configs) {
    const ctx = benchContext(c, opts.quantize as Quantize, opts.repeat ? Number(opts.repeat) : c === "small" ? 5 : 1, 0, layers);
    if (opts.profile) {
      // 0.5B: counted from 1- and 2-layer models (exact); on a software adapter from short sequences
      // (a 2 × 256 step of the vocabulary head alone is ~0.5 TFLOP there), which changes only how many
      // vocabulary chunks the training step's head runs (one here; 2 × 256 rows make five on a GPU).
      const slow = c !== "small" && (await webgpuIsSoftware());
      const k =
        c === "small"
          ? await kernelCounts(ctx)
          : await layerTracedCounts(c, opts.quantize as Quantize, slow ? { promptLen: 16, trainLen: 8 } : {});
      process.stderr.write(
        `${c}: ${k.decodeStep} kernels per decode step (${k.decodeTop}), ${k.decodeStepLora} with LoRA, ${k.trainStep} per training step (${k.trainTop})${c === "small" ? "" : " [1- and 2-layer trace × layers" + (slow ? ", prompt 16, training 2 × 8 tokens" : "") + "]"}\n`,
      );
      if (k.dispatches)
        process.stderr.write(
          `${c}: webgpu dispatches per decode step ${k.dispatches.decode} (${k.dispatches.decodeTop}), ${k.dispatches.decodeLora} with LoRA, ${k.dispatches.draw} more for its draw (${k.dispatches.drawTop}); per training step ${k.dispatches.train} (${k.dispatches.trainTop}), ${k.dispatches.trainShared} with the rows' first 3/4 shared; bytes read back per decode step ${k.decodeReadbackBytes}\n` +
            `${c}: optimizer dispatches per step ${k.dispatches.optimizer} (AdamW with clipping over the LoRA variables)\n` +
            (k.hostUsPerDispatch
              ? `${c}: host µs per dispatch in the training step ${k.hostUsPerDispatch.run.toFixed(1)} (of which recordAndSubmit ${k.hostUsPerDispatch.record.toFixed(1)})\n`
              : ""),
        );
      console.log(JSON.stringify({ budget: c, backend: tf.getBackend(), ...k }));
    }
    for (const w of WORKLOADS.filter((x) => names.includes(x.name))) {
      if (opts.profile) {
        const { value, kernels, kinds } = await profileTop(() => w.run(ctx));
        process.stderr.write(`${c} ${w.name}: slowest kernels\n  ${kernels.join("\n  ")}\n`);
        process.stderr.write(`${c} ${w.name}: by kind (all shapes)\n  ${kinds.join(", ")}\n`);
        for (const m of value) console.log(JSON.stringify({ ...m, note: "profiled run (slower)" }));
      } else for (const m of await w.run(ctx)) console.log(JSON.stringify(m));
    }
    ctx.dispose();
  }
});
