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
 *  - `tile1(...)`: the same with one row (the rows left after the groups of MR).
 *  - `pack(b, dst, K, ldb, panels)`: copies `panels` 8-column panels of row-major B (row stride ldb)
 *    to dst, each K rows of 8 contiguous floats, so a panel read by every row block is one run of
 *    memory. `packT(b, dst, K, ldb, panels)`: the same from B stored transposed, [N, K] with row
 *    stride ldb.
 *  - `copyRows(dst, dstStride, src, srcStride, rowBytes, rows)`: rows of bytes between strided
 *    places (memory.copy per row), for the Concat and Slice kernels (concat.ts, backend.ts).
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
 *  Sums over a row go four lanes at a time, lane sums added last as (l0 + l1) + (l2 + l3), so a row's
 *  result does not depend on which thread computes it.
 *  Each output is the sum over k in order 0..K−1, so a result does not depend on how a caller splits
 *  M or N. */

const I32 = 0x7f, F32 = 0x7d, V128 = 0x7b;

function uleb(n: number): number[] {
  const out: number[] = [];
  do {
    let b = n & 0x7f;
    n >>>= 7;
    if (n) b |= 0x80;
    out.push(b);
  } while (n);
  return out;
}
function sleb(n: number): number[] {
  const out: number[] = [];
  for (;;) {
    const b = n & 0x7f;
    n >>= 7;
    if ((n === 0 && !(b & 0x40)) || (n === -1 && b & 0x40)) return out.push(b), out;
    out.push(b | 0x80);
  }
}
const str = (s: string) => [...uleb(s.length), ...Buffer.from(s, "utf8")];
const section = (id: number, body: number[]) => [id, ...uleb(body.length), ...body];
const vec = (items: number[][]) => [...uleb(items.length), ...items.flat()];

/** Instruction helpers (only what the kernels use). */
const op = {
  get: (i: number) => [0x20, ...uleb(i)],
  set: (i: number) => [0x21, ...uleb(i)],
  tee: (i: number) => [0x22, ...uleb(i)],
  i32: (n: number) => [0x41, ...sleb(n)],
  add: [0x6a],
  mul: [0x6c],
  ltU: [0x49],
  shrU: [0x76],
  memoryCopy: [0xfc, 0x0a, 0x00, 0x00],
  loop: [0x03, 0x40],
  if: [0x04, 0x40],
  else: [0x05],
  end: [0x0b],
  brIf: (d: number) => [0x0d, ...uleb(d)],
  f32load: (off = 0) => [0x2a, 2, ...uleb(off)],
  f32store: (off = 0) => [0x38, 2, ...uleb(off)],
  simd: (code: number) => [0xfd, ...uleb(code)],
};
/** A v128 constant of four equal float32 (or int32) lanes. */
const f32x4 = (x: number) => [...op.simd(0x0c), ...[...new Uint8Array(new Float32Array([x, x, x, x]).buffer)]];
const i32x4 = (x: number) => [...op.simd(0x0c), ...[...new Uint8Array(new Int32Array([x, x, x, x]).buffer)]];
const v = {
  load: (off = 0) => [...op.simd(0x00), 2, ...uleb(off)],
  store: (off = 0) => [...op.simd(0x0b), 2, ...uleb(off)],
  splat32: (off = 0) => [...op.simd(0x09), 2, ...uleb(off)], // v128.load32_splat
  zero: [...op.simd(0x0c), ...new Array(16).fill(0)],
  fadd: op.simd(0xe4),
  fmul: op.simd(0xe6),
  fsub: op.simd(0xe5),
  fdiv: op.simd(0xe7),
  fneg: op.simd(0xe1),
  fmin: op.simd(0xe8),
  fmax: op.simd(0xe9),
  fsplat: op.simd(0x13),
  lane: (i: number) => [...op.simd(0x1f), i], // f32x4.extract_lane
  pmin: op.simd(0xea),
  pmax: op.simd(0xeb),
  flt: op.simd(0x43), // f32x4.lt
  andnot: op.simd(0x4f), // v128.andnot: a & ~b
  iadd: op.simd(0xae),
  ishl: op.simd(0xab),
};

