/** The heap module's row and copy kernels for the op files: SwiGLU, RMSNorm, softmax's gradient and
 *  row statistics, element-wise binaries, strided copies (Concat, Slice, SplitV), the attention
 *  heads, dequantization and the whole-vocabulary draw, each on byte offsets of the backend's heap,
 *  rows split over the helper threads (heap.ts) where the work repays a hand-off. Each output is
 *  computed the same way on any thread, so results do not depend on the thread count. */
import { heapModule, ready, rowsJob, splitJob } from "./heap.ts";
import {
  JOB_BINARY,
  JOB_COPY_BLOCKS,
  JOB_DEQUANT,
  JOB_DRAW,
  JOB_RMS_NORM,
  JOB_RMS_NORM_GRAD,
  JOB_ROW_STATS,
  JOB_SEQ_HEADS,
  JOB_SEQ_HEADS_GRAD,
  JOB_SOFTMAX,
  JOB_SOFTMAX_GRAD,
  JOB_SWIGLU,
  JOB_SWIGLU_GRAD,
  NORM_BLOCK,
} from "./heap-jobs.ts";
/** SwiGLU on the heap module, rows split over the helper threads when large: y [rows, I] from gu
 *  [rows, 2I] (grad null), or dgu [rows, 2I] from gu and dy [rows, I]. Byte offsets of the backend's
 *  heap; I a multiple of 4. Each row is computed the same way on any thread. */
export function heapSwiglu(backend: unknown, gu: number, dy: number | null, out: number, rows: number, I: number): void {
  rowsJob(heapModule(backend), dy === null ? JOB_SWIGLU : JOB_SWIGLU_GRAD, gu, dy ?? 0, out, rows, I);
}

/** out = a op b for float32 at heap offsets (op: BINARY_OPS of heap-elementwise-code.ts), rows split
 *  over the helper threads from 64 K elements. a and out are [rows, W]; b's row for row r is at b +
 *  ⌊r / rep⌋·bs (bs in bytes), or with op + 3 b holds one value there. rep 0: a flat run of rows·W
 *  elements, b the same shape (bs = 4) or one value (bs = 0, op + 3). */
export function heapBinary(
  backend: unknown,
  op: number,
  a: number,
  b: number,
  out: number,
  rows: number,
  W: number,
  rep: number,
  bs: number,
): void {
  splitJob(heapModule(backend), JOB_BINARY, rep === 0 ? rows * W : rows, rows * W, a, b, out, rows, W, rep, bs, op);
}

/** Bytes from which a copy is split over the helpers: copies are bound by memory, and a decode
 *  step's key/value appends (~600 KB) ran slower split than on one thread. */
const PARALLEL_COPY_BYTES = 1 << 20;

/** Blocks of strided rows copied on the heap, each block [src, dst, srs, rowBytes] (byte offsets and
 *  the source row stride) of R rows, the destination rows `stride` apart. The rows are split over the
 *  helper threads when `bytes` in all reach 1 MB (the table of blocks then goes on the heap). */
export function heapBlocks(backend: unknown, blocks: number[][], R: number, stride: number, bytes: number): void {
  const e = heapModule(backend),
    units = blocks.length * R;
  if (!(ready(e.pool) && bytes >= PARALLEL_COPY_BYTES && units > 1)) {
    for (const [src, dst, srs, cb] of blocks) e.k.copyRows(dst, stride, src, srs, cb, R);
    return;
  }
  const table = e.malloc(16 * blocks.length) >>> 0;
  try {
    new Uint32Array(e.memory.buffer, table, 4 * blocks.length).set(blocks.flat());
    splitJob(e, JOB_COPY_BLOCKS, units, bytes / 4, table, stride, 0, blocks.length, R, 0, 0, 0);
  } finally {
    e.free(table);
  }
}

/** The heads of the fused projection (heads.ts) on the heap module: forward (grad false) with p =
 *  [qkv, cos, sin, q, kT, v], or the gradient with p = [dq, dkT, dv, cos, sin, dqkv], byte offsets of
 *  the backend's heap; rows = B·T, hd a multiple of 8. Rows split over the helper threads when large
 *  (each row is computed the same way on any thread). */
export function heapSeqHeads(
  backend: unknown,
  grad: boolean,
  p: number[],
  rows: number,
  T: number,
  nH: number,
  nKv: number,
  hd: number,
  scale: number,
): void {
  const e = heapModule(backend),
    table = e.malloc(44) >>> 0;
  try {
    new Uint32Array(e.memory.buffer, table, 11).set([...p, T, nH, nKv, hd, new Uint32Array(new Float32Array([scale]).buffer)[0]]);
    splitJob(e, grad ? JOB_SEQ_HEADS_GRAD : JOB_SEQ_HEADS, rows, rows * (nH + 2 * nKv) * hd, table, 0, 0, rows, 0, 0, 0, 0);
  } finally {
    e.free(table);
  }
}

