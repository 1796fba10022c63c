/** Files in and out: config.json, safetensors (lazy reader, writer, shards), the HF cache, PEFT
 *  adapters and full checkpoints — and the one-line errors for bad input. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { promises as fs, readFileSync } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { initBackend } from "../../src/kernels/backend.ts";
import { parseConfig, readConfig } from "../../src/model/config.ts";
import { resolveModelDir } from "../../src/model/model-dir.ts";
import { cacheAsHubWrites, startFakeHub } from "../fixtures/hub/fake-hub.ts";
import { createModel, loadModel } from "../../src/model/load.ts";
import {
  Checkpoint,
  encodeSafetensors,
  readSafetensorsAll,
  SafetensorsFile,
  toFloat32,
  writeSafetensors,
} from "../../src/model/safetensors.ts";

const FIX = path.resolve("test/fixtures/qwen2-tiny");
let tmp: string;
const fixConfig = () => JSON.parse(readFileSync(`${FIX}/config.json`, "utf8"));

/** A copy of the fixture folder with some files replaced. */
async function variant(name: string, files: Record<string, string | Uint8Array> = {}): Promise<string> {
  const dir = path.join(tmp, name);
  await fs.mkdir(dir, { recursive: true });
  for (const f of ["config.json", "model.safetensors"]) await fs.copyFile(path.join(FIX, f), path.join(dir, f));
  for (const [f, data] of Object.entries(files)) await fs.writeFile(path.join(dir, f), data);
  return dir;
}
async function errorOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    return (err as Error).message;
  }
  throw new Error("expected an error");
}

beforeAll(async () => {
  await initBackend("wasm");
  tmp = await fs.mkdtemp(path.join(os.tmpdir(), "model-io-"));
});
afterAll(async () => {
  await fs.rm(tmp, { recursive: true, force: true });
});

describe("config.json", () => {
  it("reads the fixture and accepts rope_parameters.rope_theta", async () => {
    const c = await readConfig(FIX);
    expect(c).toMatchObject({ vocabSize: 256, hiddenSize: 64, headDim: 16, numKeyValueHeads: 2, ropeTheta: 1e6, tieWordEmbeddings: true });
    const j = fixConfig();
    delete j.rope_theta;
    j.rope_parameters = { rope_type: "default", rope_theta: 5e5 };
    expect(parseConfig(j).ropeTheta).toBe(5e5);
  });
  it("rejects what it cannot run, naming the file", async () => {
    expect(await errorOf(readConfig(path.join(tmp, "nowhere")))).toMatch(/nowhere\/config\.json: missing config\.json/);
    const dir = await variant("llama", { "config.json": JSON.stringify({ ...fixConfig(), model_type: "llama" }) });
    expect(await errorOf(readConfig(dir))).toMatch(/llama\/config\.json: unsupported model_type "llama"; accepted: "qwen2"/);
    expect(() => parseConfig({ ...fixConfig(), use_sliding_window: true }, "c.json")).toThrow(
      /c\.json: use_sliding_window is true; only full attention/,
    );
    expect(() => parseConfig({ ...fixConfig(), hidden_size: "64" }, "c.json")).toThrow(
      /c\.json: hidden_size must be a positive integer, got "64"/,
    );
  });
});

