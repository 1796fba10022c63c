/** The dequantization kernels of the heap module, as instructions: int8 and NF4 codes packed in int32
 *  words (quant.ts' slab layout) to float32, four columns at a time. Their contract is described in
 *  heap-code.ts; dequant.ts holds the JS form they match bit for bit (each weight one float32 product).
 *  NF4's table is looked up one lane at a time from 16 floats in the heap: spreading each code over its
 *  lane's bytes and taking the value's four bytes from four 16-byte planes of the table (i8x16.swizzle
 *  ×4, no loads) ran 5–8% slower (one thread, 0.5B shapes: 1.22–1.39 vs 1.16–1.33 ns per weight). */
import { I32, V128, op, v, Consts, forLoop } from "./asm.ts";

const i32 = { sub: [0x6b], and: [0x71], shl: [0x74], divU: [0x6e], load: [0x28, 2, 0] };
const f32 = { mul: [0x94], convertS: [0xb2] };
const x4 = {
  and: op.simd(0x4e),
  xor: op.simd(0x51),
  shl: op.simd(0xab), // i32x4.shl
  shrS: op.simd(0xac),
  shrU: op.simd(0xad),
  convertS: op.simd(0xfa), // f32x4.convert_i32x4_s
  laneI32: (l: number) => [...op.simd(0x1b), l], // i32x4.extract_lane
  replaceF32: (l: number) => [...op.simd(0x20), l], // f32x4.replace_lane
};

/** dequantInt8 / dequantNf4(packed, scales, out, i0, i1, P, n, inDim, block, tab): packed rows i0..i1 − 1
 *  of packed int32 [P, n]; field k of packed[i, j] (8 or 4 bits from bit 8k or 4k) is the code of
 *  output row r = k·P + i, kept where r < inDim. int8: out[r, j] = (code − 128) · scales[j]; NF4:
 *  out[r, j] = table[code] · scales[⌊r / block⌋, j], tab the table's 16 float32 values. Four columns
 *  at a time, the last n mod 4 one by one; a packed row is read once per field (it stays in L1).
 *  Pointers in bytes. */
export function dequantBody(kind: "int8" | "nf4"): { locals: number[][]; code: number[] } {
  const packed = 0,
    scales = 1,
    out = 2,
    i0 = 3,
    i1 = 4,
    P = 5,
    n = 6,
    inDim = 7,
    block = 8,
    tab = 9;
  let x = 10;
  const i = x++,
    k = x++,
    r = x++,
    j = x++,
    src = x++,
    dst = x++,
    sp = x++,
    shift = x++,
    nb = x++,
    n4b = x++;
  const nI32 = x - 10;
  const w = x++,
    c4 = x++;
  const c = new Consts(x);
  const g = op.get;
  const nf4 = kind === "nf4",
    bits = nf4 ? 4 : 8,
    per = 32 / bits;
  const at = (p: number) => [...g(p), ...g(j), ...op.add];
  // one vector of 4 outputs from the packed words w (int8: already xor 0x80808080) and the shift
  let decode: number[];
  if (!nf4) {
    // (w ^ 0x80…) << (24 − shift) >>s 24: the byte as a signed value, u − 128 for offset binary u
    decode = [...g(w), ...op.i32(24), ...g(shift), ...i32.sub, ...x4.shl, ...op.i32(24), ...x4.shrS, ...x4.convertS];
  } else {
    // c4 = 4·code; each lane's value loaded from tab + c4
    const lane = (l: number) => [...g(tab), ...g(c4), ...x4.laneI32(l), ...op.add, ...op.f32load()];
    decode = [
      ...g(w),
      ...g(shift),
      ...x4.shrU,
      ...c.i32(15),
      ...x4.and,
      ...op.i32(2),
      ...x4.shl,
      ...op.set(c4),
      ...lane(0),
      ...v.fsplat,
      ...[1, 2, 3].flatMap((l) => [...lane(l), ...x4.replaceF32(l)]),
    ];
  }
  const vec = forLoop(j, op.i32(0), g(n4b), op.i32(16), [
    ...at(dst),
    ...at(src),
    ...v.load(),
    ...(nf4 ? [] : [...c.i32(0x80808080 | 0), ...x4.xor]),
    ...op.set(w),
    ...decode,
    ...at(sp),
    ...v.load(),
    ...v.fmul,
    ...v.store(),
  ]);
  const field = [...at(src), ...i32.load, ...g(shift), ...op.shrU, ...op.i32(nf4 ? 15 : 255), ...i32.and];
  const one = nf4
    ? [...g(tab), ...field, ...op.i32(2), ...i32.shl, ...op.add, ...op.f32load()]
    : [...field, ...op.i32(128), ...i32.sub, ...f32.convertS];
  const tail = forLoop(j, g(n4b), g(nb), op.i32(4), [...at(dst), ...one, ...at(sp), ...op.f32load(), ...f32.mul, ...op.f32store()]);
  const rowK = [
    // r = k·P + i; rows from inDim on are padding
    ...g(k),
    ...g(P),
    ...op.mul,
    ...g(i),
    ...op.add,
    ...op.tee(r),
    ...g(inDim),
    ...op.ltU,
    ...op.if,
    ...g(k),
    ...op.i32(bits),
    ...op.mul,
    ...op.set(shift),
    ...g(out),
    ...g(r),
    ...g(nb),
    ...op.mul,
    ...op.add,
    ...op.set(dst),
    ...g(scales),
    ...(nf4 ? [...g(r), ...g(block), ...i32.divU, ...g(nb), ...op.mul, ...op.add] : []),
    ...op.set(sp),
    ...vec,
    ...tail,
    ...op.end,
  ];
  const code = [
    ...c.init(),
    ...g(n),
    ...op.i32(4),
    ...op.mul,
    ...op.tee(nb),
    ...op.i32(-16),
    ...i32.and,
    ...op.set(n4b),
    ...forLoop(i, g(i0), g(i1), op.i32(1), [
      ...g(packed),
      ...g(i),
      ...g(nb),
      ...op.mul,
      ...op.add,
      ...op.set(src),
      ...forLoop(k, op.i32(0), op.i32(per), op.i32(1), rowK),
    ]),
  ];
  return {
    locals: [
      [nI32, I32],
      [2 + c.count, V128],
    ],
    code,
  };
}
