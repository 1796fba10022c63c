/** The jobs the heap module's helper threads run (heap.ts builds their source from these functions
 *  with Function.toString, so each calls nothing imported and reads no constant of this file: the
 *  numbers come as arguments, or are inlined by heap.ts), and the control block's slots and job
 *  numbers they share with the calling thread: a product's columns or rows (part), a batch's slices
 *  (slicesPart), rows of a row kernel (rowsPart) and of a whole-vocabulary draw (drawRows). */
import { MAX_WASM_THREADS } from "./threads.ts";
import type { Kernels } from "./heap.ts";

/** The control block shared with the helpers (Int32 slots). */
export const SEQ = 0,
  DONE = 1,
  READY = 2,
  NEXT = 3, // per part, the next of its units of a product to take (part(), slicesPart())
  // ARGS: a, b, c, M, K, N, parts, scratch, transposes, job, then a batch's slices, A's and B's slice strides
  ARGS = NEXT + MAX_WASM_THREADS;
export const CTRL_SLOTS = ARGS + 13;
/** Jobs the helpers run: a product's columns or rows, a batch's slices, or rows of an element-wise kernel. */
export const JOB_GEMM = 0,
  JOB_SWIGLU = 1,
  JOB_SWIGLU_GRAD = 2,
  JOB_ROW_STATS = 3,
  JOB_SOFTMAX = 4,
  JOB_RMS_NORM = 5,
  JOB_RMS_NORM_GRAD = 6,
  JOB_SOFTMAX_GRAD = 8,
  JOB_BINARY = 9,
  JOB_COPY_BLOCKS = 10,
  JOB_SEQ_HEADS = 11,
  JOB_SEQ_HEADS_GRAD = 12,
  JOB_GEMM_SLICES = 13,
  JOB_DEQUANT = 14,
  JOB_DRAW = 15;
/** Rows per block of RMSNorm's gradient: each block sums its own part of dw, and the blocks are added
 *  in order afterwards, so dw does not depend on how the blocks were shared among threads. */
export const NORM_BLOCK = 64;

/** One part of C = op(A) · op(B), in units: whole 8-column panels, or with t & 4 rows (whole blocks
 *  of mr) over all of N's panels. Each part owns an even share of U units, takes them in order, then
 *  takes what is left of the other parts' (claim(q): the next of part q's units), so a thread slowed
 *  by other work on its core does less while an unloaded run keeps each part on its own rows (those
 *  the row kernels' same split left in its cache). U = 4: a unit of columns passes over all of A
 *  once more, a unit of rows packs B again (U = 2 where B is stored transposed: its packing, one
 *  float at a time, costs more).
 *  Runs on every thread, so it is also the helpers' code (stringified below): only plain JS, no imports.
 *  t: bit 0 = A stored transposed ([K, M]), bit 1 = B stored transposed ([N, K]), bit 2 = split by rows,
 *  bit 3 = C stored transposed ([N, M]: the tile*T kernels; no wide blocks).
 *  scratch ≠ 0: B's panels are first packed, up to 512 KB of them at a time, into this part's slice of
 *  the scratch buffer (packBytes(K) each), so the kernel reads each panel as one run of memory (a
 *  transposed B is always packed); scratch = 0: B is read in place. */
