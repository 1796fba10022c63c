/** A small WebAssembly assembler: LEB128 numbers, sections, and helpers for the instructions the heap
 *  module's kernels use (locals, loads and stores, loops, v128 lanes, Cephes' expf on four lanes).
 *  Only what the kernels need; no validation beyond what WebAssembly.Module does on the bytes. */
export const I32 = 0x7f,
  F32 = 0x7d,
  V128 = 0x7b;

export function uleb(n: number): number[] {
  const out: number[] = [];
  do {
    let b = n & 0x7f;
    n >>>= 7;
    if (n) b |= 0x80;
    out.push(b);
  } while (n);
  return out;
}
export function sleb(n: number): number[] {
  const out: number[] = [];
  for (;;) {
    const b = n & 0x7f;
    n >>= 7;
    if ((n === 0 && !(b & 0x40)) || (n === -1 && b & 0x40)) return (out.push(b), out);
    out.push(b | 0x80);
  }
}
export const str = (s: string) => [...uleb(s.length), ...Buffer.from(s, "utf8")];
export const section = (id: number, body: number[]) => [id, ...uleb(body.length), ...body];
export const vec = (items: number[][]) => [...uleb(items.length), ...items.flat()];

/** Instruction helpers (only what the kernels use). */
export const op = {
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
export const f32x4 = (x: number) => [...op.simd(0x0c), ...[...new Uint8Array(new Float32Array([x, x, x, x]).buffer)]];
export const i32x4 = (x: number) => [...op.simd(0x0c), ...[...new Uint8Array(new Int32Array([x, x, x, x]).buffer)]];
export const v = {
  load: (off = 0) => [...op.simd(0x00), 2, ...uleb(off)],
  store: (off = 0) => [...op.simd(0x0b), 2, ...uleb(off)],
  splat32: (off = 0) => [...op.simd(0x09), 2, ...uleb(off)], // v128.load32_splat
  zero: [...op.simd(0x0c), ...new Array(16).fill(0)],
  fadd: op.simd(0xe4),
  fmul: op.simd(0xe6),
  fmadd: op.simd(0x105), // f32x4.relaxed_madd(a, b, c) = a · b + c (relaxed SIMD; fused where the CPU has FMA)
  fsub: op.simd(0xe5),
  fdiv: op.simd(0xe7),
  fneg: op.simd(0xe1),
  fmin: op.simd(0xe8),
  fmax: op.simd(0xe9),
  fsplat: op.simd(0x13),
  lane: (i: number) => [...op.simd(0x1f), i], // f32x4.extract_lane
  replaceLane: (i: number) => [...op.simd(0x20), i], // f32x4.replace_lane (v128, f32 → v128)
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
export class Consts {
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
 *  subtracting 1.5·2^23 (the float's low bits then hold n, so 2^n needs no float-to-int conversion).
 *  relaxed: the polynomial's Horner steps as fused multiply-adds (madd). */
export function vexp(c: Consts, x: number, n: number, o: number, f: number, relaxed = false): number[] {
  const poly = [1.98756915e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1];
  const MAGIC = 12582912; // 1.5 · 2^23
  return [
    // pmax(x, −87) = x < −87 ? −87 : x; pmin(x, 88) = 88 < x ? 88 : x (NaN passes both)
    ...op.tee(o),
    ...c.f32(-87),
    ...v.pmax,
    ...c.f32(88),
    ...v.pmin,
    ...op.set(x),
    // n = round(x·log2 e), as n + 1.5·2^23 (kept in n: its bits hold 0x4B400000 + n)
    ...op.get(x),
    ...c.f32(Math.LOG2E),
    ...v.fmul,
    ...c.f32(MAGIC),
    ...v.fadd,
    ...op.set(n),
    // x − n·ln2 in two parts (0.693359375 is exact in few bits), n as a float on the stack twice
    ...op.get(x),
    ...op.get(n),
    ...c.f32(MAGIC),
    ...v.fsub,
    ...op.tee(f),
    ...c.f32(0.693359375),
    ...v.fmul,
    ...v.fsub,
    ...op.get(f),
    ...c.f32(-2.1219444e-4),
    ...v.fmul,
    ...v.fsub,
    ...op.set(x),
    ...c.f32(poly[0]),
    ...poly.slice(1).flatMap((p) => [...op.get(x), ...madd(relaxed, c.f32(p))]),
    ...op.get(x),
    ...v.fmul,
    ...op.get(x),
    ...v.fmul,
    ...op.get(x),
    ...v.fadd,
    ...c.f32(1),
    ...v.fadd,
    // · 2^n: (bits + 127) << 23 drops the magic number's bits and leaves n + 127 in the exponent
    ...op.get(n),
    ...c.i32(127),
    ...v.iadd,
    ...op.i32(23),
    ...v.ishl,
    ...v.fmul,
    // and 0 where the argument was below −87 (a NaN argument compares false: kept)
    ...op.get(o),
    ...c.f32(-87),
    ...v.flt,
    ...v.andnot,
  ];
}

/** a · b + (addend) for the two vectors on the stack: one f32x4.relaxed_madd in the relaxed build
 *  (fused where the CPU has FMA: one rounding), a multiply then an add otherwise. `addend` pushes one
 *  vector and has no other effect. */
export function madd(relaxed: boolean, addend: number[]): number[] {
  return relaxed ? [...addend, ...v.fmadd] : [...v.fmul, ...addend, ...v.fadd];
}

export function forLoop(x: number, from: number[], limit: number[], step: number[], body: number[]): number[] {
  return [
    ...from,
    ...op.set(x),
    ...op.get(x),
    ...limit,
    ...op.ltU,
    ...op.if,
    ...op.loop,
    ...body,
    ...op.get(x),
    ...step,
    ...op.add,
    ...op.tee(x),
    ...limit,
    ...op.ltU,
    ...op.brIf(0),
    ...op.end,
    ...op.end,
  ];
}

// Parameters of every export.

/** Horizontal reduction of the v128 local acc with the scalar op f (f32.add 0x92, f32.max 0x97):
 *  f(f(l0, l1), f(l2, l3)). */
export const hreduce = (acc: number, f: number) => [
  ...op.get(acc),
  ...v.lane(0),
  ...op.get(acc),
  ...v.lane(1),
  f,
  ...op.get(acc),
  ...v.lane(2),
  ...op.get(acc),
  ...v.lane(3),
  f,
  f,
];
