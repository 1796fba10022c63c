/** The bytes of a small WebAssembly module with one float32 matrix product kernel, written here as
 *  instructions (no compiler or binary ships with the project). It imports the memory it works on, so
 *  it runs directly on tfjs-backend-wasm's heap (shared memory in the threaded build).
 *
 *  Exports, all pointers and strides in bytes, C[M, N] = A[M, K] · B[K, N]:
 *  - `tile(a, b, c, M, N, K, ars, aks, ldb, ldc, ps, acc)`: M a multiple of MR, N of NR = 8. A[i, k] is at
 *    a + i·ars + k·aks (ars = 4K, aks = 4 for A row-major; ars = 4, aks = 4M for A stored transposed).
 *    Row k of column panel p of B (8 floats) is at b + p·ps + k·ldb: ps = 32, ldb = 4N for B in place;
 *    ps = 32K, ldb = 32 for B packed by `pack`/`packT`. C is row-major with row stride ldc.
 *    Column panels outer, row groups of MR inner, each output block summed over all of K in 2·MR
 *    vector registers, starting from zero (acc = 0) or from C (acc ≠ 0: C holds the sum over earlier
 *    k; float32 in registers and in memory, so splitting K this way changes no bit).
 *  - `tile1(...)` … `tile5(...)`: the same with 1 … 5 rows (the rows left after the groups of MR).
 *  - `tileT(...)`, `tile1T(...)` … `tile5T(...)`: the same with C stored transposed, [N, M] with row
 *    stride ldc (C[i, j] at c + j·ldc + 4i).
 *  - `wide1(...)`, `wide2(...)`: 1 row × 32 columns and 2 rows × 16 per block, B in place only (ps = 32,
 *    N a multiple of 32 or 16): a decode step's one-row products and its attention's two-row ones.
 *  - `pack(b, dst, K, ldb, panels)`: copies `panels` 8-column panels of row-major B (row stride ldb)
 *    to dst, each K rows of 8 contiguous floats, so a panel read by every row block is one run of
 *    memory. `packT(b, dst, K, ldb, panels)`: the same from B stored transposed, [N, K] with row
 *    stride ldb.
 *  - `copyRows(dst, dstStride, src, srcStride, rowBytes, rows)`: rows of bytes between strided
 *    places (memory.copy per row), for the Concat and Slice kernels (concat.ts, slices.ts).
 *  - `swiglu(gu, y, rows, I)`: y[r, j] = g / (1 + exp(−g)) · u for g = gu[r, j], u = gu[r, I + j]
 *    (gu [rows, 2I], y [rows, I]; I a multiple of 4), four lanes at a time. exp is Cephes' expf
 *    (a degree-5 polynomial on the reduced argument, within 2 ulp; 0 below −87, its argument clamped
 *    at 88 so that 2^n stays a normal float: silu's value moves by ~1e-37 at most for that).
 *  - `swigluGrad(gu, dy, dgu, rows, I)`: d gate = dy·u·s·(1 + g·(1 − s)), d up = dy·g·s, s = 1 / (1 + exp(−g)).
 *  - `rowStats(x, out, rows, V)`: per row of x [rows, V] (V a multiple of 4), out[3r..3r+2] = m, s, t:
 *    m = max x, s = Σ exp(x − m), t = Σ exp(x − m)·x (log-sum-exp = m + log s, Σ softmax·x = t / s).
 *  - `softmaxRows(x, coef, out, rows, V)`: out[r, :] = exp(x[r, :] − m) · (coef[r] / s), m and s as above:
 *    softmax times a per-row coefficient (exp stored, then scaled in place).
 *  - `softmaxGrad(y, dy, dx, rows, S)`: dx = y · (dy − Σ y·dy) per row (softmax's backward from its
 *    output y).
 *  - `rmsNorm(x, w, y, rows, H, eps)`: y = x · r · w per row of x [rows, H] (H a multiple of 4),
 *    r = 1 / √(Σx² / H + eps) (f32).
 *  - `rmsNormGrad(x, w, dy, dx, dw, rows, H, eps)`: dx = r·dy·w − c·x with c = r³·Σ(dy·w·x) / H, and
 *    dw [H] = Σ over these rows of dy·x·r, from zero (callers add up fixed blocks of rows).
 *  - `binary(a, b, out, r0, r1, W, rep, bs, op)`: rows r0..r1 − 1 of a float32 [rows, W]: out = a op b
 *    (op 0 add, 1 sub, 2 mul), b's row for row r at b + ⌊r / rep⌋·bs (bs = 4W: the same shape; 0: one
 *    row for all; a middle axis broadcast when rep > 1); op + 3: b is one value per group of rows.
 *    Each output is one float32 operation, so any split of the rows gives the same bits.
 *  - `seqHeads(qkv, cos, sin, q, kT, v, n0, n1, T, nH, nKv, hd, scale)`: rows n0..n1 − 1 of the fused
 *    projection qkv [B·T, (nH + 2·nKv)·hd] into attention's heads q [B, nH, T, hd] (RoPE, then · scale),
 *    kT [B, nKv, hd, T] (RoPE) and v [B, nKv, T, hd], tables cos, sin [B·T, hd]; RoPE as float32
 *    x·cos + rot(x)·sin, each product and the sum rounded (hd a multiple of 8).
 *    `seqHeadsGrad(dq, dkT, dv, cos, sin, dqkv, n0, n1, T, nH, nKv, hd, scale)`: its adjoint into those
 *    rows of dqkv, dq first scaled (rounded), then RoPE's adjoint as float32 dy·cos + rot(dy)·sin.
 *    Each output depends on its row alone, so any split of the rows gives the same bits.
 *  - `dequantInt8(packed, scales, out, i0, i1, P, n, inDim, block, tab)` and `dequantNf4(...)`: packed
 *    rows i0..i1 − 1 of int32 [P, n] (quant.ts' slabs: field k of packed[i, j], 8 or 4 bits from bit
 *    8k or 4k, is the code of output row k·P + i) into out [inDim, n], rows from inDim on dropped.
 *    int8: (code − 128) · scales[j]; NF4: tab[code] · scales[⌊r / block⌋, j], tab 16 float32 values.
 *    Each output is one float32 product, as dequant.ts' JS kernel computes it (bit for bit).
 *  Sums over a row go four lanes at a time, lane sums added last as (l0 + l1) + (l2 + l3), so a row's
 *  result does not depend on which thread computes it.
 *  Each output is the sum over k in order 0..K−1, so a result does not depend on how a caller splits
 *  M or N.
 * The module is assembled here from the kernel bodies in heap-gemm-code.ts, heap-row-code.ts,
 * heap-norm-code.ts, heap-elementwise-code.ts, heap-heads-code.ts and heap-dequant-code.ts
 *  (instructions through wasm/asm.ts). */