export function part(
  k: Kernels,
  mr: number,
  a: number,
  b: number,
  c: number,
  M: number,
  K: number,
  N: number,
  index: number,
  parts: number,
  scratch: number,
  t: number,
  claim: (q: number) => number = () => 0,
): void {
  if (index >= parts) return; // a helper beyond the parts: no packing buffer of its own
  const ars = t & 1 ? 4 : 4 * K,
    aks = t & 1 ? 4 * M : 4,
    ldc = 4 * N; // B's row stride in place
  // C's bytes per row and per column, and the stride its kernels take (transposed: [N, M])
  const ct = t & 8,
    rs = ct ? 4 : ldc,
    cs = ct ? 4 * M : 4,
    ldk = ct ? 4 * M : ldc,
    T = ct ? "T" : "";
  const panels = (N - (N % 8)) / 8;
  // K in blocks of ≤ 1024, so a packed panel (32 KB) stays in L1 while the row groups pass over it;
  // rows in blocks of ≤ 256 KB of A, which stay in cache while every column panel passes over them
  // (else a tall A, such as a vocab head held [vocab, hidden], is read from memory once per panel).
  const kc = Math.min(K, 1024);
  const mc = Math.max(mr, Math.floor(65536 / kc) - (Math.floor(65536 / kc) % mr));
  const nc = scratch ? Math.max(8, Math.floor(16384 / kc) * 8) : 8 * panels;
  const buf = scratch + index * nc * kc * 4;
  // A row's sum is the same whichever part and block of rows it falls in, and a panel's whichever unit
  // and thread, so every split gives the same bits.
  const byRows = t & 4,
    shared = parts > 1,
    U = shared ? (byRows && t & 2 ? 2 : 4) : 1,
    per = byRows ? Math.ceil(M / (U * parts) / mr) * mr : Math.ceil(panels / (U * parts));
  for (let tried = 0, q = index; tried < parts; tried++, q = (q + 1) % parts)
    for (let u = shared ? claim(q) : 0; u < U; u = shared ? claim(q) : U) {
      const unit = q * U + u,
        r0 = byRows ? Math.min(M, unit * per) : 0,
        r1 = byRows ? Math.min(M, (unit + 1) * per) : M,
        j0 = byRows ? 0 : Math.min(panels, unit * per) * 8,
        j1 = byRows ? panels * 8 : Math.min(panels, (unit + 1) * per) * 8;
      if (r1 <= r0 || j1 <= j0) continue;
      const ar = a + r0 * ars,
        cr = c + r0 * rs,
        Mb = r1 - r0 - ((r1 - r0) % mr),
        rest = r1 - r0 - Mb;
      for (let jc = j0; jc < j1; jc += nc) {
        const n = Math.min(nc, j1 - jc);
        for (let k0 = 0; k0 < K; k0 += kc) {
          const kn = Math.min(kc, K - k0),
            acc = k0 > 0 ? 1 : 0,
            ak = ar + k0 * aks;
          let pb = b + k0 * ldc + 4 * jc,
            ldb = ldc,
            ps = 32;
          if (scratch) {
            if (t & 2) k.packT(b + 4 * K * jc + 4 * k0, buf, kn, 4 * K, n / 8);
            else k.pack(pb, buf, kn, ldc, n / 8);
            ((pb = buf), (ldb = 32), (ps = 32 * kn));
          }
          for (let i0 = 0; i0 < Mb; i0 += mc)
            k[("tile" + T) as "tile"](ak + i0 * ars, pb, cr + i0 * rs + jc * cs, Math.min(mc, Mb - i0), n, kn, ars, aks, ldb, ldk, ps, acc);
          // the rows left after the blocks of mr: one block of as many rows (tile1 … tile5); one or two
          // rows of B in place take wide blocks first (wide1: 32 columns, wide2: 16), as many as fit
          if (rest) {
            const wide = rest <= 2 && !scratch && !ct ? n - (n % (rest === 1 ? 32 : 16)) : 0;
            const aw = ak + Mb * ars,
              cw = cr + Mb * rs + jc * cs;
            if (wide) k[("wide" + rest) as "wide1"](aw, pb, cw, rest, wide, kn, ars, aks, ldb, ldc, ps, acc);
            if (wide < n)
              k[("tile" + rest + T) as "tile1"](aw, pb + 4 * wide, cw + wide * cs, rest, n - wide, kn, ars, aks, ldb, ldk, ps, acc);
          }
        }
      }
    }
}

/** One part of a batch of `batch` products C[s] = op(A[s]) · op(B[s]): whole slices, an even share
 *  owned by each part and the rest taken as part()'s units are, each slice run as one part (part()
 *  with parts = 1) on this part's packing buffer. A's and B's slices are sa and
 *  sb bytes apart (0: one operand for every slice), C's M·N floats. A batch of attention products
 *  ([heads, T, hd] · [heads, hd, T]) is then one hand-off instead of one per slice, and slices too
 *  small to split on their own run in parallel. Each slice is summed as one part's product is, so the
 *  bits are those of the other splits. Plain JS (helpers' code too). */
export function slicesPart(
  k: Kernels,
  mr: number,
  a: number,
  b: number,
  c: number,
  M: number,
  K: number,
  N: number,
  index: number,
  parts: number,
  scratch: number,
  t: number,
  batch: number,
  sa: number,
  sb: number,
  claim: (q: number) => number,
): void {
  if (index >= parts) return;
  const buf = scratch ? scratch + index * packBytes(K) : 0,
    S = Math.ceil(batch / parts);
  for (let tried = 0, q = index; tried < parts; tried++, q = (q + 1) % parts)
    for (let u = claim(q), s = q * S + u; u < S && s < batch; u = claim(q), s = q * S + u)
      part(k, mr, a + s * sa, b + s * sb, c + s * M * N * 4, M, K, N, 0, 1, buf, t);
}