describe("safetensors", () => {
  it("widens BF16 and F16 exactly", () => {
    expect(Array.from(toFloat32(new Uint8Array([0x80, 0x3f, 0x00, 0xc0]), "BF16"))).toEqual([1, -2]); // 0x3f80, 0xc000
    expect(Array.from(toFloat32(new Uint8Array([0x00, 0x3c, 0x00, 0x35, 0x01, 0x00]), "F16"))).toEqual([1, 0.3125, 2 ** -24]);
  });
  it("writes deterministic files that round-trip byte for byte, and reads shards lazily", async () => {
    const t = {
      "b.weight": { shape: [2, 3], data: Float32Array.from([1, 2, 3, 4, 5, -6.5]) },
      "a.bias": { shape: [3], data: Float32Array.from([0.1, 0.2, 0.3]) },
    };
    const f1 = path.join(tmp, "one.safetensors");
    await writeSafetensors(f1, t);
    const back = await readSafetensorsAll(f1);
    expect(back["b.weight"].shape).toEqual([2, 3]);
    expect(Array.from(back["b.weight"].data)).toEqual(Array.from(t["b.weight"].data));
    expect(Buffer.from(encodeSafetensors(back)).equals(await fs.readFile(f1))).toBe(true);
    // the fixture adapter (F32, written by the Rust library) re-encodes to the identical file
    const ad = `${FIX}/lora/adapter_model.safetensors`;
    expect(Buffer.from(encodeSafetensors(await readSafetensorsAll(ad))).equals(await fs.readFile(ad))).toBe(true);
    // sharded folder
    const dir = path.join(tmp, "sharded");
    await writeSafetensors(path.join(dir, "model-00001-of-00002.safetensors"), { "a.bias": t["a.bias"] });
    await writeSafetensors(path.join(dir, "model-00002-of-00002.safetensors"), { "b.weight": t["b.weight"] });
    await fs.writeFile(
      path.join(dir, "model.safetensors.index.json"),
      JSON.stringify({ weight_map: { "a.bias": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors" } }),
    );
    const ck = await Checkpoint.open(dir);
    expect(ck.keys().sort()).toEqual(["a.bias", "b.weight"]);
    expect(ck.shape("b.weight")).toEqual([2, 3]);
    expect(Array.from((await ck.read("a.bias")).data)).toEqual(Array.from(t["a.bias"].data));
    await ck.close();
  });
  it("rejects truncated or corrupted headers with the file name", async () => {
    const good = await fs.readFile(`${FIX}/model.safetensors`);
    const cases: [string, Uint8Array, RegExp][] = [
      ["short", good.subarray(0, 5), /short\.safetensors: truncated safetensors header/],
      ["cut", good.subarray(0, 1000), /cut\.safetensors: truncated or corrupted safetensors header \(header length 2672/],
      [
        "junk",
        Buffer.concat([good.subarray(0, 8), Buffer.from("{not json"), good.subarray(17)]),
        /junk\.safetensors: corrupted safetensors header \(not valid JSON\)/,
      ],
      ["tail", good.subarray(0, good.length - 100), /tail\.safetensors: truncated safetensors file \(tensor .* ends at byte/],
    ];
    for (const [name, bytes, re] of cases) {
      const f = path.join(tmp, `${name}.safetensors`);
      await fs.writeFile(f, bytes);
      expect(await errorOf(SafetensorsFile.open(f))).toMatch(re);
    }
    const bad = encodeSafetensors({ x: { shape: [2], data: new Float32Array(2) } });
    const text = Buffer.from(bad).toString("latin1").replace('"shape":[2]', '"shape":[3]');
    const f = path.join(tmp, "shape.safetensors");
    await fs.writeFile(f, Buffer.from(text, "latin1"));
    expect(await errorOf(SafetensorsFile.open(f))).toMatch(
      /shape\.safetensors: corrupted safetensors header \(tensor x: shape \[3\] × F32 is 12 bytes, data_offsets span 8\)/,
    );
  });
});

describe("model folders and the Hugging Face cache", () => {
  it("finds a snapshot through refs/main in a cache laid out as the hub writes it, and explains a failed download", async () => {
    const cache = path.join(tmp, "hub");
    const snap = await cacheAsHubWrites(cache, "models--acme--tiny", "abc123", { "config.json": readFileSync(`${FIX}/config.json`) });
    expect((await fs.lstat(path.join(snap, "config.json"))).isSymbolicLink()).toBe(true);
    const env = { HF_HUB_CACHE: cache, HF_ENDPOINT: "http://127.0.0.1:1" };
    expect(await resolveModelDir("acme/tiny", env)).toBe(snap);
    expect(await resolveModelDir(FIX, env)).toBe(FIX);
    const msg = await errorOf(resolveModelDir("acme/missing", env));
    expect(msg).toContain(`model "acme/missing" not found`);
    expect(msg).toContain(cache);
    expect(msg).toContain("huggingface-cli download acme/missing");
    expect(msg).toMatch(/download failed/);
    expect(msg.split("\n")).toHaveLength(1);
    const offline = await errorOf(resolveModelDir("acme/missing", { ...env, HF_HUB_OFFLINE: "1" }));
    expect(offline).toMatch(/HF_HUB_OFFLINE is set, so no download was tried/);
  });

  it("downloads a model into the cache layout when online (local server standing in for the hub)", async () => {
    const files = ["config.json", "model.safetensors"];
    const hub = await startFakeHub({
      type: "model",
      name: "acme/tiny",
      commit: "c0ffee",
      files: Object.fromEntries(files.map((f) => [f, readFileSync(path.join(FIX, f))])),
      listedOnly: ["README.md"],
    });
    try {
      const cache = path.join(tmp, "hub-download");
      const env = { HF_HUB_CACHE: cache, HF_ENDPOINT: hub.url };
      const snap = await resolveModelDir("acme/tiny", env);
      expect(snap).toBe(path.join(cache, "models--acme--tiny", "snapshots", "c0ffee"));
      expect(await fs.readFile(path.join(cache, "models--acme--tiny", "refs", "main"), "utf8")).toBe("c0ffee");
      for (const f of files) expect((await fs.readFile(path.join(snap, f))).equals(readFileSync(path.join(FIX, f)))).toBe(true);
      expect((await fs.readdir(snap)).sort()).toEqual(files); // README.md not fetched
      for (const f of files) expect((await fs.lstat(path.join(snap, f))).isSymbolicLink()).toBe(true); // links into blobs/, as the hub writes
      expect((await fs.readdir(path.join(cache, "models--acme--tiny", "blobs"))).filter((f) => f.endsWith(".incomplete"))).toEqual([]);
      const [a, b] = [await loadModel(snap), await loadModel(FIX)];
      const [la, lb] = [a.forward([[3, 1, 4]]), b.forward([[3, 1, 4]])];
      expect(Array.from(await la.data())).toEqual(Array.from(await lb.data()));
      tf.dispose([la, lb]);
      a.dispose();
      b.dispose();
      // Second time it comes from the cache: no new request.
      const before = hub.seen.length;
      expect(await resolveModelDir("acme/tiny", env)).toBe(snap);
      expect(hub.seen).toHaveLength(before);
      expect(hub.seen).toEqual([
        "GET /api/models/acme/tiny/revision/main",
        ...files.flatMap((f) => [
          "POST /api/models/acme/tiny/paths-info/c0ffee",
          `GET /acme/tiny/resolve/c0ffee/${f}`,
          `GET /acme/tiny/resolve/c0ffee/${f}`,
        ]),
      ]);
    } finally {
      await hub.close();
    }
  });

  it("names the file and tensor when a checkpoint lacks a tensor or has a wrong shape", async () => {
    const all = await readSafetensorsAll(`${FIX}/model.safetensors`);
    const { ["model.norm.weight"]: _gone, ...rest } = all;
    const missing = await variant("missing", { "model.safetensors": encodeSafetensors(rest) });
    expect(await errorOf(loadModel(missing))).toMatch(
      /missing\/model\.safetensors: tensor model\.norm\.weight missing from the checkpoint/,
    );
    const wide = await variant("wide", { "config.json": JSON.stringify({ ...fixConfig(), intermediate_size: 180 }) });
    expect(await errorOf(loadModel(wide))).toMatch(
      /wide\/model\.safetensors: tensor model\.layers\.0\.mlp\.gate_proj\.weight has shape \[176,64\], config\.json implies \[180,64\]/,
    );
  });
});

describe("PEFT adapters", () => {
  it("load → save gives byte-identical tensors and the adapter_config.json PEFT writes; load + dispose keeps no tensor", async () => {
    (await loadModel(FIX, { adapter: `${FIX}/lora` })).dispose(); // the backend is up and warm
    const before = tf.memory().numTensors;
    (await loadModel(FIX, { adapter: `${FIX}/lora` })).dispose();
    expect(tf.memory().numTensors).toBe(before);
    const m = await loadModel(FIX, { adapter: `${FIX}/lora` });
    const out = path.join(tmp, "adapter-out");
    await m.saveAdapter(out);
    const a = await fs.readFile(`${FIX}/lora/adapter_model.safetensors`);
    expect((await fs.readFile(path.join(out, "adapter_model.safetensors"))).equals(a)).toBe(true);
    const want = JSON.parse(readFileSync(`${FIX}/lora/adapter_config.json`, "utf8"));
    const got = JSON.parse(await fs.readFile(path.join(out, "adapter_config.json"), "utf8"));
    expect(Object.keys(got)).toEqual(Object.keys(want));
    expect({ ...got, base_model_name_or_path: "x" }).toEqual({ ...want, base_model_name_or_path: "x" });
    m.dispose();
  });

  it("rejects adapters whose rank or target modules do not match", async () => {
    const cfg = JSON.parse(readFileSync(`${FIX}/lora/adapter_config.json`, "utf8"));
    const mk = async (name: string, c: object, tensors?: Uint8Array) => {
      const dir = path.join(tmp, name);
      await fs.mkdir(dir, { recursive: true });
      await fs.writeFile(path.join(dir, "adapter_config.json"), JSON.stringify(c));
      await fs.writeFile(
        path.join(dir, "adapter_model.safetensors"),
        tensors ?? (await fs.readFile(`${FIX}/lora/adapter_model.safetensors`)),
      );
      return dir;
    };
    const r8 = await mk("r8", { ...cfg, r: 8 });
    expect(await errorOf(loadModel(FIX, { adapter: r8 }))).toMatch(
      /r8\/adapter_model\.safetensors: .*lora_A\.weight has shape \[4,64\], expected \[8, 64\]/,
    );
    const fewer = await mk("fewer", { ...cfg, target_modules: ["q_proj", "v_proj"] });
    expect(await errorOf(loadModel(FIX, { adapter: fewer }))).toMatch(
      /fewer\/adapter_model\.safetensors: tensor .*(k_proj|o_proj|mlp).* does not match the model or the target modules q_proj, v_proj/,
    );
    const unknown = await mk("unknown", { ...cfg, target_modules: ["q_proj", "qkv"] });
    expect(await errorOf(loadModel(FIX, { adapter: unknown }))).toMatch(/unknown\/adapter_config\.json: unknown LoRA target module "qkv"/);
    const all = await readSafetensorsAll(`${FIX}/lora/adapter_model.safetensors`);
    const k = "base_model.model.model.layers.1.mlp.up_proj.lora_B.weight";
    const { [k]: _gone, ...rest } = all;
    const lacking = await mk("lacking", cfg, encodeSafetensors(rest));
    expect(await errorOf(loadModel(FIX, { adapter: lacking }))).toMatch(
      /lacking\/adapter_model\.safetensors: tensor base_model\.model\.model\.layers\.1\.mlp\.up_proj\.lora_B\.weight missing/,
    );
    expect(
      await errorOf(loadModel(FIX, { adapter: `${FIX}/lora`, lora: { r: 8, alpha: 16, dropout: 0, targetModules: ["q_proj"] } })),
    ).toMatch(/lora\/adapter_config\.json: adapter has r 4 .* but r 8 on q_proj was asked for/);
  });
});

describe("full checkpoints and full training", () => {
  it("savePretrained → loadModel reproduces the logits; the tied head is written once", async () => {
    const ids = [[3, 1, 4, 1, 5, 9]];
    const m = await loadModel(FIX);
    const out = path.join(tmp, "full-out");
    await m.savePretrained(out);
    const keys = Object.keys(await readSafetensorsAll(path.join(out, "model.safetensors")));
    expect(keys).toContain("model.embed_tokens.weight");
    expect(keys).not.toContain("lm_head.weight");
    const m2 = await loadModel(out);
    const [a, b] = [m.forward(ids), m2.forward(ids)];
    expect(Array.from(await b.data())).toEqual(Array.from(await a.data()));
    tf.dispose([a, b]);
    m.dispose();
    m2.dispose();
  });

  it("full mode: every weight trains (embeddings through gather's gradient on wasm), no tensor leak", async () => {
    const cfg = { ...(await readConfig(FIX)), tieWordEmbeddings: false, numHiddenLayers: 1 };
    const m = await createModel(cfg, { trainable: "full", seed: 3 });
    const vars = m.trainableVariables();
    expect(vars.length).toBe(3 + 3 + 4); // embed, head, final norm; 2 norms, the q/k/v bias and 4 (fused) matrices per layer
    const ids = [
        [1, 2, 3, 4, 5, 6],
        [0, 0, 7, 8, 9, 10],
      ],
      mask = [
        [1, 1, 1, 1, 1, 1],
        [0, 0, 1, 1, 1, 1],
      ];
    const opt = tf.train.adam(1e-2);
    const loss = () => tf.neg(tf.mean(m.tokenLogprobs(ids, mask).logprobs)) as tf.Scalar;
    const embedBefore = await m.weights.embedT.f32!.data();
    // warm-up step creates the optimizer's slots; then the count must stay fixed
    const step = async () => {
      const { value, grads } = tf.variableGrads(loss, vars);
      opt.applyGradients(grads as Record<string, tf.Variable>);
      const v = (await value.data())[0];
      tf.dispose([value, grads]);
      return v;
    };
    const l0 = await step();
    const before = tf.memory().numTensors;
    let l = l0;
    for (let i = 0; i < 3; i++) l = await step();
    expect(tf.memory().numTensors).toBe(before);
    expect(l).toBeLessThan(l0);
    const embedAfter = await m.weights.embedT.f32!.data();
    const changed = embedAfter.some((v, i) => v !== embedBefore[i]);
    expect(changed).toBe(true);
    // the embedding gradient (UnsortedSegmentSum registered for wasm) matches the cpu backend's
    const g = tf.tidy(() =>
      tf.grad((e: tf.Tensor) =>
        tf.sum(
          tf.mul(
            tf.gather(e, tf.tensor1d([2, 0, 2], "int32"), 1),
            tf.tensor2d([
              [1, 2, 3],
              [4, 5, 6],
            ]),
          ),
        ),
      )(tf.ones([2, 4])),
    );
    expect(await g.array()).toEqual([
      [2, 0, 4, 0],
      [5, 0, 10, 0],
    ]);
    g.dispose();
    opt.dispose();
    m.dispose();
  });

  it("LoRA training step: only A/B change, tensor count steady", async () => {
    const m = await loadModel(FIX, { lora: { r: 2, alpha: 4, dropout: 0.1, targetModules: ["q_proj", "down_proj"] }, seed: 1 });
    const vars = m.trainableVariables();
    expect(vars.length).toBe(2 * 2 * 2);
    const baseBefore = await m.weights.layers[0].proj.qkv_proj.f32!.data();
    const opt = tf.train.adam(1e-2);
    const ids = [[1, 2, 3, 4, 5, 6]],
      mask = [[1, 1, 1, 1, 1, 1]];
    const step = () => {
      const { value, grads } = tf.variableGrads(
        () => tf.neg(tf.mean(m.tokenLogprobs(ids, mask, { training: true }).logprobs)) as tf.Scalar,
        vars,
      );
      opt.applyGradients(grads as Record<string, tf.Variable>);
      tf.dispose([value, grads]);
    };
    step();
    const before = tf.memory().numTensors;
    const bBefore = await vars[1].data();
    step();
    expect(tf.memory().numTensors).toBe(before);
    expect((await vars[1].data()).some((v, i) => v !== bBefore[i])).toBe(true);
    expect(Array.from(await m.weights.layers[0].proj.qkv_proj.f32!.data())).toEqual(Array.from(baseBefore));
    opt.dispose();
    m.dispose();
  });
});
