/** GGUF out (src/model/gguf.ts, scripts/export-gguf.ts), checked against llama.cpp itself through
 *  node-llama-cpp's prebuilt CPU build: the file as its GGUF parser reads it back, the F16 / Q8_0
 *  encoders on hand-computed values, the tiny preset's tokens and teacher-forced log-probs equal to this
 *  project's (base, and with a LoRA adapter), and the export script's files decoding greedily as
 *  rolloutGroups does. Where llama.cpp cannot load, its tests are skipped, except under CI=true, where
 *  they fail. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { initBackend } from "../../src/kernels/backend.ts";
import {
  cachedModelGguf,
  encodeF16,
  encodeQ8_0,
  f32,
  f32ToF16Bits,
  GGML_TYPE,
  i32,
  u32,
  writeGguf,
  writeLoraGguf,
  writeModelGguf,
  type WeightType,
} from "../../src/model/gguf.ts";
import { loadModel } from "../../src/model/load.ts";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { stateDict } from "../../src/model/save.ts";
import { loadTokenizerFromDir } from "../../src/model/tokenizer.ts";
import { LORA_TARGETS, type ChatMessage, type Tokenizer, type ToolSchema } from "../../src/model/types.ts";
import { TINY_BASE_DIR } from "../../src/presets/tiny.ts";
import { importLlama, type NodeLlamaCpp } from "../../src/rollout/engines/llama-package.ts";
import { rolloutGroups, stopTokenIds } from "../../src/rollout/rollout.ts";
import { Rng } from "../../src/util/rng.ts";
import { runScript } from "../run/helpers/run-script.ts";

type ControlledEvaluateInputItem = NodeLlamaCpp.ControlledEvaluateInputItem;
type LlamaContextSequence = NodeLlamaCpp.LlamaContextSequence;
type Token = NodeLlamaCpp.Token;
type GgufTensorInfo = NodeLlamaCpp.GgufTensorInfo;

// node-llama-cpp is an optional package (llama-package.ts): its tests need it installed and its
// binaries loading.
let loadError: unknown;
const nl = await importLlama().catch((err) => {
  loadError = err;
  return null;
});
const llama = await nl?.getLlama({ gpu: false, build: "never", logLevel: nl.LlamaLogLevel.error }).catch((err: unknown) => {
  loadError = err;
  return null;
});
/** Tests that read GGUF with node-llama-cpp's parser, and those that run llama.cpp: skipped where it
 *  is not installed or cannot load, failed under CI. */
const withParser = nl || process.env.CI ? describe : describe.skip;
const withLlama = llama || process.env.CI ? describe : describe.skip;
const needParser = () => {
  if (!nl) throw new Error(`node-llama-cpp did not load: ${(loadError as Error)?.message}`);
  return nl;
};
const needLlama = () => {
  if (!llama) throw new Error(`node-llama-cpp did not load: ${(loadError as Error)?.message}`);
  return llama;
};

let tmp: string;
beforeAll(async () => {
  tmp = await fs.mkdtemp(path.join(os.tmpdir(), "gguf-"));
});
afterAll(async () => {
  await fs.rm(tmp, { recursive: true, force: true });
  model?.dispose();
  await llama?.dispose();
});

describe("encoders", () => {
  it("F16: round to nearest even, subnormals, overflow", () => {
    const cases: [number, number][] = [
      [1, 0x3c00],
      [-2, 0xc000],
      [0.1, 0x2e66],
      [1 / 3, 0x3555],
      [1 + 2 ** -11, 0x3c00], // tie: stays on the even 1.0
      [1 + 3 * 2 ** -11, 0x3c02], // tie: up to the even neighbour
      [65504, 0x7bff],
      [65520, 0x7c00], // tie past the largest half: inf
      [2 ** -14, 0x0400], // smallest normal
      [2 ** -24, 0x0001], // smallest subnormal
      [3 * 2 ** -26, 0x0001],
      [2 ** -25, 0x0000], // tie: to the even 0
      [-0, 0x8000],
      [Infinity, 0x7c00],
      [NaN, 0x7e00],
    ];
    for (const [x, bits] of cases) expect(f32ToF16Bits(x), `${x}`).toBe(bits);
    expect([...encodeF16(Float32Array.of(1, -2))]).toEqual([0x00, 0x3c, 0x00, 0xc0]);
  });

  it("Q8_0: d = max|x|/127 as f16, q = round(x/d) half away from zero", () => {
    const x = new Float32Array(96);
    x.set([127, -63.5, 0.5, -0.5, 1.49], 0); // d = 1
    x.set([254, 3, -5, 1, 0.9], 64); // d = 2; block 2 (32..63) is all zeros: d = 0
    const q = encodeQ8_0(x);
    expect(q.length).toBe(3 * 34);
    const block = (b: number) => [...q.subarray(b * 34, b * 34 + 8)];
    expect(block(0)).toEqual([0x00, 0x3c, 127, 0xc0, 1, 0xff, 1, 0]); // -64 = 0xc0, -1 = 0xff
    expect(block(1)).toEqual([0, 0, 0, 0, 0, 0, 0, 0]);
    expect(block(2)).toEqual([0x00, 0x40, 127, 2, 0xfd, 1, 0, 0]); // 1.5 → 2, -2.5 → -3, 0.5 → 1, 0.45 → 0
    expect(() => encodeQ8_0(new Float32Array(33))).toThrow(/multiple of 32/);
  });
});