/** Rows [r0, r1) of one part of a row kernel over [rows, I] (a job of the helpers too, so plain JS;
 *  the job numbers are those of JOB_*). SwiGLU: a gu [rows, 2I], b dy [rows, I], c the output;
 *  rowStats: a x [rows, I], c out [rows, 3]; softmaxRows: a x, b coef [rows], c out [rows, I];
 *  softmaxGrad: a y, b dy, c dx, all [rows, I];
 *  RMSNorm: a x, w the weight, c y or dx, b dy, aux dw's blocks [⌈rows / 64⌉, I], eps as float32 bits.
 *  The gradient is shared out by blocks of 64 rows (NORM_BLOCK), the others by rows.
 *  binary: c = a op b, w = rep, aux = bs, bits = op (see heapBinary); with rep 0 the rows·I elements
 *  are shared out as one flat run (aux = 4: b too, aux = 0: b one value).
 *  Seq heads (11) and their gradient (12): a a table of the kernel's six pointers, T, nH, nKv, hd and
 *  the scale's float32 bits; its `rows` rows (B·T) are shared out.
 *  Copy blocks (10): a a table of `rows` blocks of 4 u32 (src, dst, src row stride, row bytes), each
 *  of I rows, b the destination stride; their I·rows rows are shared out in order, a part's range
 *  crossing blocks where it must.
 *  Dequantize (14): a packed [rows, I] int32, b the scales, c the output, w inDim, aux the NF4 table
 *  (heap-code.ts), bits the NF4 block (0: int8); the packed rows are shared out, each with the output
 *  rows it holds.
 *  Draw (15): a logits [rows, I] float32, b float64 [T, u₀, u₁, …], c float64 out [rows, 2]
 *  (token, log-prob); rows are shared out (drawRows). */
export function rowsPart(
  k: Kernels,
  job: number,
  a: number,
  b: number,
  c: number,
  rows: number,
  I: number,
  index: number,
  parts: number,
  w: number,
  aux: number,
  bits: number,
): void {
  if (index >= parts) return;
  if (job === 9 && w === 0) {
    const n = rows * I,
      e0 = Math.floor((n * index) / parts),
      e1 = Math.floor((n * (index + 1)) / parts);
    if (e1 > e0) k.binary(a + 4 * e0, aux ? b + 4 * e0 : b, c + 4 * e0, 0, 1, e1 - e0, 1, 0, bits);
    return;
  }
  if (job === 10) {
    const t = new Uint32Array(k.memory.buffer, a, 4 * rows),
      u1 = Math.floor((rows * I * (index + 1)) / parts);
    for (let u = Math.floor((rows * I * index) / parts); u < u1;) {
      const blk = Math.floor(u / I),
        rr = u - blk * I,
        n = Math.min(I - rr, u1 - u);
      const [src, dst, srs, cb] = [t[4 * blk], t[4 * blk + 1], t[4 * blk + 2], t[4 * blk + 3]];
      k.copyRows(dst + rr * b, b, src + rr * srs, srs, cb, n);
      u += n;
    }
    return;
  }
  if (job === 15) {
    const r0 = Math.floor((rows * index) / parts),
      r1 = Math.floor((rows * (index + 1)) / parts);
    if (r1 > r0) drawRows(k.memory.buffer, a, I, b, c, r0, r1);
    return;
  }
  if (job === 14) {
    const i0 = Math.floor((rows * index) / parts),
      i1 = Math.floor((rows * (index + 1)) / parts);
    if (i1 > i0) k[bits ? "dequantNf4" : "dequantInt8"](a, b, c, i0, i1, rows, I, w, bits, aux);
    return;
  }
  if (job === 11 || job === 12) {
    const p = new Uint32Array(k.memory.buffer, a, 11),
      n0 = Math.floor((rows * index) / parts),
      n1 = Math.floor((rows * (index + 1)) / parts);
    const scale = new Float32Array(k.memory.buffer, a + 40, 1)[0];
    if (n1 > n0) k[job === 11 ? "seqHeads" : "seqHeadsGrad"](p[0], p[1], p[2], p[3], p[4], p[5], n0, n1, p[6], p[7], p[8], p[9], scale);
    return;
  }
  const eps = new Float32Array(new Uint32Array([bits]).buffer)[0];
  if (job === 6) {
    const blocks = Math.ceil(rows / 64);
    for (let blk = Math.floor((blocks * index) / parts), end = Math.floor((blocks * (index + 1)) / parts); blk < end; blk++) {
      const r0 = 64 * blk;
      k.rmsNormGrad(a + 4 * I * r0, w, b + 4 * I * r0, c + 4 * I * r0, aux + 4 * I * blk, Math.min(64, rows - r0), I, eps);
    }
    return;
  }
  const r0 = Math.floor((rows * index) / parts),
    r1 = Math.floor((rows * (index + 1)) / parts),
    n = r1 - r0;
  if (n <= 0) return;
  if (job === 9) k.binary(a, b, c, r0, r1, I, w, aux, bits);
  else if (job === 5) k.rmsNorm(a + 4 * I * r0, w, c + 4 * I * r0, n, I, eps);
  else if (job === 1) k.swiglu(a + 8 * I * r0, c + 4 * I * r0, n, I);
  else if (job === 8) k.softmaxGrad(a + 4 * I * r0, b + 4 * I * r0, c + 4 * I * r0, n, I);
  else if (job === 2) k.swigluGrad(a + 8 * I * r0, b + 4 * I * r0, c + 8 * I * r0, n, I);
  else if (job === 3) k.rowStats(a + 4 * I * r0, c + 12 * r0, n, I);
  else k.softmaxRows(a + 4 * I * r0, b + 4 * r0, c + 4 * I * r0, n, I);
}