/** v128 constants of one function held in locals that are set once at its start: x64's code
 *  generator rebuilds a v128.const at every use, several instructions each time, inside the loops
 *  (exp's dozen constants made it ~3x slower). Locals from `first` on, after all the others. */
class Consts {
  private readonly slots = new Map<string, number>();
  private readonly values: number[][] = [];
  constructor(private readonly first: number) {}
  f32(x: number): number[] {
    return this.local(f32x4(x));
  }
  i32(x: number): number[] {
    return this.local(i32x4(x));
  }
  private local(bytes: number[]): number[] {
    const key = bytes.join(",");
    let i = this.slots.get(key);
    if (i === undefined) {
      i = this.first + this.values.length;
      this.slots.set(key, i);
      this.values.push(bytes);
    }
    return op.get(i);
  }
  get count(): number {
    return this.values.length;
  }
  /** The code that sets every local used so far (put it first in the function). */
  init(): number[] {
    return this.values.flatMap((b, k) => [...b, ...op.set(this.first + k)]);
  }
}

/** exp of the four lanes on the stack (Cephes expf), using v128 locals x, n, o and f as scratch. The
 *  argument is clamped to [−87, 88] (2^n stays a normal float) and lanes below −87 give exactly 0,
 *  as a masked attention score (−1e9) must; NaN stays NaN. Written for x64's code generator: pmin/pmax
 *  (one instruction each, where min/max take ~8 for their NaN rules) and n rounded by adding and
 *  subtracting 1.5·2^23 (the float's low bits then hold n, so 2^n needs no float-to-int conversion). */
function vexp(c: Consts, x: number, n: number, o: number, f: number): number[] {
  const poly = [1.987569150e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1];
  const MAGIC = 12582912; // 1.5 · 2^23
  return [
    // pmax(x, −87) = x < −87 ? −87 : x; pmin(x, 88) = 88 < x ? 88 : x (NaN passes both)
    ...op.tee(o), ...c.f32(-87), ...v.pmax, ...c.f32(88), ...v.pmin, ...op.set(x),
    // n = round(x·log2 e), as n + 1.5·2^23 (kept in n: its bits hold 0x4B400000 + n)
    ...op.get(x), ...c.f32(Math.LOG2E), ...v.fmul, ...c.f32(MAGIC), ...v.fadd, ...op.set(n),
    // x − n·ln2 in two parts (0.693359375 is exact in few bits), n as a float on the stack twice
    ...op.get(x), ...op.get(n), ...c.f32(MAGIC), ...v.fsub, ...op.tee(f), ...c.f32(0.693359375), ...v.fmul, ...v.fsub, ...op.get(f), ...c.f32(-2.12194440e-4), ...v.fmul, ...v.fsub, ...op.set(x),
    ...c.f32(poly[0]), ...poly.slice(1).flatMap((p) => [...op.get(x), ...v.fmul, ...c.f32(p), ...v.fadd]),
    ...op.get(x), ...v.fmul, ...op.get(x), ...v.fmul, ...op.get(x), ...v.fadd, ...c.f32(1), ...v.fadd,
    // · 2^n: (bits + 127) << 23 drops the magic number's bits and leaves n + 127 in the exponent
    ...op.get(n), ...c.i32(127), ...v.iadd, ...op.i32(23), ...v.ishl, ...v.fmul,
    // and 0 where the argument was below −87 (a NaN argument compares false: kept)
    ...op.get(o), ...c.f32(-87), ...v.flt, ...v.andnot,
  ];
}