import { I32, uleb, str, section, vec, op, F32 } from "./asm.ts";
import { NPARAMS, tileBody, packBody, packTBody } from "./heap-gemm-code.ts";
import { copyRowsBody, swigluBody, rowsBody, softmaxGradBody } from "./heap-row-code.ts";
import { rmsNormBody } from "./heap-norm-code.ts";
import { binaryBody } from "./heap-elementwise-code.ts";
import { SEQ_HEADS_SIG, seqHeadsBody } from "./heap-heads-code.ts";
import { dequantBody } from "./heap-dequant-code.ts";

export interface GemmModuleOptions {
  /** Rows per block of `tile` (the vector registers hold 2·MR accumulators). */
  mr: number;
  /** The relaxed-SIMD build: the product's multiply-adds as f32x4.relaxed_madd (heap-gemm-code.ts). */
  relaxed?: boolean;
  /** The imported memory: shared (the threaded build) or not, and its page limits. */
  memory: { shared: boolean; initial: number; maximum: number };
}

export function gemmModuleBytes(o: GemmModuleOptions): Uint8Array {
  const sig = [0x60, ...vec(new Array(NPARAMS).fill([I32])), 0];
  const packSig = [0x60, ...vec(new Array(5).fill([I32])), 0];
  const copySig = [0x60, ...vec(new Array(6).fill([I32])), 0];
  const limits = o.memory.shared
    ? [0x03, ...uleb(o.memory.initial), ...uleb(o.memory.maximum)]
    : [0x01, ...uleb(o.memory.initial), ...uleb(o.memory.maximum)];
  const swigluSig = [0x60, ...vec(new Array(4).fill([I32])), 0];
  const swigluGradSig = [0x60, ...vec(new Array(5).fill([I32])), 0];
  const normSig = [0x60, ...vec([[I32], [I32], [I32], [I32], [I32], [F32]]), 0];
  const normGradSig = [0x60, ...vec([[I32], [I32], [I32], [I32], [I32], [I32], [I32], [F32]]), 0];
  const binarySig = [0x60, ...vec(new Array(9).fill([I32])), 0];
  const dequantSig = [0x60, ...vec(new Array(10).fill([I32])), 0];
  const bodies = [
    tileBody(o.mr, o.relaxed),
    ...[1, 2, 3, 4, 5].map((r) => tileBody(r, o.relaxed)),
    tileBody(1, o.relaxed, 4),
    tileBody(2, o.relaxed, 2),
    packBody(),
    packTBody(),
    copyRowsBody(),
    swigluBody(false, o.relaxed),
    swigluBody(true, o.relaxed),
    rowsBody(false, o.relaxed),
    rowsBody(true, o.relaxed),
    rmsNormBody(false, o.relaxed),
    rmsNormBody(true, o.relaxed),
    softmaxGradBody(o.relaxed),
    binaryBody(),
    seqHeadsBody(false),
    seqHeadsBody(true),
    dequantBody("int8"),
    dequantBody("nf4"),
    tileBody(o.mr, o.relaxed, 1, true),
    ...[1, 2, 3, 4, 5].map((r) => tileBody(r, o.relaxed, 1, true)),
  ].map(({ locals, code }) => {
    const body = [...vec(locals.map(([c, t]) => [...uleb(c), t])), ...code, ...op.end];
    return [...uleb(body.length), ...body];
  });
  const names = [
    "tile",
    "tile1",
    "tile2",
    "tile3",
    "tile4",
    "tile5",
    "wide1",
    "wide2",
    "pack",
    "packT",
    "copyRows",
    "swiglu",
    "swigluGrad",
    "rowStats",
    "softmaxRows",
    "rmsNorm",
    "rmsNormGrad",
    "softmaxGrad",
    "binary",
    "seqHeads",
    "seqHeadsGrad",
    "dequantInt8",
    "dequantNf4",
    ...["tile", "tile1", "tile2", "tile3", "tile4", "tile5"].map((t) => t + "T"),
  ];
  const types: Record<string, number> = {
    tile: 0,
    tile1: 0,
    tile2: 0,
    tile3: 0,
    tile4: 0,
    tile5: 0,
    wide1: 0,
    wide2: 0,
    pack: 1,
    packT: 1,
    copyRows: 2,
    swiglu: 3,
    swigluGrad: 4,
    rowStats: 3,
    softmaxRows: 4,
    rmsNorm: 5,
    rmsNormGrad: 6,
    softmaxGrad: 4,
    binary: 7,
    seqHeads: 8,
    seqHeadsGrad: 8,
    dequantInt8: 9,
    dequantNf4: 9,
    ...Object.fromEntries(["tile", "tile1", "tile2", "tile3", "tile4", "tile5"].map((t) => [t + "T", 0])),
  };
  return Uint8Array.from([
    0x00,
    0x61,
    0x73,
    0x6d,
    0x01,
    0x00,
    0x00,
    0x00,
    ...section(1, vec([sig, packSig, copySig, swigluSig, swigluGradSig, normSig, normGradSig, binarySig, SEQ_HEADS_SIG, dequantSig])),
    ...section(2, vec([[...str("env"), ...str("memory"), 0x02, ...limits]])),
    ...section(3, vec(names.map((nm) => [types[nm]]))),
    // the functions, and the memory (the helpers' jobs read a table of blocks from it)
    ...section(7, vec([...names.map((nm, idx) => [...str(nm), 0x00, idx]), [...str("memory"), 0x02, 0]])),
    ...section(10, vec(bodies)),
  ]);
}