withParser("writeGguf read back by node-llama-cpp's GGUF parser", () => {
  it("keeps metadata, tensor infos and data as written", async () => {
    const file = path.join(tmp, "roundtrip.gguf");
    const a = Float32Array.of(1, 2, 3),
      b = Float32Array.of(0.5, -1, 2, 0.1, 0, 7),
      c = Float32Array.from({ length: 64 }, (_, i) => (i - 30) / 7);
    const size = await writeGguf(
      file,
      {
        "general.architecture": "qwen2",
        "test.str": "héllo",
        "test.flag": true,
        "test.u32": u32(7),
        "test.i32": i32(-3),
        "test.f32": f32(0.5),
        "test.strs": { type: "string[]", value: ["a b", "", "Ġx"] },
        "test.i32s": { type: "i32[]", value: Int32Array.of(1, -1, 3) },
        "test.u32s": { type: "u32[]", value: [4, 5] },
        "test.f32s": { type: "f32[]", value: [0.25, -2] },
      },
      [
        { name: "a", shape: [3], type: GGML_TYPE.F32, data: a },
        { name: "b", shape: [2, 3], type: GGML_TYPE.F16, data: b },
        { name: "c", shape: [2, 32], type: GGML_TYPE.Q8_0, data: c },
      ],
    );
    const info = await needParser().readGgufFileInfo(file, { logWarnings: false });
    expect(info.version).toBe(3);
    expect(Number(info.tensorCount)).toBe(3);
    const m = info.metadata as any;
    expect(m.general.alignment).toBe(32);
    expect(m.test).toEqual({
      str: "héllo",
      flag: true,
      u32: 7,
      i32: -3,
      f32: 0.5,
      strs: ["a b", "", "Ġx"],
      i32s: [1, -1, 3],
      u32s: [4, 5],
      f32s: [0.25, -2],
    });
    const t = info.tensorInfo!.map((x: GgufTensorInfo) => ({
      name: x.name,
      dims: x.dimensions.map(Number),
      type: x.ggmlType,
      offset: Number(x.offset),
    }));
    expect(t).toEqual([
      { name: "a", dims: [3], type: 0, offset: 0 }, // 12 bytes, padded to 32
      { name: "b", dims: [3, 2], type: 1, offset: 32 }, // GGML order: innermost first
      { name: "c", dims: [32, 2], type: 8, offset: 64 },
    ]);
    const bytes = await fs.readFile(file);
    expect(bytes.length).toBe(size);
    const at = (i: number, n: number) => [
      ...bytes.subarray(Number(info.tensorInfo![i].fileOffset), Number(info.tensorInfo![i].fileOffset) + n),
    ];
    expect(at(0, 12)).toEqual([...new Uint8Array(a.buffer)]);
    expect(at(1, 12)).toEqual([...encodeF16(b)]);
    expect(at(2, 68)).toEqual([...encodeQ8_0(c)]);
    expect(Number(info.tensorInfo![2].fileOffset) + 96).toBe(size); // 68 bytes, padded
  });
});

// ---------------------------------------------------------------- the tiny preset in llama.cpp

const TOOLS: ToolSchema[] = [
  {
    type: "function",
    function: {
      name: "calculator",
      description: "Evaluate an arithmetic expression",
      parameters: { type: "object", properties: { expression: { type: "string" } } },
    },
  },
];
const CONVERSATION: ChatMessage[] = [
  { role: "user", content: "Tom has 123 apples and buys 456 more. How many apples does he have?" },
  {
    role: "assistant",
    content: "",
    tool_calls: [{ type: "function", function: { name: "calculator", arguments: { expression: "123+456" } } }],
  },
  { role: "tool", content: "579" },
  { role: "assistant", content: "He has 123 + 456 = 579 apples. The answer is \\boxed{579}." },
];