function forLoop(x: number, from: number[], limit: number[], step: number[], body: number[]): number[] {
  return [
    ...from, ...op.set(x),
    ...op.get(x), ...limit, ...op.ltU, ...op.if,
    ...op.loop,
    ...body,
    ...op.get(x), ...step, ...op.add, ...op.tee(x), ...limit, ...op.ltU, ...op.brIf(0),
    ...op.end,
    ...op.end,
  ];
}

// Parameters of every export.
const P = { a: 0, b: 1, c: 2, M: 3, N: 4, K: 5, ars: 6, aks: 7, ldb: 8, ldc: 9, ps: 10, acc: 11 };
const NPARAMS = 12;

/** tile / tile1: MR rows × 8 columns per block. Per step of k: B's row k as two vectors (b0, b1),
 *  then per row r, a = splat(A[r, k]) once and acc[r] += a · b0, a · b1 (multiply, then add: on x64
 *  the fused form is no faster here, and it would need relaxed SIMD, which Node 20 keeps off). */
function tileBody(MR: number): { locals: number[][]; code: number[] } {
  let n = NPARAMS;
  const j = n++, i = n++, k = n++, pb = n++, pc = n++, rowA = n++, pbj = n++;
  const pa = Array.from({ length: MR }, () => n++);
  const nI32 = n - NPARAMS;
  const accs = Array.from({ length: 2 * MR }, () => n++);
  const b0 = n++, b1 = n++, sp = n++;
  const nV = n - NPARAMS - nI32;
  const mac = (acc: number, b: number) => [...op.get(acc), ...op.get(sp), ...op.get(b), ...v.fmul, ...v.fadd, ...op.set(acc)];
  const kBody = [
    ...op.get(pb), ...v.load(0), ...op.set(b0),
    ...op.get(pb), ...v.load(16), ...op.set(b1),
    ...Array.from({ length: MR }, (_, r) => [...op.get(pa[r]), ...v.splat32(), ...op.set(sp), ...mac(accs[2 * r], b0), ...mac(accs[2 * r + 1], b1)]).flat(),
    ...pa.flatMap((p) => [...op.get(p), ...op.get(P.aks), ...op.add, ...op.set(p)]),
    ...op.get(pb), ...op.get(P.ldb), ...op.add, ...op.set(pb),
  ];
  const storeAll = Array.from({ length: MR }, (_, r) => {
    const rowAddr = r === 0 ? [...op.get(pc)] : [...op.get(pc), ...op.get(P.ldc), ...op.i32(r), ...op.mul, ...op.add];
    return [...rowAddr, ...op.get(accs[2 * r]), ...v.store(0), ...rowAddr, ...op.get(accs[2 * r + 1]), ...v.store(16)];
  }).flat();
  const block = [
    // pa[r] = rowA + r·ars; pb = pbj; acc = 0
    ...Array.from({ length: MR }, (_, r) => [...op.get(rowA), ...(r ? [...op.get(P.ars), ...op.i32(r), ...op.mul, ...op.add] : []), ...op.set(pa[r])]).flat(),
    ...op.get(pbj), ...op.set(pb),
    // acc = 0: start from zero; else from C (the sum over earlier blocks of k)
    ...op.get(P.acc), ...op.if,
    ...Array.from({ length: MR }, (_, r) => {
      const rowAddr = r === 0 ? [...op.get(pc)] : [...op.get(pc), ...op.get(P.ldc), ...op.i32(r), ...op.mul, ...op.add];
      return [...rowAddr, ...v.load(0), ...op.set(accs[2 * r]), ...rowAddr, ...v.load(16), ...op.set(accs[2 * r + 1])];
    }).flat(),
    ...op.else,
    ...accs.flatMap((a) => [...v.zero, ...op.set(a)]),
    ...op.end,
    ...forLoop(k, op.i32(0), op.get(P.K), op.i32(1), kBody),
    ...storeAll,
  ];
  const rows = [
    ...op.get(P.a), ...op.set(rowA),
    ...op.get(P.c), ...op.get(j), ...op.i32(4), ...op.mul, ...op.add, ...op.set(pc),
    ...forLoop(i, op.i32(0), op.get(P.M), op.i32(MR), [
      ...block,
      ...op.get(rowA), ...op.get(P.ars), ...op.i32(MR), ...op.mul, ...op.add, ...op.set(rowA),
      ...op.get(pc), ...op.get(P.ldc), ...op.i32(MR), ...op.mul, ...op.add, ...op.set(pc),
    ]),
  ];
  const code = forLoop(j, op.i32(0), op.get(P.N), op.i32(8), [
    ...op.get(P.b), ...op.get(j), ...op.i32(3), ...op.shrU, ...op.get(P.ps), ...op.mul, ...op.add, ...op.set(pbj),
    ...rows,
  ]);
  return { locals: [[nI32, I32], [nV, V128]], code };
}

