import { describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import {
  CheckpointSchedule,
  configDiff,
  configHash,
  listCheckpoints,
  loadCheckpoint,
  saveCheckpoint,
  type OptimizerState,
  type SafetensorsIo,
  type TrainerState,
} from "../../src/trainer/checkpoint.ts";
import { Rng } from "../../src/util/rng.ts";
import { UsageError } from "../../src/util/errors.ts";
import { encodeSafetensors } from "../../src/model/safetensors.ts";
import { randomBytes } from "node:crypto";

const tmp = () => fs.mkdtemp(path.join(os.tmpdir(), "marl-ckpt-"));

function state(step: number, extra: Partial<TrainerState> = {}): TrainerState {
  return {
    global_step: step,
    epoch: step / 10,
    data_position: step * 4,
    config_hash: configHash({ lr: 1e-5 }),
    config: { lr: 1e-5 },
    log_history: [{ step, loss: 1 / step }],
    ...extra,
  };
}

function optimizer(seed: number): OptimizerState {
  const r = new Rng(seed);
  const m = new Float32Array(12).map(() => r.normal() * 1e-3);
  m[0] = -0;
  m[1] = 1.4e-45;
  m[2] = 3.4e38; // sign of zero, smallest denormal, near max
  return {
    "m/lora_A": { shape: [3, 4], data: m },
    "v/lora_A": { shape: [3, 4], data: m.map((x) => x * x) },
    step: { shape: [], data: new Float32Array([7]) },
  };
}

const saveModel = (tag: string) => async (dir: string) => {
  await fs.writeFile(path.join(dir, "adapter_config.json"), JSON.stringify({ r: 8, tag }));
  await fs.writeFile(path.join(dir, "adapter_model.safetensors"), tag);
};

function bits(a: Float32Array): number[] {
  return Array.from(new Uint32Array(a.buffer, a.byteOffset, a.length));
}

describe("checkpoint", () => {
  it("round-trips trainer state and optimizer tensors bit for bit", async () => {
    const run = await tmp();
    const opt = optimizer(1);
    const dir = await saveCheckpoint(run, { saveModel: saveModel("a"), state: state(10), optimizerState: opt });
    expect(path.basename(dir)).toBe("checkpoint-10");
    expect((await fs.readFile(path.join(run, "latest"), "utf8")).trim()).toBe("checkpoint-10");

    for (const where of [run, dir]) {
      const got = await loadCheckpoint(where);
      expect(got.dir).toBe(dir);
      expect(got.state).toEqual(state(10));
      expect(got.modelKind).toBe("adapter");
      expect(Object.keys(got.optimizerState!).sort()).toEqual(Object.keys(opt).sort());
      for (const k of Object.keys(opt)) {
        expect(got.optimizerState![k].shape).toEqual(opt[k].shape);
        expect(bits(got.optimizerState![k].data)).toEqual(bits(opt[k].data));
      }
    }
    expect(Object.is((await loadCheckpoint(run)).optimizerState!["m/lora_A"].data[0], -0)).toBe(true);
  });

  it("a crash while writing leaves the previous checkpoint and latest intact", async () => {
    const run = await tmp();
    await saveCheckpoint(run, { saveModel: saveModel("a"), state: state(5), optimizerState: optimizer(1) });
    // the model writer dies half-way
    await expect(
      saveCheckpoint(run, {
        saveModel: async (d) => {
          await fs.writeFile(path.join(d, "adapter_config.json"), "{");
          throw new Error("disk full");
        },
        state: state(10),
        optimizerState: optimizer(2),
      }),
    ).rejects.toThrow("disk full");
    // the optimizer writer dies
    const failing: SafetensorsIo = {
      write: async () => {
        throw new Error("ENOSPC");
      },
      read: async () => ({}),
    };
    await expect(
      saveCheckpoint(run, { saveModel: saveModel("b"), state: state(10), optimizerState: optimizer(2), io: failing }),
    ).rejects.toThrow("ENOSPC");
    // re-saving the same step that fails must not lose the existing folder either
    await expect(
      saveCheckpoint(run, {
        saveModel: async () => {
          throw new Error("again");
        },
        state: state(5),
      }),
    ).rejects.toThrow("again");

    expect((await fs.readdir(run)).sort()).toEqual(["checkpoint-5", "latest"]);
    const got = await loadCheckpoint(run);
    expect(got.state.global_step).toBe(5);
    expect(bits(got.optimizerState!["v/lora_A"].data)).toEqual(bits(optimizer(1)["v/lora_A"].data));
    expect(JSON.parse(await fs.readFile(path.join(got.dir, "adapter_config.json"), "utf8")).tag).toBe("a");
  });

  it("keeps only the newest saveTotalLimit checkpoints and cleans crash leftovers", async () => {
    const run = await tmp();
    await fs.mkdir(path.join(run, ".checkpoint-3.999.1.tmp")); // left by a killed process
    for (const s of [2, 4, 6, 8]) await saveCheckpoint(run, { saveModel: saveModel(`s${s}`), state: state(s), saveTotalLimit: 2 });
    expect((await listCheckpoints(run)).map((c) => c.step)).toEqual([6, 8]);
    expect((await fs.readdir(run)).sort()).toEqual(["checkpoint-6", "checkpoint-8", "latest"]);
    const got = await loadCheckpoint(run);
    expect(got.state.global_step).toBe(8);
    expect(got.optimizerState).toBeUndefined();
  });

  it("gives clear errors for missing and corrupt pieces", async () => {
    const run = await tmp();
    await expect(loadCheckpoint(path.join(run, "nope"))).rejects.toThrow(/not found: expected a run folder or a checkpoint-<step> folder/);
    await expect(loadCheckpoint(run)).rejects.toThrow(/holds no checkpoint/);
    const dir = await saveCheckpoint(run, { saveModel: saveModel("a"), state: state(3), optimizerState: optimizer(1) });

    await fs.writeFile(path.join(run, "latest"), "checkpoint-99\n");
    await expect(loadCheckpoint(run)).rejects.toThrow(/points to checkpoint-99, which is missing/);
    await fs.writeFile(path.join(run, "latest"), "../../etc\n");
    await expect(loadCheckpoint(run)).rejects.toThrow(/expected a checkpoint-<step> folder name/);
    await fs.rm(path.join(run, "latest"));
    expect((await loadCheckpoint(run)).dir).toBe(dir); // falls back to the newest folder

    await fs.writeFile(path.join(dir, "optimizer.safetensors"), "garbage");
    await expect(loadCheckpoint(dir)).rejects.toThrow(/is corrupt: optimizer.safetensors/);
    await fs.writeFile(path.join(dir, "trainer_state.json"), '{"global_step": 3');
    await expect(loadCheckpoint(dir)).rejects.toThrow(/is corrupt: trainer_state.json is not valid JSON/);
    await fs.writeFile(path.join(dir, "trainer_state.json"), JSON.stringify({ ...state(3), global_step: -1 }));
    await expect(loadCheckpoint(dir)).rejects.toThrow(/global_step -1: expected a whole number >= 0/);
    await fs.rm(path.join(dir, "trainer_state.json"));
    await expect(loadCheckpoint(run)).rejects.toThrow(/is incomplete: trainer_state.json is missing/);
  });
});

describe("a corrupt newest checkpoint", () => {
  /** A PEFT-shaped model part with a real safetensors file. */
  const realModel = (seed: number) => async (dir: string) => {
    await fs.writeFile(path.join(dir, "adapter_config.json"), JSON.stringify({ r: 2 }));
    await fs.writeFile(path.join(dir, "adapter_model.safetensors"), encodeSafetensors(optimizer(seed), { format: "pt" }));
  };
  const runWithTwo = async () => {
    const run = await tmp();
    const first = await saveCheckpoint(run, { saveModel: realModel(1), state: state(1), optimizerState: optimizer(1) });
    const second = await saveCheckpoint(run, { saveModel: realModel(2), state: state(2), optimizerState: optimizer(2) });
    return { run, first, second };
  };

  it("--resume falls back to the newest intact one, saying which and why", async () => {
    const damage: Array<[string, (dir: string) => Promise<void>, RegExp]> = [
      [
        "truncated weights",
        async (d) => fs.truncate(path.join(d, "adapter_model.safetensors"), 100),
        /adapter_model\.safetensors: truncated/,
      ],
      ["a config that is not JSON", (d) => fs.writeFile(path.join(d, "adapter_config.json"), "{ r: 2"), /adapter_config\.json/],
      [
        "random bytes as weights",
        (d) => fs.writeFile(path.join(d, "adapter_model.safetensors"), randomBytes(4096)),
        /adapter_model\.safetensors: .*corrupted/,
      ],
      [
        "a cut trainer state",
        (d) => fs.writeFile(path.join(d, "trainer_state.json"), '{"global_step": 2'),
        /trainer_state\.json is not valid JSON/,
      ],
      ["garbled optimizer state", (d) => fs.writeFile(path.join(d, "optimizer.safetensors"), "garbage"), /optimizer\.safetensors/],
    ];
    for (const [what, harm, why] of damage) {
      const { run, first, second } = await runWithTwo();
      await harm(second);
      const notes: string[] = [];
      const got = await loadCheckpoint(run, { checkModel: true, note: (l) => notes.push(l) });
      expect([what, got.dir, got.state.global_step]).toEqual([what, first, 1]);
      expect(notes).toHaveLength(1);
      expect(notes[0]).toMatch(/^warning: checkpoint .*checkpoint-2 is (corrupt|incomplete): /);
      expect(notes[0]).toMatch(why);
      expect(notes[0]).toMatch(/; continuing from checkpoint-1, the newest intact checkpoint$/);
    }
  });

  it("with no intact one left, or named directly, is an error naming it (a usage error: exit 2)", async () => {
    const { run, first, second } = await runWithTwo();
    await fs.truncate(path.join(second, "adapter_model.safetensors"), 100);
    await expect(loadCheckpoint(second, { checkModel: true })).rejects.toThrow(/checkpoint-2 is corrupt: adapter_model\.safetensors/);
    await fs.writeFile(path.join(first, "trainer_state.json"), "");
    const err = await loadCheckpoint(run, { checkModel: true, note: () => {} }).catch((e: Error) => e);
    expect(err).toBeInstanceOf(UsageError);
    expect((err as Error).message).toMatch(/checkpoint-2 is corrupt: adapter_model\.safetensors/);
  });
});

describe("CheckpointSchedule and config identity", () => {
  it("is due every N steps and at the end", () => {
    const s = new CheckpointSchedule(5, 12);
    expect([0, 1, 4, 5, 6, 10, 11, 12].filter((i) => s.due(i))).toEqual([5, 10, 12]);
    expect([1, 2, 3].filter((i) => new CheckpointSchedule(0, 3).due(i))).toEqual([3]);
    expect(() => new CheckpointSchedule(-1)).toThrow(/save_steps -1/);
  });

  it("hashes configs independent of key order and lists changed keys", () => {
    expect(configHash({ a: 1, b: { c: 2, d: [1, 2] } })).toBe(configHash({ b: { d: [1, 2], c: 2 }, a: 1 }));
    expect(configHash({ a: 1 })).not.toBe(configHash({ a: 2 }));
    expect(configHash({ a: 1 })).toMatch(/^[0-9a-f]{16}$/);
    expect(configDiff({ lr: 1, steps: 10, x: { y: 1 } }, { lr: 2, steps: 10, x: { y: 1 }, extra: true })).toEqual(["extra", "lr"]);
  });
});

describe("resume", () => {
  // A stand-in training loop: a parameter and Adam-like moments updated from an Rng stream.
  function step(p: Float32Array, m: Float32Array, rng: Rng): void {
    for (let i = 0; i < p.length; i++) {
      const g = rng.normal();
      m[i] = 0.9 * m[i] + 0.1 * g;
      p[i] -= 0.01 * m[i];
    }
  }

  it("continues bit-identically from a saved checkpoint", async () => {
    const run = await tmp();
    const rng = new Rng(11);
    const p = new Float32Array(5),
      m = new Float32Array(5);
    for (let s = 1; s <= 6; s++) {
      step(p, m, rng);
      if (s === 3)
        await saveCheckpoint(run, {
          saveModel: async (d) => fs.writeFile(path.join(d, "params.json"), JSON.stringify(Array.from(p))),
          state: state(3, { extra: { sampler: rng.getState() } }),
          optimizerState: { m: { shape: [5], data: m.slice() }, p: { shape: [5], data: p.slice() } },
        });
    }
    const got = await loadCheckpoint(run);
    const rng2 = new Rng(0);
    rng2.setState(got.state.extra!.sampler as number);
    const p2 = got.optimizerState!.p.data,
      m2 = got.optimizerState!.m.data;
    for (let s = got.state.global_step + 1; s <= 6; s++) step(p2, m2, rng2);
    expect(bits(p2)).toEqual(bits(p));
    expect(bits(m2)).toEqual(bits(m));
  });
});
