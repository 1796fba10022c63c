/** The wasm backend's float32 Add, Sub and Multiply, and its Transpose of 4-byte elements that keeps
 *  the last axis, on the heap module (heap-elementwise-code.ts; a Transpose is row copies), split
 *  over the helper threads from 64 K elements (copies from 1 MB). tfjs' own
 *  kernels run on one thread: a small training step spent ~50 ms of 680 in them with 2 threads.
 *  Each output is the same single float32 operation tfjs does, so results are tfjs' bit for bit and
 *  do not depend on the thread count. Left to tfjs: other dtypes, and broadcasts other than b (or a,
 *  for Add and Multiply) repeated over leading axes, over one run of middle axes ([B, 1, T, S] on
 *  [B, H, T, S]) or as one value per row; transposes that move the last axis or whose blocks are too
 *  small to repay the calls. */
import * as tf from "@tensorflow/tfjs";
import { heapBinary, heapBlocks } from "./heap.ts";
import { BINARY_OPS } from "./heap-elementwise-code.ts";
import { heapOffset, replaceKernel, type Backend } from "./kernels.ts";

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

/** Elements per block below which a transpose stays with tfjs (one memory.copy per row of a block). */
const MIN_BLOCK = 64;

/** Transpose of x (shape) by perm as blocks of row copies, in bytes from x's and the output's offsets:
 *  { R, stride, blocks: [src, dst, srs, rowBytes] }, or null for tfjs' kernel. Axes of size 1 are
 *  dropped and input axes that stay neighbours are merged first; the input's last axis must stay last
 *  (rows of ≥ 4 elements), so [B, T, H, hd] by [0, 2, 1, 3] is B·H blocks of T rows of hd floats.
 *  A transpose that moves the last axis ([0, 2, 3, 1], the keys) stays with tfjs: an element-by-element
 *  kernel here ran at half the speed of its C++ one. */
export function transposePlan(shape: number[], perm: number[]): { R: number; stride: number; blocks: number[][] } | null {
  // drop size-1 axes, then merge runs of input axes that stay in order in the output
  const keep = shape.map((d, i) => (d === 1 ? -1 : i)).filter((i) => i >= 0);
  const p0 = perm.filter((a) => shape[a] !== 1).map((a) => keep.indexOf(a));
  const groups: number[][] = [];
  for (const a of p0) {
    const g = groups[groups.length - 1];
    if (g && g[g.length - 1] === a - 1) g.push(a);
    else groups.push([a]);
  }
  const order = [...groups].sort((x, y) => x[0] - y[0]); // the merged input axes, in input order
  const xs = order.map((g) => g.reduce((p, a) => p * shape[keep[a]], 1));
  const p = groups.map((g) => order.indexOf(g));
  const k = xs.length,
    n = xs.reduce((a, b) => a * b, 1);
  if (k <= 1) return { R: 1, stride: 4 * n, blocks: [[0, 0, 4 * n, 4 * n]] };
  const st = tf.util.computeStrides(xs).concat(1),
    os = p.map((a) => xs[a]),
    ot = tf.util.computeStrides(os).concat(1);
  // a block: the output's last two axes, rows of the (kept) last axis read at the input's stride
  const outer = os.slice(0, k - 2),
    count = outer.reduce((c, d) => c * d, 1);
  if (p[k - 1] !== k - 1 || n / count < MIN_BLOCK || xs[k - 1] < 4) return null;
  const blocks: number[][] = [];
  const idx = new Array(k - 2).fill(0);
  for (let c = 0; c < count; c++) {
    let src = 0,
      dst = 0;
    for (let i = 0; i < k - 2; i++) ((src += 4 * idx[i] * st[p[i]]), (dst += 4 * idx[i] * ot[i]));
    blocks.push([src, dst, 4 * st[p[k - 2]], 4 * xs[k - 1]]);
    for (let i = k - 3; i >= 0; i--) {
      if (++idx[i] < outer[i]) break;
      idx[i] = 0;
    }
  }
  return { R: os[k - 2], stride: 4 * xs[k - 1], blocks };
}

export function registerWasmTranspose(): void {
  replaceKernel("Transpose", "wasm", (fallback) => (args) => {
    const x = (args.inputs as { x: tf.TensorInfo }).x;
    const perm = (args.attrs as { perm: number[] }).perm;
    if (x.dtype !== "float32" && x.dtype !== "int32") return fallback(args);
    const plan = tf.util.sizeFromShape(x.shape) > 0 ? transposePlan(x.shape, perm) : null;
    if (!plan) return fallback(args);
    const be = args.backend as Backend,
      out = be.makeOutput(
        perm.map((a) => x.shape[a]),
        x.dtype,
      ) as tf.TensorInfo;
    const px = heapOffset(be, x),
      po = heapOffset(be, out);
    const blocks = plan.blocks.map(([s, d, srs, cb]) => [px + s, po + d, srs, cb]);
    heapBlocks(be, blocks, plan.R, plan.stride, 4 * tf.util.sizeFromShape(x.shape));
    return out;
  });
}