/** pack(b, dst, K, ldb, panels): panel after panel, row after row, two vectors per row. */
function packBody(): { locals: number[][]; code: number[] } {
  const b = 0, dst = 1, K = 2, ldb = 3, panels = 4;
  const p = 5, k = 6, s = 7;
  const code = forLoop(p, op.i32(0), op.get(panels), op.i32(1), [
    ...op.get(b), ...op.get(p), ...op.i32(32), ...op.mul, ...op.add, ...op.set(s),
    ...forLoop(k, op.i32(0), op.get(K), op.i32(1), [
      ...op.get(dst), ...op.get(s), ...v.load(0), ...v.store(0),
      ...op.get(dst), ...op.get(s), ...v.load(16), ...v.store(16),
      ...op.get(s), ...op.get(ldb), ...op.add, ...op.set(s),
      ...op.get(dst), ...op.i32(32), ...op.add, ...op.set(dst),
    ]),
  ]);
  return { locals: [[3, I32]], code };
}

/** packT(b, dst, K, ldb, panels): B stored [N, K]; per panel, per k, the 8 floats B[8p..8p+7, k]. */
function packTBody(): { locals: number[][]; code: number[] } {
  const b = 0, dst = 1, K = 2, ldb = 3, panels = 4;
  const p = 5, k = 6, s = 7;
  const code = forLoop(p, op.i32(0), op.get(panels), op.i32(1), [
    ...op.get(b), ...op.get(p), ...op.get(ldb), ...op.i32(8), ...op.mul, ...op.mul, ...op.add, ...op.set(s),
    ...forLoop(k, op.i32(0), op.get(K), op.i32(1), [
      ...Array.from({ length: 8 }, (_, c) => [
        ...op.get(dst),
        ...op.get(s), ...(c ? [...op.get(ldb), ...op.i32(c), ...op.mul, ...op.add] : []), ...op.f32load(),
        ...op.f32store(4 * c),
      ]).flat(),
      ...op.get(s), ...op.i32(4), ...op.add, ...op.set(s),
      ...op.get(dst), ...op.i32(32), ...op.add, ...op.set(dst),
    ]),
  ]);
  return { locals: [[3, I32]], code };
}

/** copyRows(dst, dstStride, src, srcStride, rowBytes, rows). */
function copyRowsBody(): { locals: number[][]; code: number[] } {
  const dst = 0, ds = 1, src = 2, ss = 3, n = 4, rows = 5;
  const r = 6;
  const code = forLoop(r, op.i32(0), op.get(rows), op.i32(1), [
    ...op.get(dst), ...op.get(src), ...op.get(n), ...op.memoryCopy,
    ...op.get(dst), ...op.get(ds), ...op.add, ...op.set(dst),
    ...op.get(src), ...op.get(ss), ...op.add, ...op.set(src),
  ]);
  return { locals: [[1, I32]], code };
}