let model: Qwen2ForCausalLM;
let tokenizer: Tokenizer;
let ids: number[]; // the conversation, rendered with tools and tokenized by this project
let short: number[]; // the same without the tool schemas: the log-prob sequence
const files: Record<string, string> = {};

/** llama.cpp on a GGUF: F32 KV cache, no flash attention, one thread (the default oversubscribes a
 *  2-core machine: seconds a decode step), optionally a LoRA adapter at scale 1. */
async function withLlamaContext<T>(modelPath: string, lora: string | undefined, fn: (seq: LlamaContextSequence) => Promise<T>): Promise<T> {
  const m = await needLlama().loadModel({ modelPath });
  try {
    const ctx = await m.createContext({
      contextSize: 512,
      threads: 1,
      flashAttention: false,
      experimentalKvCacheKeyType: "F32",
      experimentalKvCacheValueType: "F32",
      ...(lora ? { lora: { adapters: [{ filePath: lora, scale: 1 }] } } : {}),
    });
    return await fn(ctx.getSequence());
  } finally {
    await m.dispose();
  }
}

/** Teacher-forced log p(ids[t] | ids[<t]) from llama.cpp, out[0] = 0. The default sampler at
 *  temperature 0 is greedy alone, so the probabilities are the softmax of the raw logits. */
function llamaLogprobs(modelPath: string, ids: number[], lora?: string): Promise<number[]> {
  const tokens = ids as Token[];
  return withLlamaContext(modelPath, lora, async (seq) => {
    const res = await seq.controlledEvaluate(tokens.slice(0, -1).map((t) => [t, { generateNext: { probabilities: true } }]));
    return [0, ...tokens.slice(1).map((t, i) => Math.log(res[i]!.next.probabilities!.get(t)!))];
  });
}

/** Greedy continuation by llama.cpp: up to n tokens, stopping after a stop token. */
function llamaGreedy(modelPath: string, prompt: number[], n: number, stop: Set<number>, lora?: string): Promise<number[]> {
  const next = (t: Token): ControlledEvaluateInputItem => [t, { generateNext: { token: true, options: { temperature: 0 } } }];
  return withLlamaContext(modelPath, lora, async (seq) => {
    const tokens = prompt as Token[];
    let input: ControlledEvaluateInputItem[] = [...tokens.slice(0, -1), next(tokens[tokens.length - 1])];
    const out: number[] = [];
    while (out.length < n) {
      const res = await seq.controlledEvaluate(input);
      const t = res[input.length - 1]!.next.token!;
      out.push(t);
      if (stop.has(t)) break;
      input = [next(t)];
    }
    return out;
  });
}

async function projectLogprobs(adapters: boolean): Promise<number[]> {
  const { logprobs } = model.tokenLogprobs([short], [short.map(() => 1)], { adapters });
  const out = (await logprobs.array())[0];
  logprobs.dispose();
  return out;
}

const maxAbsDiff = (a: number[], b: number[]) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i])), 0);

