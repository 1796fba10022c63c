/** The GGUF cache of the llama engine's base: a damaged cached file (cut short by a full disk or a
 *  kill, zeroed by a crash) is found before it is reused, removed and written again; the temp files
 *  of killed writes are removed, another process's write in progress is not. No llama.cpp needed. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawnSync } from "node:child_process";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { initBackend } from "../../src/kernels/backend.ts";
import { checkGguf } from "../../src/model/gguf-check.ts";
import { cachedModelGguf, GGML_TYPE, u32, writeGguf } from "../../src/model/gguf.ts";
import { loadModel } from "../../src/model/load.ts";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { TINY_BASE_DIR } from "../../src/presets/tiny.ts";

let tmp: string;
let model: Qwen2ForCausalLM;
beforeAll(async () => {
  tmp = await fs.mkdtemp(path.join(os.tmpdir(), "gguf-cache-"));
  await initBackend("wasm");
  model = await loadModel(TINY_BASE_DIR);
});
afterAll(async () => {
  model?.dispose();
  await fs.rm(tmp, { recursive: true, force: true });
});

describe("checkGguf", () => {
  let file: string, whole: Buffer;
  beforeAll(async () => {
    file = path.join(tmp, "small.gguf");
    const size = await writeGguf(
      file,
      { "general.architecture": "qwen2", "x.n": u32(3), "x.s": { type: "string[]", value: ["a", "bc"] } },
      [
        { name: "a", shape: [3], type: GGML_TYPE.F32, data: Float32Array.of(1, 2, 3) },
        { name: "c", shape: [2, 32], type: GGML_TYPE.Q8_0, data: new Float32Array(64).fill(0.5) },
      ],
    );
    whole = await fs.readFile(file);
    expect(whole.length).toBe(size);
  });
  const damaged = async (bytes: Buffer) => {
    const f = path.join(tmp, "damaged.gguf");
    await fs.writeFile(f, bytes);
    return checkGguf(f);
  };

  it("passes a whole file", async () => {
    expect(await checkGguf(file)).toBeNull();
  });
  it("names what is wrong with a damaged one", async () => {
    expect(await damaged(whole.subarray(0, whole.length - 1))).toBe(`${whole.length - 1} bytes where its header describes ${whole.length}`);
    expect(await damaged(Buffer.concat([whole, Buffer.alloc(32)]))).toBe(
      `${whole.length + 32} bytes where its header describes ${whole.length}`,
    );
    expect(await damaged(whole.subarray(0, 40))).toBe("its header is cut short (40 bytes)");
    expect(await damaged(Buffer.alloc(whole.length))).toBe("no GGUF magic at its start");
    expect(await damaged(Buffer.alloc(0))).toBe("its header is cut short (0 bytes)");
  });
});

describe("cachedModelGguf", () => {
  it("writes a damaged cached base again, and says what was wrong with it", async () => {
    const cacheDir = path.join(tmp, "cache");
    const first = await cachedModelGguf(model, TINY_BASE_DIR, { type: "f16", cacheDir });
    expect(first).toMatchObject({ cached: false, removedTemps: 0 });
    expect(first.replaced).toBeUndefined();
    const whole = await fs.readFile(first.file);
    await fs.truncate(first.file, Math.floor(whole.length / 2)); // as a full disk leaves it
    const again = await cachedModelGguf(model, TINY_BASE_DIR, { type: "f16", cacheDir });
    expect(again).toMatchObject({
      file: first.file,
      cached: false,
      replaced: `${Math.floor(whole.length / 2)} bytes where its header describes ${whole.length}`,
    });
    expect((await fs.readFile(first.file)).equals(whole)).toBe(true);
    await fs.writeFile(first.file, Buffer.alloc(whole.length)); // zeroed
    expect((await cachedModelGguf(model, TINY_BASE_DIR, { type: "f16", cacheDir })).replaced).toBe("no GGUF magic at its start");
    const third = await cachedModelGguf(model, TINY_BASE_DIR, { type: "f16", cacheDir });
    expect(third).toMatchObject({ cached: true, removedTemps: 0 });
    expect(third.replaced).toBeUndefined();
  });

  it("removes the temp files of killed writes, not those of a write in progress", async () => {
    const cacheDir = path.join(tmp, "temps");
    await fs.mkdir(cacheDir);
    const dead = spawnSync(process.execPath, ["-e", ""]).pid!; // a process that has exited
    const killed = path.join(cacheDir, `x.gguf.${dead}.1700000000000.tmp`);
    const running = path.join(cacheDir, `y.gguf.${process.pid}.1700000000000.tmp`);
    await fs.writeFile(killed, "partial");
    await fs.writeFile(running, "partial");
    const r = await cachedModelGguf(model, TINY_BASE_DIR, { type: "f16", cacheDir });
    expect(r.removedTemps).toBe(1);
    expect((await fs.readdir(cacheDir)).sort()).toEqual([path.basename(r.file), path.basename(running)].sort());
  });
});
