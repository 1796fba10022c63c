/** The wasm Add, Sub and Multiply kernels (src/kernels/wasm/elementwise.ts), and Concat and
 *  SplitV at sizes that split over the helper threads (≥ 1 MB), against the cpu backend's kernels, in each
 *  build of the heap module: equal bit for bit, small and large (≥ 64 K elements: split when the
 *  backend has threads), with the broadcasts they take and those they leave to tfjs (int32, both
 *  operands broadcast, a broadcast first operand of Sub); tensor counts stay flat. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { heapHelpersReady, splitJobCount } from "../../src/kernels/wasm/heap.ts";
import { relaxedSimdAvailable, setWasmSimd, wasmSimd, type WasmSimd } from "../../src/kernels/wasm/heap-build.ts";
import { wasmThreads } from "../../src/kernels/wasm/threads.ts";
import { binaryPlan } from "../../src/kernels/wasm/elementwise.ts";
import { Rng } from "../../src/util/rng.ts";

const rng = new Rng(9);
type Input = [Float32Array | Int32Array, number[], "float32" | "int32"];
const input = (shape: number[], dtype: "float32" | "int32"): Input => {
  const n = shape.reduce((p, d) => p * d, 1);
  const v = dtype === "float32" ? new Float32Array(n) : new Int32Array(n);
  for (let i = 0; i < n; i++) v[i] = dtype === "float32" ? rng.normal() * 3 : Math.floor(rng.normal() * 1000);
  return [v, shape, dtype];
};

/** f of tensors made from the inputs on `backend`: the outputs' shapes and bytes. */
async function on(backend: string, inputs: Input[], f: (ts: tf.Tensor[]) => tf.Tensor | tf.Tensor[]) {
  await tf.setBackend(backend);
  return tf.tidy(() => {
    const out = f(inputs.map(([v, s, d]) => tf.tensor(v, s, d)));
    return (Array.isArray(out) ? out : [out]).map((t) => ({
      shape: t.shape,
      bytes: Buffer.from(t.dataSync().slice().buffer as ArrayBuffer),
    }));
  });
}

/** Equal to the cpu backend's result, bit for bit. */
async function expectCpuEqual(label: string, inputs: Input[], f: (ts: tf.Tensor[]) => tf.Tensor | tf.Tensor[]) {
  const want = await on("cpu", inputs, f);
  const got = await on("wasm", inputs, f);
  expect(
    got.map((o) => o.shape),
    label,
  ).toEqual(want.map((o) => o.shape));
  got.forEach((o, i) => expect(o.bytes.equals(want[i].bytes), `${label}: output ${i}`).toBe(true));
}

const builds: WasmSimd[] = ["simd128", ...(relaxedSimdAvailable() ? ["relaxed" as const] : [])];