/** swiglu(gu, y, rows, I) and, with grad, swigluGrad(gu, dy, dgu, rows, I): row by row, four lanes
 *  at a time. Pointers in bytes; I in floats. */
function swigluBody(grad: boolean): { locals: number[][]; code: number[] } {
  const gu = 0, dy = 1, out = grad ? 2 : 1, rows = grad ? 3 : 2, I = grad ? 4 : 3;
  let n = I + 1;
  const r = n++, j = n++, pg = n++, pd = n++, po = n++, half = n++;
  const nI32 = n - I - 1;
  const g = n++, u = n++, s = n++, x = n++, e = n++, d = n++, o = n++, f = n++;
  const c = new Consts(n), one = c.f32(1);
  const at = (p: number, extra: number[] = []) => [...op.get(p), ...op.get(j), ...op.add, ...extra];
  const sigmoid = [...op.get(g), ...v.fneg, ...vexp(c, x, e, o, f), ...op.set(e)];
  const body = grad
    ? [
        ...at(pg), ...v.load(), ...op.set(g), ...at(pg, [...op.get(half), ...op.add]), ...v.load(), ...op.set(u), ...at(pd), ...v.load(), ...op.set(d),
        ...sigmoid, ...one, ...one, ...op.get(e), ...v.fadd, ...v.fdiv, ...op.set(s),
        // d gate = d·u·s·(1 + g·(1 − s)), d up = d·g·s
        ...at(po), ...op.get(d), ...op.get(u), ...v.fmul, ...op.get(s), ...v.fmul,
        ...one, ...op.get(g), ...one, ...op.get(s), ...v.fsub, ...v.fmul, ...v.fadd, ...v.fmul, ...v.store(),
        ...at(po, [...op.get(half), ...op.add]), ...op.get(d), ...op.get(g), ...v.fmul, ...op.get(s), ...v.fmul, ...v.store(),
      ]
    : [
        ...at(pg), ...v.load(), ...op.set(g), ...at(pg, [...op.get(half), ...op.add]), ...v.load(), ...op.set(u),
        ...sigmoid,
        // g / (1 + e) · u
        ...at(po), ...op.get(g), ...one, ...op.get(e), ...v.fadd, ...v.fdiv, ...op.get(u), ...v.fmul, ...v.store(),
      ];
  // po/pd advance by a row of the output/dy (4I bytes, or 8I for dgu); pg by a row of gu (8I)
  const code = [
    ...c.init(),
    ...op.get(I), ...op.i32(4), ...op.mul, ...op.set(half),
    ...op.get(gu), ...op.set(pg), ...op.get(out), ...op.set(po), ...(grad ? [...op.get(dy), ...op.set(pd)] : []),
    ...forLoop(r, op.i32(0), op.get(rows), op.i32(1), [
      ...forLoop(j, op.i32(0), op.get(half), op.i32(16), body),
      ...op.get(pg), ...op.get(half), ...op.get(half), ...op.add, ...op.add, ...op.set(pg),
      ...op.get(po), ...op.get(half), ...(grad ? [...op.get(half), ...op.add] : []), ...op.add, ...op.set(po),
      ...(grad ? [...op.get(pd), ...op.get(half), ...op.add, ...op.set(pd)] : []),
    ]),
  ];
  return { locals: [[nI32, I32], [n - I - 1 - nI32 + c.count, V128]], code };
}

/** Horizontal reduction of the v128 local acc with the scalar op f (f32.add 0x92, f32.max 0x97):
 *  f(f(l0, l1), f(l2, l3)). */
const hreduce = (acc: number, f: number) => [...op.get(acc), ...v.lane(0), ...op.get(acc), ...v.lane(1), f, ...op.get(acc), ...v.lane(2), ...op.get(acc), ...v.lane(3), f, f];

