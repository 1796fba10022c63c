/** Dequantization as one kernel on the CPU backends (wasm, cpu): unpacks int32 words of int8 or NF4
 *  codes and scales them. On wasm it runs in the heap module (heap-dequant-code.ts: four columns at a
 *  time, packed rows split over the helper threads); the JS pass here (dequantizeInto) is the cpu
 *  backend's kernel and the reference the heap kernel matches bit for bit. On wasm that JS pass cost
 *  ~6 ns per weight, ~50 s of a 0.5B NF4 GRPO step of ~19 min; the heap kernel at 0.5B's shapes, on a
 *  loaded 2-core machine: NF4 1.1–1.5 ns (1 thread), 0.8–1.2 (2); int8 0.6–1.1, 0.5–0.9. The same
 *  result through tfjs ops needs BitwiseAnd/Cast/Mod per field and a GatherV2 into the code book, and
 *  wasm's GatherV2 alone cost ~300 ns per weight (an NF4 decode step of the tiny preset's model spent
 *  263 of 339 ms in it).
 *  Other backends keep the op-based path in quant.ts. Frozen weights only: no gradient is defined. */
import * as tf from "@tensorflow/tfjs";
import { heapOffset, once, registerKernel } from "./kernels.ts";
import type { heapDequantize } from "./wasm/heap-ops.ts";

export const DEQUANTIZE = "MarlDequantize";

export interface DequantizeAttrs {
  kind: "int8" | "nf4";
  inDim: number; // rows of the output (the padded rows are dropped)
  table: number[]; // nf4: the 16 code values
  block: number; // nf4: rows per absmax block
}

/** packed: int32 [rowsPad/per, n]; scales: int8 [1, n] or nf4 [rowsPad/block, n] → f32 [inDim, n]. */
export function dequantizeInto(
  out: Float32Array,
  packed: Int32Array,
  scales: Float32Array,
  rowsPerField: number,
  n: number,
  a: DequantizeAttrs,
): void {
  const bits = a.kind === "int8" ? 8 : 4;
  const per = 32 / bits,
    field = (1 << bits) - 1;
  const table = Float32Array.from(a.table);
  for (let k = 0; k < per; k++) {
    const shift = bits * k;
    for (let i = 0; i < rowsPerField; i++) {
      const r = k * rowsPerField + i;
      if (r >= a.inDim) break;
      const src = i * n,
        dst = r * n;
      if (a.kind === "int8") {
        for (let j = 0; j < n; j++) out[dst + j] = (((packed[src + j] >>> shift) & field) - 128) * scales[j];
      } else {
        const s = Math.floor(r / a.block) * n;
        for (let j = 0; j < n; j++) out[dst + j] = table[(packed[src + j] >>> shift) & field] * scales[s + j];
      }
    }
  }
}

/** The heap module's kernel, handed over by backend.ts with the other wasm kernels (this file imports
 *  no backend: quantized models load under any, and tfjs-backend-wasm registers itself on import). */
let onHeap: typeof heapDequantize | null = null;
export function useHeapDequantize(f: typeof heapDequantize): void {
  onHeap = f;
}

/** wasm: the heap module's kernel on the tensors' heap offsets (dequantizeInto on heap views until
 *  useHeapDequantize); cpu: dequantizeInto on the arrays it holds (views taken after the output is
 *  allocated, since an allocation can grow and move a heap). */
export const registerDequantizeKernels = once(() => {
  registerKernel(DEQUANTIZE, (io, backendName) => ({ inputs, backend, attrs }) => {
    const { packed, scales } = inputs as { packed: tf.TensorInfo; scales: tf.TensorInfo };
    const a = attrs as unknown as DequantizeAttrs;
    const [P, n] = packed.shape;
    const out = io.output(backend, [a.inDim, n]);
    if (backendName === "wasm" && onHeap) {
      if (a.inDim * n > 0)
        onHeap(
          backend,
          a.kind,
          heapOffset(backend, packed),
          heapOffset(backend, scales),
          heapOffset(backend, out),
          P,
          n,
          a.inDim,
          a.table,
          a.block,
        );
    } else dequantizeInto(io.view(backend, out), io.view(backend, packed), io.view(backend, scales), P, n, a);
    return out;
  });
});

/** Whether the current backend has the kernel (else quant.ts uses tfjs ops). */
export function hasDequantizeKernel(): boolean {
  registerDequantizeKernels();
  return tf.getKernel(DEQUANTIZE, tf.getBackend()) !== undefined;
}