describe("wasm element-wise kernels", () => {
  let initial: WasmSimd;
  beforeAll(async () => {
    await initBackend("wasm");
    initial = wasmSimd();
  });
  afterAll(async () => {
    setWasmSimd(initial);
    await tf.setBackend("wasm");
  });

  it("plans the broadcasts they take as rows, and leave the others to tfjs", () => {
    expect(binaryPlan([4, 8], [4, 8])).toEqual({ rows: 32, W: 1, rep: 0, bs: 4, scalar: false }); // same shape: one flat run
    expect(binaryPlan([4, 8], [])).toEqual({ rows: 32, W: 1, rep: 0, bs: 0, scalar: true });
    expect(binaryPlan([6, 512], [512])).toEqual({ rows: 6, W: 512, rep: 6, bs: 2048, scalar: false }); // a bias
    expect(binaryPlan([2, 4, 16, 32], [2, 1, 16, 32])).toEqual({ rows: 8, W: 512, rep: 4, bs: 2048, scalar: false }); // a mask over heads
    expect(binaryPlan([2, 16, 4, 64], [2, 16, 1, 64])).toEqual({ rows: 128, W: 64, rep: 4, bs: 256, scalar: false }); // RoPE's tables
    expect(binaryPlan([6, 16], [6, 1])).toEqual({ rows: 6, W: 16, rep: 1, bs: 4, scalar: true }); // one value per row
    expect(binaryPlan([6, 4], [4])).toBeNull(); // rows too short to repay the loop
    expect(binaryPlan([2, 3, 16], [2, 1, 1])).toEqual({ rows: 2, W: 48, rep: 1, bs: 4, scalar: true });
    expect(binaryPlan([3, 16, 8], [3, 1, 8])).toEqual({ rows: 48, W: 8, rep: 16, bs: 32, scalar: false });
    expect(binaryPlan([3, 16, 8], [1, 16, 1])).toBeNull(); // two broadcast runs
  });

  for (const build of builds)
    it(`${build}: Add, Sub and Multiply equal the cpu backend's bit for bit, fallbacks included`, async () => {
      setWasmSimd(build);
      const cases: [number[], number[]][] = [
        [
          [7, 13],
          [7, 13],
        ], // same shape, a tail of W mod 4
        [
          [300, 256],
          [300, 256],
        ], // 76,800 elements: split
        [[300, 256], [256]], // a bias
        [[256], [300, 256]], // the bias first (Sub: tfjs' kernel)
        [
          [8, 4, 40, 64],
          [8, 1, 40, 64],
        ], // attention's mask over heads, split
        [
          [8, 40, 4, 64],
          [8, 40, 1, 64],
        ], // RoPE's tables over heads, split
        [
          [300, 256],
          [300, 1],
        ], // one value per row
        [[300, 256], []], // one value
        [[], [300, 256]],
        [
          [3, 1],
          [1, 16],
        ], // both broadcast: tfjs' kernel
        [[5, 4], [4]], // short rows: tfjs' kernel
        [[0, 16], [16]], // empty
      ];
      for (const [name, f] of [
        ["Add", tf.add],
        ["Sub", tf.sub],
        ["Multiply", tf.mul],
      ] as const)
        for (const dtype of ["float32", "int32"] as const)
          for (const [sa, sb] of dtype === "float32" ? cases : cases.slice(1, 3))
            await expectCpuEqual(`${build} ${name} ${dtype} ${JSON.stringify([sa, sb])}`, [input(sa, dtype), input(sb, dtype)], ([a, b]) =>
              f(a, b),
            );
    });

  for (const build of builds)
    it(`${build}: Concat and SplitV equal the cpu backend's when split`, async () => {
      setWasmSimd(build);
      const a = input([1024, 256], "float32"),
        b = input([1024, 100], "float32");
      await expectCpuEqual(`${build} Concat, split`, [a, b], ([x, y]) => tf.concat([x, y, x], 1));
      await expectCpuEqual(`${build} SplitV, split`, [a, b], ([x, y]) => tf.split(tf.concat([x, y, x], 1), [56, 500, 56], 1));
      await expectCpuEqual(`${build} SplitV, leading axis`, [a], ([x]) => tf.split(x, [100, 924], 0));
    });

  it("split large inputs over the helper threads (where the backend has them), not small ones or tfjs' cases", async () => {
    await tf.setBackend("wasm");
    const splits = (f: () => tf.Tensor | tf.Tensor[]) => {
      const before = splitJobCount();
      tf.tidy(f);
      return splitJobCount() - before;
    };
    const n = wasmThreads() > 1 ? 1 : 0;
    const [x, w, big] = [tf.ones([300, 256]), tf.ones([256]), tf.ones([1024, 256])];
    await heapHelpersReady(tf.backend()); // they start in the background with the heap module
    expect(splits(() => [tf.add(x, w), tf.mul(x, 0.5), tf.sub(x, x)])).toBe(3 * n);
    // copies from 1 MB
    expect(splits(() => tf.split(tf.concat([big, big], 1), [256, 256], 1))).toBe(3 * n);
    expect(splits(() => [tf.concat([x, x], 1), ...tf.split(x, [56, 200], 1)])).toBe(0);
    expect(splits(() => [tf.add(w, w), tf.add(tf.cast(x, "int32"), tf.scalar(1, "int32"))])).toBe(0);
    tf.dispose([x, w, big]);
  });

  it("keep tensor counts flat", async () => {
    await tf.setBackend("wasm");
    const x = tf.ones([300, 256]),
      w = tf.ones([256]);
    const step = () =>
      tf.tidy(() => {
        tf.add(tf.mul(x, w), tf.sub(x, 2));
        tf.split(tf.concat([x, x], 1), 2, 1);
      });
    step();
    const before = tf.memory().numTensors;
    for (let i = 0; i < 3; i++) step();
    expect(tf.memory().numTensors).toBe(before);
    tf.dispose([x, w]);
  });
});
