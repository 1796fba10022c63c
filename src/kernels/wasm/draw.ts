/** The wasm kernel of draw.ts (MarlDrawRows): heap.ts heapDrawRows on the logits where they lie,
 *  straight into the output tensor (int32 [B, 4]: per row two float64, the token and its log-prob). */
import type * as tf from "@tensorflow/tfjs";
import { DRAW_ROWS, drawCall } from "../draw.ts";
import { heapDrawRows } from "./heap-ops.ts";
import { heapOffset, registerKernel, type Backend } from "../kernels.ts";

export function registerWasmDraw(): void {
  registerKernel(
    DRAW_ROWS,
    () =>
      ({ inputs, backend, attrs }) => {
        const { logits, temperature, us, B, V } = drawCall(inputs, attrs);
        const b = backend as Backend;
        const out = b.makeOutput([B, 4], "int32") as tf.TensorInfo;
        heapDrawRows(b, heapOffset(b, logits), B, V, temperature, us, heapOffset(b, out));
        return out;
      },
    ["wasm"],
  );
}