/** The frozen base's codes to float32 (dequant.ts' MarlDequantize on wasm): out [inDim, n] from packed
 *  int32 [P, n] and scales (int8 [1, n], NF4 [P·8 / block, n]), byte offsets of the backend's heap.
 *  The packed rows are split over the helper threads when the output reaches 64 K elements; each
 *  output is one float32 product whichever thread makes it. table: NF4's 16 values (unused for int8). */
export function heapDequantize(
  backend: unknown,
  kind: "int8" | "nf4",
  packed: number,
  scales: number,
  out: number,
  P: number,
  n: number,
  inDim: number,
  table: ArrayLike<number>,
  block: number,
): void {
  if (kind === "nf4" && !(table.length === 16 && block > 0))
    throw new Error(`heap dequantize nf4: expected a 16-value table and a block > 0, got ${table.length} values, block ${block}`);
  const e = heapModule(backend),
    tab = e.malloc(64) >>> 0;
  try {
    if (kind === "nf4") new Float32Array(e.memory.buffer, tab, 16).set(table);
    splitJob(e, JOB_DEQUANT, P, inDim * n, packed, scales, out, P, n, inDim, tab, kind === "nf4" ? block : 0);
  } finally {
    e.free(tab);
  }
}

/** Draws one token per row of logits [rows, V] (float32 at heap offset x) at temperature T with one
 *  uniform per row, rows split over the helper threads: drawRows, into out (float64 [rows, 2]: the
 *  token, −1 where the row has no finite largest logit, and its log-prob; 8-byte aligned). */
export function heapDrawRows(backend: unknown, x: number, rows: number, V: number, T: number, us: number[], out: number): void {
  if (out % 8) throw new Error(`heap draw: the output at byte ${out} is not 8-byte aligned for float64`);
  const e = heapModule(backend),
    p = e.malloc(8 * (1 + rows)) >>> 0;
  if (!p) throw new Error(`heap draw: could not allocate ${8 * (1 + rows)} bytes`);
  try {
    new Float64Array(e.memory.buffer, p, 1 + rows).set([T, ...us]);
    splitJob(e, JOB_DRAW, rows, rows * V, x, p, out, rows, V);
  } finally {
    e.free(p);
  }
}

/** Softmax's backward dx = y · (dy − Σ y·dy) per row of [rows, S] at heap offsets (S a multiple of 4). */
export function heapSoftmaxGrad(backend: unknown, y: number, dy: number, dx: number, rows: number, S: number): void {
  rowsJob(heapModule(backend), JOB_SOFTMAX_GRAD, y, dy, dx, rows, S);
}

/** RMSNorm of x [rows, H] with weight w [H] into y, at heap offsets (H a multiple of 4); rows split
 *  over the helper threads when large. */
export function heapRmsNorm(backend: unknown, x: number, w: number, y: number, rows: number, H: number, eps: number): void {
  rowsJob(heapModule(backend), JOB_RMS_NORM, x, 0, y, rows, H, w, 0, eps);
}

/** RMSNorm's gradient: dx [rows, H] into its heap offset, dw [H] returned (the blocks of 64 rows
 *  summed in order, in float64). */
export function heapRmsNormGrad(
  backend: unknown,
  x: number,
  w: number,
  dy: number,
  dx: number,
  rows: number,
  H: number,
  eps: number,
): Float32Array {
  const e = heapModule(backend),
    blocks = Math.ceil(rows / NORM_BLOCK),
    part = e.malloc(4 * H * blocks) >>> 0;
  try {
    rowsJob(e, JOB_RMS_NORM_GRAD, x, dy, dx, rows, H, w, part, eps);
    const p = new Float32Array(e.memory.buffer, part, H * blocks),
      dw = new Float64Array(H);
    for (let b = 0; b < blocks; b++) for (let j = 0; j < H; j++) dw[j] += p[b * H + j];
    return Float32Array.from(dw);
  } finally {
    e.free(part);
  }
}

/** Per row of x [rows, V] at heap offset x (V a multiple of 4): [m, s, t] with m = max, s = Σ exp(x −
 *  m), t = Σ exp(x − m)·x, from the heap module's kernel (rows split over the helper threads). */
export function heapRowStats(backend: unknown, x: number, rows: number, V: number): Float32Array {
  const e = heapModule(backend),
    out = e.malloc(12 * rows) >>> 0;
  try {
    rowsJob(e, JOB_ROW_STATS, x, 0, out, rows, V);
    return new Float32Array(e.memory.buffer, out, 3 * rows).slice();
  } finally {
    e.free(out);
  }
}

/** out [rows, V] = softmax(x) · coef[r] per row, at heap offsets (V a multiple of 4). */
export function heapSoftmaxRows(backend: unknown, x: number, coef: Float32Array, out: number, rows: number, V: number): void {
  const e = heapModule(backend),
    c = e.malloc(4 * rows) >>> 0;
  try {
    new Float32Array(e.memory.buffer, c, rows).set(coef);
    rowsJob(e, JOB_SOFTMAX, x, c, out, rows, V);
  } finally {
    e.free(c);
  }
}
