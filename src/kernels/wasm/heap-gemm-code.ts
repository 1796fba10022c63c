/** The matrix-product kernels of the heap module, as instructions: `tile` / `tile1` (blocks of MR rows ×
 *  8 columns summed over all of K in vector registers) and `pack` / `packT` (B copied panel by panel).
 *  Their contract is described in heap-code.ts. */
import { I32, op, v, forLoop, V128 } from "./asm.ts";

export const P = { a: 0, b: 1, c: 2, M: 3, N: 4, K: 5, ars: 6, aks: 7, ldb: 8, ldc: 9, ps: 10, acc: 11 };
export const NPARAMS = 12;

/** tile / tile1…tile5: MR rows × 8 columns per block. Per step of k: B's row k as two vectors (b0, b1),
 *  then per row r, a = splat(A[r, k]) once and acc[r] += a · b0, a · b1: a multiply then an add
 *  (simd128), or one f32x4.relaxed_madd (relaxed: a fused multiply-add where the CPU has one, as
 *  x64 with FMA3 and arm64 do; half the arithmetic instructions, and registers free for 6 rows).
 *  np > 1 (wide1, wide2: 1 row × 32 columns, 2 rows × 16): np panels side by side, B read in place
 *  only (its panels contiguous, ps = 32; N a multiple of 8·np). With one or two rows the 8-column
 *  block has 2 or 4 accumulators, each waiting on its own last multiply-add (4 cycles) every step
 *  of k; 8 keep both FMA units busy. Each output is summed the same way: the same bits.
 *  ct (tileT, tile1T…tile5T): C stored transposed, [N, M] with row stride ldc: each block's sums are
 *  stored (and, with acc, loaded) one float at a time at C + column·ldc + 4·row, a few dozen scalar
 *  moves per block against its MR·8·K multiply-adds. For a product read as its transpose, (W · xᵀ)ᵀ,
 *  with no transpose of the output afterwards. */
export function tileBody(MR: number, relaxed = false, np = 1, ct = false): { locals: number[][]; code: number[] } {
  let n = NPARAMS;
  const j = n++,
    i = n++,
    k = n++,
    pb = n++,
    pc = n++,
    rowA = n++,
    pbj = n++;
  const pa = Array.from({ length: MR }, () => n++);
  const nI32 = n - NPARAMS;
  const nb = 2 * np; // vectors of B (and accumulators per row) per block of 8·np columns
  const accs = Array.from({ length: nb * MR }, () => n++);
  const bs = MR > 1 ? Array.from({ length: nb }, () => n++) : []; // one row reads B's vectors straight from memory
  const sp = n++;
  const nV = n - NPARAMS - nI32;
  const bv = (u: number) => (MR > 1 ? op.get(bs[u]) : [...op.get(pb), ...v.load(16 * u)]);
  const mac = (acc: number, u: number) =>
    relaxed
      ? [...op.get(sp), ...bv(u), ...op.get(acc), ...v.fmadd, ...op.set(acc)]
      : [...op.get(acc), ...op.get(sp), ...bv(u), ...v.fmul, ...v.fadd, ...op.set(acc)];
  const kBody = [
    ...bs.flatMap((b, u) => [...op.get(pb), ...v.load(16 * u), ...op.set(b)]),
    ...Array.from({ length: MR }, (_, r) => [
      ...op.get(pa[r]),
      ...v.splat32(),
      ...op.set(sp),
      ...Array.from({ length: nb }, (_, u) => mac(accs[nb * r + u], u)).flat(),
    ]).flat(),
    ...pa.flatMap((p) => [...op.get(p), ...op.get(P.aks), ...op.add, ...op.set(p)]),
    ...op.get(pb),
    ...op.get(P.ldb),
    ...op.add,
    ...op.set(pb),
  ];
  // C transposed: the output (row r, column cc) of a block at pc + cc·ldc + 4r
  const colAddr = (cc: number) => (cc === 0 ? [...op.get(pc)] : [...op.get(pc), ...op.get(P.ldc), ...op.i32(cc), ...op.mul, ...op.add]);
  const storeAll = ct
    ? Array.from({ length: MR * nb * 4 }, (_, x) => {
        const r = Math.floor(x / (nb * 4)),
          u = Math.floor(x / 4) % nb,
          lane = x % 4;
        return [...colAddr(4 * u + lane), ...op.get(accs[nb * r + u]), ...v.lane(lane), ...op.f32store(4 * r)];
      }).flat()
    : Array.from({ length: MR }, (_, r) => {
        const rowAddr = r === 0 ? [...op.get(pc)] : [...op.get(pc), ...op.get(P.ldc), ...op.i32(r), ...op.mul, ...op.add];
        return Array.from({ length: nb }, (_, u) => [...rowAddr, ...op.get(accs[nb * r + u]), ...v.store(16 * u)]).flat();
      }).flat();
  const loadAll = ct
    ? Array.from({ length: MR * nb }, (_, x) => {
        const r = Math.floor(x / nb),
          u = x % nb;
        return [
          ...v.zero,
          ...[0, 1, 2, 3].flatMap((lane) => [...colAddr(4 * u + lane), ...op.f32load(4 * r), ...v.replaceLane(lane)]),
          ...op.set(accs[nb * r + u]),
        ];
      }).flat()
    : Array.from({ length: MR }, (_, r) => {
        const rowAddr = r === 0 ? [...op.get(pc)] : [...op.get(pc), ...op.get(P.ldc), ...op.i32(r), ...op.mul, ...op.add];
        return Array.from({ length: nb }, (_, u) => [...rowAddr, ...v.load(16 * u), ...op.set(accs[nb * r + u])]).flat();
      }).flat();
  const block = [
    // pa[r] = rowA + r·ars; pb = pbj; acc = 0
    ...Array.from({ length: MR }, (_, r) => [
      ...op.get(rowA),
      ...(r ? [...op.get(P.ars), ...op.i32(r), ...op.mul, ...op.add] : []),
      ...op.set(pa[r]),
    ]).flat(),
    ...op.get(pbj),
    ...op.set(pb),
    // acc = 0: start from zero; else from C (the sum over earlier blocks of k)
    ...op.get(P.acc),
    ...op.if,
    ...loadAll,
    ...op.else,
    ...accs.flatMap((a) => [...v.zero, ...op.set(a)]),
    ...op.end,
    ...forLoop(k, op.i32(0), op.get(P.K), op.i32(1), kBody),
    ...storeAll,
  ];
  const rows = [
    ...op.get(P.a),
    ...op.set(rowA),
    // pc: the block's first output, C + j·4 (C + j·ldc transposed), a block of rows on: + MR·ldc (+ 4·MR)
    ...op.get(P.c),
    ...op.get(j),
    ...(ct ? op.get(P.ldc) : op.i32(4)),
    ...op.mul,
    ...op.add,
    ...op.set(pc),
    ...forLoop(i, op.i32(0), op.get(P.M), op.i32(MR), [
      ...block,
      ...op.get(rowA),
      ...op.get(P.ars),
      ...op.i32(MR),
      ...op.mul,
      ...op.add,
      ...op.set(rowA),
      ...op.get(pc),
      ...(ct ? op.i32(4 * MR) : [...op.get(P.ldc), ...op.i32(MR), ...op.mul]),
      ...op.add,
      ...op.set(pc),
    ]),
  ];
  const code = forLoop(j, op.i32(0), op.get(P.N), op.i32(8 * np), [
    ...op.get(P.b),
    ...op.get(j),
    ...op.i32(3),
    ...op.shrU,
    ...op.get(P.ps),
    ...op.mul,
    ...op.add,
    ...op.set(pbj),
    ...rows,
  ]);
  return {
    locals: [
      [nI32, I32],
      [nV, V128],
    ],
    code,
  };
}