/** rowStats(x, out, rows, V) and, with softmax, softmaxRows(x, coef, out, rows, V). */
function rowsBody(softmax: boolean): { locals: number[][]; code: number[] } {
  const x = 0, coef = 1, out = softmax ? 2 : 1, rows = softmax ? 3 : 2, V = softmax ? 4 : 3;
  let n = V + 1;
  const r = n++, j = n++, px = n++, po = n++, vb = n++;
  const nI32 = n - V - 1;
  const m = n++, c = n++;
  const acc = n++, acc2 = n++, xv = n++, mv = n++, t1 = n++, t2 = n++, cv = n++, t3 = n++, t4 = n++;
  const k = new Consts(n);
  const at = (p: number) => [...op.get(p), ...op.get(j), ...op.add];
  const rowLoop = (body: number[]) => forLoop(j, op.i32(0), op.get(vb), op.i32(16), body);
  const ex = [...at(px), ...v.load(), ...op.tee(xv), ...op.get(mv), ...v.fsub, ...vexp(k, t1, t2, t3, t4)]; // exp(x − m)
  const code = [
    ...op.get(V), ...op.i32(4), ...op.mul, ...op.set(vb),
    ...op.get(x), ...op.set(px), ...op.get(out), ...op.set(po),
    ...forLoop(r, op.i32(0), op.get(rows), op.i32(1), [
      ...f32x4(-Infinity), ...op.set(acc),
      ...rowLoop([...at(px), ...v.load(), ...op.get(acc), ...v.pmax, ...op.set(acc)]),
      ...hreduce(acc, 0x97), ...op.tee(m), ...v.fsplat, ...op.set(mv),
      ...v.zero, ...op.set(acc), ...v.zero, ...op.set(acc2),
      ...(softmax
        ? [
            // out = exp(x − m), summed; then out ·= coef[r] / s in place
            ...rowLoop([...at(po), ...ex, ...op.tee(t1), ...v.store(), ...op.get(t1), ...op.get(acc), ...v.fadd, ...op.set(acc)]),
            ...op.get(coef), ...op.get(r), ...op.i32(4), ...op.mul, ...op.add, ...op.f32load(), ...hreduce(acc, 0x92), 0x95, ...op.set(c),
            ...op.get(c), ...v.fsplat, ...op.set(cv),
            ...rowLoop([...at(po), ...at(po), ...v.load(), ...op.get(cv), ...v.fmul, ...v.store()]),
            ...op.get(po), ...op.get(vb), ...op.add, ...op.set(po),
          ]
        : [
            ...rowLoop([...ex, ...op.tee(t1), ...op.get(acc), ...v.fadd, ...op.set(acc), ...op.get(t1), ...op.get(xv), ...v.fmul, ...op.get(acc2), ...v.fadd, ...op.set(acc2)]),
            ...op.get(po), ...op.get(m), ...op.f32store(0),
            ...op.get(po), ...hreduce(acc, 0x92), ...op.f32store(4),
            ...op.get(po), ...hreduce(acc2, 0x92), ...op.f32store(8),
            ...op.get(po), ...op.i32(12), ...op.add, ...op.set(po),
          ]),
      ...op.get(px), ...op.get(vb), ...op.add, ...op.set(px),
    ]),
  ];
  return { locals: [[nI32, I32], [2, F32], [9 + k.count, V128]], code: [...k.init(), ...code] };
}

