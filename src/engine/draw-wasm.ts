/** The wasm kernel of draw.ts (MarlDrawRows): heap.ts heapDrawRows on the logits where they lie. */
import type * as tf from "@tensorflow/tfjs";
import { DRAW_ROWS, type DrawRowsAttrs } from "./draw.ts";
import { heapDrawRows } from "./heap.ts";
import { heapOffset, registerKernel, type Backend } from "./kernels.ts";

export function registerWasmDraw(): void {
  registerKernel(
    DRAW_ROWS,
    () =>
      ({ inputs, backend, attrs }) => {
        const { logits } = inputs as { logits: tf.TensorInfo };
        const { temperature, us } = attrs as unknown as DrawRowsAttrs;
        const [B, V] = logits.shape;
        if (us.length !== B) throw new Error(`draw: ${us.length} uniforms for ${B} rows of logits`);
        const b = backend as Backend;
        const draws = heapDrawRows(b, heapOffset(b, logits), B, V, temperature, us);
        const out = b.makeOutput([B, 3], "int32") as tf.TensorInfo;
        const o = b.typedArrayFromHeap(out) as Int32Array, // after every allocation
          f = new Float64Array(1),
          w = new Int32Array(f.buffer);
        draws.forEach((d, r) => {
          f[0] = d.logprob;
          o.set([d.token, w[0], w[1]], 3 * r);
        });
        return out;
      },
    ["wasm"],
  );
}
