/** The wasm backend's float32 Add, Sub and Multiply on the heap module (heap-elementwise-code.ts),
 *  split over the helper threads from 64 K elements. tfjs' own kernels run on one thread: a small
 *  training step spent ~50 ms of 680 in them with 2 threads. Each output is the same single float32
 *  operation tfjs does, so results are tfjs' bit for bit and do not depend on the thread count. Left
 *  to tfjs: other dtypes, and broadcasts other than b (or a, for Add and Multiply) repeated over
 *  leading axes, over one run of middle axes ([B, 1, T, S] on [B, H, T, S]) or as one value per row.
 *  Also left: Transpose. Its attention layouts as row copies in the module ([0, 2, 1, 3]: memory.copy
 *  per 256-byte row) ran no faster than tfjs' C++ kernel on one thread and slower split; moving the
 *  last axis element by element ran at half its speed. */
import * as tf from "@tensorflow/tfjs";
import { heapBinary } from "./heap-ops.ts";
import { BINARY_OPS } from "./heap-elementwise-code.ts";
import { heapOffset, replaceKernel, type Backend } from "../kernels.ts";

/** How out = a op b runs on the binary kernel, for a of the output's shape and b of shape `b`: as
 *  rows × W with b's row at ⌊r / rep⌋·bs bytes (rep 0: one flat run), b one value per row group when
 *  `scalar`. null where b's broadcast is none of those, or its rows are too short to repay the loop. */
export function binaryPlan(out: number[], b: number[]): { rows: number; W: number; rep: number; bs: number; scalar: boolean } | null {
  const n = tf.util.sizeFromShape(out),
    m = tf.util.sizeFromShape(b);
  if (m === n) return { rows: n, W: 1, rep: 0, bs: 4, scalar: false };
  if (m === 1) return { rows: n, W: 1, rep: 0, bs: 0, scalar: true };
  if (b.length > out.length) return null;
  const s = [...new Array(out.length - b.length).fill(1), ...b];
  // out as [outer, mid, inner]: b equal to out on inner and outer, 1 on mid
  let d = out.length - 1,
    inner = 1,
    mid = 1;
  for (; d >= 0 && s[d] === out[d]; d--) inner *= out[d];
  for (; d >= 0 && s[d] === 1; d--) mid *= out[d];
  const outer = n / (inner * mid);
  for (; d >= 0 && s[d] === out[d]; d--);
  if (d >= 0) return null;
  const plan =
    inner === 1
      ? { rows: outer, W: mid, rep: 1, bs: 4, scalar: true } // one b value per row
      : { rows: outer * mid, W: inner, rep: mid, bs: 4 * inner, scalar: false };
  return plan.W >= 8 ? plan : null;
}

export function registerWasmElementwise(): void {
  for (const name of ["Add", "Sub", "Multiply"] as const) {
    const code = BINARY_OPS[name];
    replaceKernel(name, "wasm", (fallback) => (args) => {
      let { a, b } = args.inputs as { a: tf.TensorInfo; b: tf.TensorInfo };
      if (a.dtype !== "float32" || b.dtype !== "float32") return fallback(args);
      const shape = tf.backend_util.assertAndGetBroadcastShape(a.shape, b.shape),
        n = tf.util.sizeFromShape(shape);
      // the broadcast operand second (a − b only as it stands)
      if (tf.util.sizeFromShape(a.shape) !== n && name !== "Sub") [a, b] = [b, a];
      const plan = tf.util.sizeFromShape(a.shape) === n ? binaryPlan(shape, b.shape) : null;
      if (!plan) return fallback(args);
      const be = args.backend as Backend,
        out = be.makeOutput(shape, "float32") as tf.TensorInfo;
      if (n > 0)
        heapBinary(
          be,
          code + (plan.scalar ? 3 : 0),
          heapOffset(be, a),
          heapOffset(be, b),
          heapOffset(be, out),
          plan.rows,
          plan.W,
          plan.rep,
          plan.bs,
        );
      return out;
    });
  }
}