/** softmaxGrad(y, dy, dx, rows, S). */
function softmaxGradBody(): { locals: number[][]; code: number[] } {
  const y = 0, dy = 1, dx = 2, rows = 3, S = 4;
  const r = 5, j = 6, sb = 7;
  const acc = 8, dot = 9;
  const at = (p: number) => [...op.get(p), ...op.get(j), ...op.add];
  const rowLoop = (body: number[]) => forLoop(j, op.i32(0), op.get(sb), op.i32(16), body);
  const code = [
    ...op.get(S), ...op.i32(4), ...op.mul, ...op.set(sb),
    ...forLoop(r, op.i32(0), op.get(rows), op.i32(1), [
      ...v.zero, ...op.set(acc),
      ...rowLoop([...at(y), ...v.load(), ...at(dy), ...v.load(), ...v.fmul, ...op.get(acc), ...v.fadd, ...op.set(acc)]),
      ...hreduce(acc, 0x92), ...v.fsplat, ...op.set(dot),
      ...rowLoop([...at(dx), ...at(dy), ...v.load(), ...op.get(dot), ...v.fsub, ...at(y), ...v.load(), ...v.fmul, ...v.store()]),
      ...[y, dy, dx].flatMap((p) => [...op.get(p), ...op.get(sb), ...op.add, ...op.set(p)]),
    ]),
  ];
  return { locals: [[3, I32], [2, V128]], code };
}

/** rmsNorm(x, w, y, rows, H, eps) and, with grad, rmsNormGrad(x, w, dy, dx, dw, rows, H, eps). */
function rmsNormBody(grad: boolean): { locals: number[][]; code: number[] } {
  const x = 0, w = 1, dy = 2, out = grad ? 3 : 2, dw = 4, rows = grad ? 5 : 3, H = grad ? 6 : 4, eps = grad ? 7 : 5;
  let n = eps + 1;
  const r = n++, j = n++, px = n++, pd = n++, po = n++, hb = n++;
  const rr = n++, c = n++;
  const acc = n++, acc2 = n++, xv = n++, dv = n++, rv = n++, cv = n++;
  const at = (p: number) => [...op.get(p), ...op.get(j), ...op.add];
  const rowLoop = (body: number[]) => forLoop(j, op.i32(0), op.get(hb), op.i32(16), body);
  const f32 = { add: [0x92], mul: [0x94], div: [0x95], sqrt: [0x91], fromI32: [0xb2], one: [0x43, ...new Uint8Array(new Float32Array([1]).buffer)] };
  // rr = 1 / √(Σx² / H + eps)
  const rms = [...f32.one, ...hreduce(acc, 0x92), ...op.get(H), ...f32.fromI32, ...f32.div, ...op.get(eps), ...f32.add, ...f32.sqrt, ...f32.div, ...op.set(rr)];
  const code = [
    ...op.get(H), ...op.i32(4), ...op.mul, ...op.set(hb),
    ...op.get(x), ...op.set(px), ...op.get(out), ...op.set(po), ...(grad ? [...op.get(dy), ...op.set(pd), ...rowLoop([...at(dw), ...v.zero, ...v.store()])] : []),
    ...forLoop(r, op.i32(0), op.get(rows), op.i32(1), [
      ...v.zero, ...op.set(acc), ...v.zero, ...op.set(acc2),
      ...(grad
        ? [
            ...rowLoop([
              ...at(px), ...v.load(), ...op.tee(xv), ...op.get(xv), ...v.fmul, ...op.get(acc), ...v.fadd, ...op.set(acc),
              ...at(pd), ...v.load(), ...at(w), ...v.load(), ...v.fmul, ...op.get(xv), ...v.fmul, ...op.get(acc2), ...v.fadd, ...op.set(acc2),
            ]),
            ...rms,
            // c = rr³ · Σ(dy·w·x) / H
            ...op.get(rr), ...op.get(rr), ...f32.mul, ...op.get(rr), ...f32.mul, ...hreduce(acc2, 0x92), ...f32.mul, ...op.get(H), ...f32.fromI32, ...f32.div, ...op.set(c),
            ...op.get(rr), ...v.fsplat, ...op.set(rv), ...op.get(c), ...v.fsplat, ...op.set(cv),
            ...rowLoop([
              ...at(px), ...v.load(), ...op.set(xv), ...at(pd), ...v.load(), ...op.set(dv),
              ...at(po), ...op.get(rv), ...op.get(dv), ...v.fmul, ...at(w), ...v.load(), ...v.fmul, ...op.get(cv), ...op.get(xv), ...v.fmul, ...v.fsub, ...v.store(),
              ...at(dw), ...at(dw), ...v.load(), ...op.get(dv), ...op.get(xv), ...v.fmul, ...op.get(rv), ...v.fmul, ...v.fadd, ...v.store(),
            ]),
            ...op.get(pd), ...op.get(hb), ...op.add, ...op.set(pd),
          ]
        : [
            ...rowLoop([...at(px), ...v.load(), ...op.tee(xv), ...op.get(xv), ...v.fmul, ...op.get(acc), ...v.fadd, ...op.set(acc)]),
            ...rms, ...op.get(rr), ...v.fsplat, ...op.set(rv),
            ...rowLoop([...at(po), ...at(px), ...v.load(), ...op.get(rv), ...v.fmul, ...at(w), ...v.load(), ...v.fmul, ...v.store()]),
          ]),
      ...op.get(px), ...op.get(hb), ...op.add, ...op.set(px),
      ...op.get(po), ...op.get(hb), ...op.add, ...op.set(po),
    ]),
  ];
  return { locals: [[6, I32], [2, F32], [6, V128]], code };
}

