/** The wasm backend's Concat for numeric tensors: one strided row copy per input (memory.copy in the
 *  module of heap-code.ts; the rows split over the helper threads from 1 MB) instead of tfjs' JS
 *  loop, which makes two typed-array views per row and input. A decode step appends a position to
 *  every layer's keys and values this way: small config, batch 8, ~150 cached positions, 12 Concats
 *  took 1.9 of a step's 5.8 ms. Strings still go to tfjs'
 *  kernel (and complex64, which the project does not use). */
import * as tf from "@tensorflow/tfjs";
import { heapBlocks } from "./heap-ops.ts";
import { heapOffset, replaceKernel, type Backend } from "../kernels.ts";

export function registerWasmConcat(): void {
  replaceKernel("Concat", "wasm", (fallback) => (args) => {
    const inputs = args.inputs as unknown as tf.TensorInfo[];
    const dtype = inputs[0]?.dtype;
    if (dtype !== "float32" && dtype !== "int32" && dtype !== "bool") return fallback(args);
    const e = tf.util.bytesPerElement(dtype); // bool is one byte on the heap
    const axis = tf.util.parseAxisParam((args.attrs as { axis: number | number[] }).axis, inputs[0].shape)[0];
    tf.backend_util.assertParamsConsistent(
      inputs.map((t) => t.shape),
      axis,
    );
    const outShape = tf.backend_util.computeOutShape(
      inputs.map((t) => t.shape),
      axis,
    );
    const backend = args.backend as Backend;
    const out = backend.makeOutput(outShape, inputs[0].dtype) as tf.TensorInfo;
    const rows = outShape.slice(0, axis).reduce((p, d) => p * d, 1);
    const width = outShape.slice(axis).reduce((p, d) => p * d, 1);
    if (rows * width === 0) return out;
    const pOut = heapOffset(backend, out);
    const blocks: number[][] = [];
    let col = 0;
    for (const t of inputs) {
      const inner = t.shape.slice(axis).reduce((p, d) => p * d, 1);
      if (inner > 0) blocks.push([heapOffset(backend, t), pOut + e * col, e * inner, e * inner]);
      col += inner;
    }
    heapBlocks(backend, blocks, rows, e * width, e * rows * width);
    return out;
  });
}