withLlama("the tiny preset in llama.cpp", () => {
  beforeAll(async () => {
    needLlama();
    await initBackend("wasm");
    tokenizer = await loadTokenizerFromDir(TINY_BASE_DIR);
    model = await loadModel(TINY_BASE_DIR, { lora: { r: 4, alpha: 8, dropout: 0, targetModules: [...LORA_TARGETS] }, seed: 1 });
    // PEFT starts B at zero: give it values, so the adapter changes the outputs (scaling alpha/r = 2)
    model.loraAdapter!.variables().forEach((v, i) => {
      if (v.name.includes(".lora_B#")) tf.tidy(() => v.assign(tf.mul(tf.randomNormal(v.shape, 0, 1, "float32", 100 + i), 0.02)));
    });
    ids = tokenizer.encode(tokenizer.applyChatTemplate(CONVERSATION, { tools: TOOLS }));
    short = tokenizer.encode(tokenizer.applyChatTemplate(CONVERSATION));
    const sd = await stateDict(model);
    for (const type of ["f32", "f16", "q8_0"] as WeightType[]) {
      files[type] = path.join(tmp, `tiny-${type}.gguf`);
      await writeModelGguf({ file: files[type], config: model.config, tensors: sd, tokenizerDir: TINY_BASE_DIR, type, name: "tiny" });
    }
    files.adapter = path.join(tmp, "tiny-adapter.gguf");
    await writeLoraGguf({ file: files.adapter, tensors: await model.loraAdapter!.toPeft(), alpha: 8 });
  });

  it("writes the Qwen2 metadata and tokenizer as convert_hf_to_gguf.py does", async () => {
    const info = await needParser().readGgufFileInfo(files.q8_0, { logWarnings: false });
    const m = info.metadata as any;
    expect(m.general).toMatchObject({ architecture: "qwen2", type: "model", name: "tiny", file_type: 7, alignment: 32 });
    expect(m.qwen2).toMatchObject({
      block_count: 4,
      context_length: 1024,
      embedding_length: 128,
      feed_forward_length: 384,
      attention: { head_count: 4, head_count_kv: 2, key_length: 32, value_length: 32, layer_norm_rms_epsilon: Math.fround(1e-6) },
      rope: { freq_base: 10000 },
    });
    const tk = m.tokenizer.ggml;
    expect(tk).toMatchObject({ model: "gpt2", pre: "qwen2", add_bos_token: false });
    expect(tk.tokens).toHaveLength(512);
    expect(tk.tokens[tk.eos_token_id]).toBe("<|im_end|>");
    expect(tk.tokens[tk.padding_token_id]).toBe("<|endoftext|>");
    expect(tk.tokens[tk.bos_token_id]).toBe("<|endoftext|>");
    expect([506, 507, 508, 511].map((i) => [tk.tokens[i], tk.token_type[i]])).toEqual([
      ["<|im_start|>", 3],
      ["<|im_end|>", 3],
      ["<tool_call>", 4],
      ["</tool_response>", 4],
    ]);
    expect(tk.merges).toHaveLength(249);
    const config = JSON.parse(await fs.readFile(path.join(TINY_BASE_DIR, "tokenizer_config.json"), "utf8"));
    expect(m.tokenizer.chat_template).toBe(config.chat_template);
    const types = Object.fromEntries(info.tensorInfo!.map((t: GgufTensorInfo) => [t.name, t.ggmlType]));
    expect(types).toMatchObject({ "token_embd.weight": 8, "blk.0.attn_q.weight": 8, "blk.0.attn_q.bias": 0, "blk.3.ffn_norm.weight": 0 });
    expect(types["output.weight"]).toBeUndefined(); // tied: llama.cpp reads token_embd
    expect(info.tensorInfo).toHaveLength(2 + 4 * 12);

    const lora = await needParser().readGgufFileInfo(files.adapter, { logWarnings: false });
    expect(lora.metadata).toMatchObject({
      general: { architecture: "qwen2", type: "adapter" },
      adapter: { type: "lora", lora: { alpha: 8 } },
    });
    const dims = Object.fromEntries(lora.tensorInfo!.map((t: GgufTensorInfo) => [t.name, [t.dimensions.map(Number), t.ggmlType]]));
    expect(dims["blk.0.attn_q.weight.lora_a"]).toEqual([[128, 4], 0]); // A [r, in] in GGML order
    expect(dims["blk.3.ffn_down.weight.lora_b"]).toEqual([[4, 128], 0]); // B [out, r]
    expect(lora.tensorInfo).toHaveLength(4 * 7 * 2);
  });

  it("tokenizes a rendered chat with tool calls as this project's tokenizer does", async () => {
    const m = await needLlama().loadModel({ modelPath: files.f32 });
    const text = tokenizer.applyChatTemplate(CONVERSATION, { tools: TOOLS, addGenerationPrompt: false });
    expect(ids).toContain(tokenizer.tokenToId("<tool_call>"));
    expect(Array.from(m.tokenize(text, true))).toEqual(ids);
    expect(m.detokenize(m.tokenize(text, true), true)).toBe(text);
    await m.dispose();
  });

  it("gives the project's teacher-forced log-probs: F32 within 1e-4, F16 and Q8_0 near", async () => {
    const ref = await projectLogprobs(false);
    const diff: Record<string, number> = {},
      mean: Record<string, number> = {};
    for (const type of ["f32", "f16", "q8_0"]) {
      const got = await llamaLogprobs(files[type], short);
      diff[type] = maxAbsDiff(got, ref);
      mean[type] = got.reduce((s, x, i) => s + Math.abs(x - ref[i]), 0) / (got.length - 1);
    }
    console.log(`tiny preset, ${short.length} tokens, |Δ log p| vs this project: max ${JSON.stringify(diff)} mean ${JSON.stringify(mean)}`);
    expect(diff.f32).toBeLessThan(1e-4);
    // llama.cpp also rounds the activations to the weights' type in its products (F16, Q8_0 blocks)
    expect(mean.f16).toBeLessThan(5e-3);
    expect(diff.f16).toBeLessThan(5e-2);
    expect(mean.q8_0).toBeLessThan(5e-2);
    expect(diff.q8_0).toBeLessThan(5e-1);
  });

  it("with the LoRA adapter applied by llama.cpp, matches the project's model with its adapter on", async () => {
    const [base, tuned] = [await projectLogprobs(false), await projectLogprobs(true)];
    expect(maxAbsDiff(base, tuned)).toBeGreaterThan(1e-2); // the adapter matters, so this test can fail
    const got = await llamaLogprobs(files.f32, short, files.adapter);
    const d = maxAbsDiff(got, tuned);
    console.log(`tiny preset + LoRA (r 4, alpha 8): max |Δ log p| ${d}; base vs adapter ${maxAbsDiff(base, tuned)}`);
    expect(d).toBeLessThan(1e-4);
  });

  it("cachedModelGguf writes once per model, type and tokenizer", async () => {
    const cacheDir = path.join(tmp, "cache");
    const first = await cachedModelGguf(model, TINY_BASE_DIR, { type: "f16", cacheDir });
    const again = await cachedModelGguf(model, TINY_BASE_DIR, { type: "f16", cacheDir });
    const other = await cachedModelGguf(model, TINY_BASE_DIR, { type: "q8_0", cacheDir });
    expect([first.cached, again.cached, other.cached]).toEqual([false, true, false]);
    expect(again.file).toBe(first.file);
    expect(other.file).not.toBe(first.file);
    expect((await fs.readFile(first.file)).equals(await fs.readFile(files.f16))).toBe(true);
  });
});

