/** The wasm kernels src/kernels/backend.ts installs: Slice/SplitV reading the heap in place, and
 *  UnsortedSegmentSum (gather's gradient). Checked against values computed on the host. */
import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";

/** Host reference: slice of a row-major array. */
function hostSlice(data: number[], shape: number[], begin: number[], size: number[]): number[] {
  const strides = shape.map((_, i) => shape.slice(i + 1).reduce((p, d) => p * d, 1));
  const out: number[] = [];
  const rec = (d: number, off: number) => {
    if (d === shape.length) return void out.push(data[off]);
    for (let i = 0; i < size[d]; i++) rec(d + 1, off + (begin[d] + i) * strides[d]);
  };
  rec(0, 0);
  return out;
}

describe("wasm kernels from src/kernels/backend.ts", () => {
  beforeAll(async () => {
    expect(await initBackend("wasm")).toBe("wasm");
    expect(await initBackend("wasm")).toBe("wasm"); // idempotent
  });

  it("an allocation the 4 GiB heap cannot hold throws a clear error, and the heap keeps working", async () => {
    // Unchecked, tfjs gave such a tensor offset 0 and its kernel wrote over the module's static data:
    // the next allocation spun forever on malloc's overwritten lock.
    const before = tf.memory().numTensors;
    expect(() => tf.zeros([2 ** 30 - 2 ** 14])).toThrow(/^wasm heap out of memory: 4095\.9 MB more did not fit .*--micro_batch_size/);
    expect(tf.memory().numTensors).toBe(before);
    const y = tf.add(tf.tensor1d([1, 2, 3]), 1);
    expect(Array.from(await y.data())).toEqual([2, 3, 4]);
    y.dispose();
  });

  it("Slice matches the host for contiguous and strided slices of rank 1–5", async () => {
    const cases: [number[], number[], number[]][] = [
      [[10], [3], [4]],
      [
        [4, 6],
        [1, 2],
        [2, 3],
      ],
      [
        [3, 4, 5],
        [1, 0, 2],
        [2, 4, 3],
      ],
      [
        [2, 3, 4, 6],
        [0, 1, 1, 3],
        [2, 2, 3, 3],
      ],
      [
        [2, 2, 3, 2, 4],
        [1, 0, 1, 1, 1],
        [1, 2, 2, 1, 2],
      ],
      [
        [4, 5],
        [0, 0],
        [4, 5],
      ],
      [
        [3, 4, 5],
        [0, 0, 2],
        [3, 4, 3],
      ], // whole leading axes: one strided copy
      [
        [2, 6, 4],
        [0, 2, 0],
        [2, 3, 4],
      ], // partial middle axis, whole inner runs
      [
        [2, 3, 4, 2],
        [0, 0, 1, 0],
        [2, 3, 2, 2],
      ],
    ];
    for (const [shape, begin, size] of cases) {
      const n = shape.reduce((p, d) => p * d, 1);
      const data = Array.from({ length: n }, (_, i) => i * 0.5 - 3);
      const x = tf.tensor(data, shape);
      const y = tf.slice(x, begin, size);
      expect(y.shape).toEqual(size);
      expect(Array.from(await y.data())).toEqual(hostSlice(data, shape, begin, size));
      const xi = tf.tensor(
        data.map((v) => Math.round(v * 2)),
        shape,
        "int32",
      );
      const yi = tf.slice(xi, begin, size);
      expect(Array.from(await yi.data())).toEqual(
        hostSlice(
          data.map((v) => Math.round(v * 2)),
          shape,
          begin,
          size,
        ),
      );
      const xb = tf.tensor(
        data.map((v) => v > 0),
        shape,
        "bool",
      );
      const yb = tf.slice(xb, begin, size);
      expect(Array.from(await yb.data())).toEqual(
        hostSlice(
          data.map((v) => (v > 0 ? 1 : 0)),
          shape,
          begin,
          size,
        ),
      );
      tf.dispose([x, y, xi, yi, xb, yb]);
    }
  });

  it("split (SplitV) matches the host along every axis, with equal and given sizes", async () => {
    const shape = [2, 6, 4],
      data = Array.from({ length: 48 }, (_, i) => i);
    const x = tf.tensor(data, shape);
    for (const [axis, sizes] of [
      [0, [1, 1]],
      [1, [2, 3, 1]],
      [2, [2, 2]],
      [-1, [1, 3]],
    ] as [number, number[]][]) {
      const parts = tf.split(x, sizes, axis);
      const ax = axis < 0 ? axis + 3 : axis;
      let start = 0;
      for (let i = 0; i < sizes.length; i++) {
        const begin = [0, 0, 0],
          size = shape.slice();
        begin[ax] = start;
        size[ax] = sizes[i];
        expect(Array.from(await parts[i].data())).toEqual(hostSlice(data, shape, begin, size));
        start += sizes[i];
      }
      tf.dispose(parts);
    }
    x.dispose();
  });

  it("UnsortedSegmentSum sums rows into segments (the gradient of gather)", async () => {
    const x = tf.tensor2d([
      [1, 2],
      [3, 4],
      [5, 6],
    ]);
    const s = tf.unsortedSegmentSum(x, tf.tensor1d([2, 0, 2], "int32"), 3);
    expect(await s.array()).toEqual([
      [3, 4],
      [0, 0],
      [6, 8],
    ]);
    tf.dispose([x, s]);
  });

  it("Identity (tf.clone, what a gradient tape saves) shares the heap data; each tensor outlives the other's disposal", async () => {
    const b = tf.backend() as any;
    const bytes = tf.memory().numBytes;
    const x = tf.tensor2d([
      [1, 2, 3],
      [4, 5, 6],
    ]);
    const y = tf.clone(x);
    expect(b.getMemoryOffset(y.dataId)).toBe(b.getMemoryOffset(x.dataId));
    x.dispose();
    expect(await y.array()).toEqual([
      [1, 2, 3],
      [4, 5, 6],
    ]);
    const z = tf.add(y, 1); // a new tensor gets its own memory
    expect(b.getMemoryOffset(z.dataId)).not.toBe(b.getMemoryOffset(y.dataId));
    y.dispose();
    expect(await z.array()).toEqual([
      [2, 3, 4],
      [5, 6, 7],
    ]);
    z.dispose();
    expect(tf.memory().numBytes).toBe(bytes);
    const i0 = tf.tensor1d([7, 8], "int32"),
      c0 = tf.tensor1d(["a", "b"], "string");
    const i = tf.clone(i0),
      c = tf.clone(c0);
    tf.dispose([i0, c0]);
    expect([await i.array(), await c.array()]).toEqual([
      [7, 8],
      ["a", "b"],
    ]);
    tf.dispose([i, c]);
  });
});
