/** A corrupt model is bad input, like a bad flag: one line naming the file and what is wrong, exit 2
 *  (not 1, the exit of a bug), and nothing written. Truncated weights, a config.json that is not JSON,
 *  random bytes as safetensors. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { randomBytes } from "node:crypto";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { TINY_BASE_DIR } from "../../src/presets/tiny.ts";
import { runScript } from "./helpers/run-script.ts";

let root: string;
beforeAll(async () => {
  root = await fs.mkdtemp(path.join(os.tmpdir(), "marl-corrupt-"));
});
afterAll(async () => {
  await fs.rm(root, { recursive: true, force: true });
});

/** A copy of the tiny base with one file replaced. */
async function broken(name: string, file: string, bytes: Buffer): Promise<string> {
  const dir = path.join(root, name);
  await fs.cp(TINY_BASE_DIR, dir, { recursive: true });
  await fs.writeFile(path.join(dir, file), bytes);
  return dir;
}

describe("a corrupt model", () => {
  it("exits 2 with one line naming the file, and writes nothing", async () => {
    const weights = await fs.readFile(path.join(TINY_BASE_DIR, "model.safetensors"));
    const cases: Array<[string, RegExp]> = [
      [await broken("truncated", "model.safetensors", weights.subarray(0, 100_000)), /model\.safetensors: truncated safetensors file/],
      [await broken("config", "config.json", Buffer.from("{ not json")), /config\.json: not valid JSON/],
      [
        await broken("random", "model.safetensors", randomBytes(50_000)),
        /model\.safetensors: (truncated or )?corrupted safetensors header/,
      ],
    ];
    for (const [dir, message] of cases) {
      const out = path.join(root, `eval-${path.basename(dir)}`);
      const args = ["--model_path", dir, "--dataset", "synthetic", "--max_samples", "2", "--output_dir", out, "--backend", "wasm"];
      const r = await runScript("eval.ts", args);
      const errors = r.stderr.split("\n").filter((l) => l.startsWith("error:"));
      expect([dir, r.code], r.stderr).toEqual([dir, 2]);
      expect(errors).toHaveLength(1);
      expect(errors[0]).toMatch(message);
      await expect(fs.stat(out)).rejects.toThrow();
    }
  });
});