/** pack(b, dst, K, ldb, panels): panel after panel, row after row, two vectors per row. */
export function packBody(): { locals: number[][]; code: number[] } {
  const b = 0,
    dst = 1,
    K = 2,
    ldb = 3,
    panels = 4;
  const p = 5,
    k = 6,
    s = 7;
  const code = forLoop(p, op.i32(0), op.get(panels), op.i32(1), [
    ...op.get(b),
    ...op.get(p),
    ...op.i32(32),
    ...op.mul,
    ...op.add,
    ...op.set(s),
    ...forLoop(k, op.i32(0), op.get(K), op.i32(1), [
      ...op.get(dst),
      ...op.get(s),
      ...v.load(0),
      ...v.store(0),
      ...op.get(dst),
      ...op.get(s),
      ...v.load(16),
      ...v.store(16),
      ...op.get(s),
      ...op.get(ldb),
      ...op.add,
      ...op.set(s),
      ...op.get(dst),
      ...op.i32(32),
      ...op.add,
      ...op.set(dst),
    ]),
  ]);
  return { locals: [[3, I32]], code };
}

/** packT(b, dst, K, ldb, panels): B stored [N, K]; per panel, per k, the 8 floats B[8p..8p+7, k]. */
export function packTBody(): { locals: number[][]; code: number[] } {
  const b = 0,
    dst = 1,
    K = 2,
    ldb = 3,
    panels = 4;
  const p = 5,
    k = 6,
    s = 7;
  const code = forLoop(p, op.i32(0), op.get(panels), op.i32(1), [
    ...op.get(b),
    ...op.get(p),
    ...op.get(ldb),
    ...op.i32(8),
    ...op.mul,
    ...op.mul,
    ...op.add,
    ...op.set(s),
    ...forLoop(k, op.i32(0), op.get(K), op.i32(1), [
      ...Array.from({ length: 8 }, (_, c) => [
        ...op.get(dst),
        ...op.get(s),
        ...(c ? [...op.get(ldb), ...op.i32(c), ...op.mul, ...op.add] : []),
        ...op.f32load(),
        ...op.f32store(4 * c),
      ]).flat(),
      ...op.get(s),
      ...op.i32(4),
      ...op.add,
      ...op.set(s),
      ...op.get(dst),
      ...op.i32(32),
      ...op.add,
      ...op.set(dst),
    ]),
  ]);
  return { locals: [[3, I32]], code };
}