/** Bytes of one part's packing buffer for depth K (the nc × kc of part(): ≤ 512 KB, at least one panel).
 *  Helpers' code too (slicesPart). */
export function packBytes(K: number): number {
  return Math.max(8, Math.floor(16384 / Math.min(K, 1024)) * 8) * Math.min(K, 1024) * 4;
}

/** Rows [r0, r1) of a draw from whole rows of logits [rows, V] at byte offset x: per row, the token
 *  of an inverse-CDF draw in id order over softmax(logits / T) with the row's uniform, and its
 *  log-probability, into out (float64 [rows, 2]); at T = 0 the argmax (lowest id among equal
 *  largest logits) and log-prob 0, as sampleRow's greedy; p holds float64 T, then one uniform per row. The
 *  arithmetic of rollout/sample-row.ts sampleRow's whole-vocabulary id walk, step for step (float64
 *  weights from Math.exp, negligible below −40, summed in id order), so the same tokens and
 *  log-probs; a row without a finite largest logit gets token −1 (the caller reports it). A job of
 *  the helpers too (plain JS, no imports). */
export function drawRows(buf: ArrayBufferLike, x: number, V: number, p: number, out: number, r0: number, r1: number): void {
  const f = new Float64Array(buf, p, 1 + r1),
    o = new Float64Array(buf, out, 2 * r1),
    T = f[0],
    e = new Float64Array(V);
  for (let r = r0; r < r1; r++) {
    const row = new Float32Array(buf, x + 4 * r * V, V);
    let max = -Infinity,
      argmax = 0;
    for (let j = 0; j < V; j++)
      if (row[j] > max) {
        max = row[j];
        argmax = j;
      }
    if (!(max > -Infinity && max < Infinity)) {
      o[2 * r] = -1;
      o[2 * r + 1] = NaN;
      continue;
    }
    if (T === 0) {
      o[2 * r] = argmax; // greedy: the first (lowest) id of the largest logit, a certain choice
      o[2 * r + 1] = 0;
      continue;
    }
    let sum = 0;
    for (let j = 0; j < V; j++) {
      const z = (row[j] - max) / T;
      sum += e[j] = z > -40 ? Math.exp(z) : 0;
    }
    const logZ = Math.log(sum),
      target = f[1 + r] * sum;
    let acc = 0,
      tok = argmax;
    for (let j = 0; j < V; j++) {
      if (e[j] === 0) continue;
      acc += e[j];
      tok = j;
      if (target < acc) break;
    }
    o[2 * r] = tok;
    o[2 * r + 1] = (row[tok] - max) / T - logZ;
  }
}
