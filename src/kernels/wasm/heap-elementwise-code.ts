/** The element-wise kernel of the heap module, as instructions: a float32 binary op (add, sub, mul)
 *  over rows with a broadcast operand. Its contract is described in heap-code.ts. */
import { I32, op, v, forLoop } from "./asm.ts";

/** Binary ops by code (the `op` argument of binary): 0 add, 1 sub (a − b), 2 mul; +3: b is one value. */
export const BINARY_OPS = { Add: 0, Sub: 1, Multiply: 2 } as const;
const F32_OPS = [0x92, 0x93, 0x94]; // f32.add, f32.sub, f32.mul
const V_OPS = [v.fadd, v.fsub, v.fmul];
const i32 = { divU: [0x6e], and: [0x71], eq: [0x46] };

/** binary(a, b, out, r0, r1, W, rep, bs, op): rows r0..r1 − 1 of [rows, W]: out[r, j] = a[r, j] op
 *  b[⌊r / rep⌋·bs + j] (bs in bytes: 4W is the same shape, 0 one row for all), or op b[⌊r / rep⌋·bs]
 *  with op ≥ 3 (one value per group of rows). Four lanes at a time, the last W mod 4 one by one. */
export function binaryBody(): { locals: number[][]; code: number[] } {
  const a = 0,
    b = 1,
    out = 2,
    r0 = 3,
    r1 = 4,
    W = 5,
    rep = 6,
    bs = 7,
    code = 8;
  const r = 9,
    j = 10,
    pa = 11,
    pb = 12,
    po = 13,
    wb = 14,
    w4b = 15;
  const at = (p: number) => [...op.get(p), ...op.get(j), ...op.add];
  const variant = (k: number) => {
    const scalar = k >= 3,
      f = k % 3;
    const bv = scalar ? [...op.get(pb), ...v.splat32()] : [...at(pb), ...v.load()];
    const bs1 = scalar ? [...op.get(pb), ...op.f32load()] : [...at(pb), ...op.f32load()];
    return [
      ...op.get(code),
      ...op.i32(k),
      ...i32.eq,
      ...op.if,
      ...forLoop(j, op.i32(0), op.get(w4b), op.i32(16), [...at(po), ...at(pa), ...v.load(), ...bv, ...V_OPS[f], ...v.store()]),
      ...forLoop(j, op.get(w4b), op.get(wb), op.i32(4), [...at(po), ...at(pa), ...op.f32load(), ...bs1, F32_OPS[f], ...op.f32store()]),
      ...op.end,
    ];
  };
  const body = [
    // pa = a + r·4W, po = out + r·4W, pb = b + ⌊r / rep⌋·bs
    ...op.get(a),
    ...op.get(r),
    ...op.get(wb),
    ...op.mul,
    ...op.add,
    ...op.set(pa),
    ...op.get(out),
    ...op.get(r),
    ...op.get(wb),
    ...op.mul,
    ...op.add,
    ...op.set(po),
    ...op.get(b),
    ...op.get(r),
    ...op.get(rep),
    ...i32.divU,
    ...op.get(bs),
    ...op.mul,
    ...op.add,
    ...op.set(pb),
    ...[0, 1, 2, 3, 4, 5].flatMap(variant),
  ];
  return {
    locals: [[7, I32]],
    code: [
      ...op.get(W),
      ...op.i32(4),
      ...op.mul,
      ...op.tee(wb),
      ...op.i32(-16),
      ...i32.and,
      ...op.set(w4b),
      ...forLoop(r, op.get(r0), op.get(r1), op.i32(1), body),
    ],
  };
}