// ---------------------------------------------------------------- scripts/export-gguf.ts

const exportGguf = (args: string[]) => runScript("export-gguf.ts", [...args, "--backend", "wasm"]);

withLlama("scripts/export-gguf.ts", () => {
  it("exports base, adapter and merged model that llama.cpp decodes greedily as rolloutGroups does", async () => {
    expect(model, "the tiny preset suite above sets up the model").toBeDefined();
    const adapterDir = path.join(tmp, "adapter");
    await model.saveAdapter(adapterDir); // its adapter_config.json names the tiny preset as the base
    const out = path.join(tmp, "export");
    const r = await exportGguf(["--model_path", adapterDir, "--type", "f32", "--merge", "--output_dir", out]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^FROM \.\/model-f32\.gguf$/m);
    expect(r.stdout).toMatch(/^ADAPTER \.\/adapter\.gguf$/m);
    console.log(r.stderr.trim());
    expect((await fs.readdir(out)).sort()).toEqual(["adapter.gguf", "merged-f32.gguf", "model-f32.gguf"]);

    const messages: ChatMessage[] = [{ role: "user", content: "Sara has 314 stickers and gives away 159. How many are left?" }];
    const [traj] = await rolloutGroups(model, tokenizer, [messages], {
      samplesPerPrompt: 1,
      maxNewTokens: 20,
      maxTurns: 1,
      temperature: 0,
      topP: 1,
      topK: 0,
      rng: new Rng(0),
      tools: [],
      toolsInPrompt: false,
    });
    const want = traj.completionIds;
    expect(want.length).toBeGreaterThan(5);
    const stop = stopTokenIds(tokenizer);
    const withAdapter = await llamaGreedy(
      path.join(out, "model-f32.gguf"),
      traj.promptIds,
      want.length,
      stop,
      path.join(out, "adapter.gguf"),
    );
    const merged = await llamaGreedy(path.join(out, "merged-f32.gguf"), traj.promptIds, want.length, stop);
    console.log(`greedy, ${want.length} tokens: ${JSON.stringify(tokenizer.decode(want))}`);
    expect(withAdapter).toEqual(want);
    expect(merged).toEqual(want);
  });
});

describe("scripts/export-gguf.ts bad input", () => {
  it.each([
    [["--type", "q4"], /^error: --type "q4": expected one of f32, f16, q8_0$/],
    [["--model_path", TINY_BASE_DIR, "--merge"], /^error: --merge: .* has no adapter to merge; pass --adapter <dir>$/],
    [["--model_path", "./no/such/model"], /^error: --model_path \.\/no\/such\/model: no such folder/],
  ])("%j exits 2 with one error line", async (args, message) => {
    const out = path.join(tmp, `bad-${args.join("_").replace(/\W/g, "")}`);
    const r = await exportGguf([...args, "--output_dir", out]);
    expect(r.code, r.stderr).toBe(2);
    const errors = r.stderr.split("\n").filter((l) => l.startsWith("error:"));
    expect(errors, r.stderr).toHaveLength(1);
    expect(errors[0]).toMatch(message);
    expect(r.stderr).not.toMatch(/\n\s+at /);
    await expect(fs.stat(path.join(out, "model-f16.gguf"))).rejects.toThrow();
  });
});