export interface GemmModuleOptions {
  /** Rows per block of `tile` (the vector registers hold 2·MR accumulators). */
  mr: number;
  /** The imported memory: shared (the threaded build) or not, and its page limits. */
  memory: { shared: boolean; initial: number; maximum: number };
}

export function gemmModuleBytes(o: GemmModuleOptions): Uint8Array {
  const sig = [0x60, ...vec(new Array(NPARAMS).fill([I32])), 0];
  const packSig = [0x60, ...vec(new Array(5).fill([I32])), 0];
  const copySig = [0x60, ...vec(new Array(6).fill([I32])), 0];
  const limits = o.memory.shared ? [0x03, ...uleb(o.memory.initial), ...uleb(o.memory.maximum)] : [0x01, ...uleb(o.memory.initial), ...uleb(o.memory.maximum)];
  const swigluSig = [0x60, ...vec(new Array(4).fill([I32])), 0];
  const swigluGradSig = [0x60, ...vec(new Array(5).fill([I32])), 0];
  const normSig = [0x60, ...vec([[I32], [I32], [I32], [I32], [I32], [F32]]), 0];
  const normGradSig = [0x60, ...vec([[I32], [I32], [I32], [I32], [I32], [I32], [I32], [F32]]), 0];
  const bodies = [tileBody(o.mr), tileBody(1), packBody(), packTBody(), copyRowsBody(), swigluBody(false), swigluBody(true), rowsBody(false), rowsBody(true), rmsNormBody(false), rmsNormBody(true), softmaxGradBody()].map(({ locals, code }) => {
    const body = [...vec(locals.map(([c, t]) => [...uleb(c), t])), ...code, ...op.end];
    return [...uleb(body.length), ...body];
  });
  const names = ["tile", "tile1", "pack", "packT", "copyRows", "swiglu", "swigluGrad", "rowStats", "softmaxRows", "rmsNorm", "rmsNormGrad", "softmaxGrad"];
  const types: Record<string, number> = { tile: 0, tile1: 0, pack: 1, packT: 1, copyRows: 2, swiglu: 3, swigluGrad: 4, rowStats: 3, softmaxRows: 4, rmsNorm: 5, rmsNormGrad: 6, softmaxGrad: 4 };
  return Uint8Array.from([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
    ...section(1, vec([sig, packSig, copySig, swigluSig, swigluGradSig, normSig, normGradSig])),
    ...section(2, vec([[...str("env"), ...str("memory"), 0x02, ...limits]])),
    ...section(3, vec(names.map((nm) => [types[nm]]))),
    ...section(7, vec(names.map((nm, idx) => [...str(nm), 0x00, idx]))),
    ...section(10, vec(bodies)),
  ]);
}
