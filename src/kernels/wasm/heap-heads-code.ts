/** The attention heads kernels of the heap module, as instructions: seqHeads and its gradient over rows
 *  [n0, n1) of the fused projection (heads.ts holds their JS form and the op path they match). Their
 *  contracts are described in heap-code.ts. */
import { I32, V128, F32, op, v, forLoop } from "./asm.ts";

const i32 = { sub: [0x6b], divU: [0x6e] };
const select = [0x1b];
const replaceLane = (l: number) => [...op.simd(0x20), l]; // f32x4.replace_lane
/** The product of the i32 values each piece pushes. */
const mul = (...xs: number[][]) => xs.flatMap((x, i) => (i ? [...x, ...op.mul] : x));
const add = (...xs: number[][]) => xs.flatMap((x, i) => (i ? [...x, ...op.add] : x));

/** seqHeads(qkv, cos, sin, q, kT, v, n0, n1, T, nH, nKv, hd, scale) and, with grad, seqHeadsGrad(dq,
 *  dkT, dv, cos, sin, dqkv, n0, n1, T, nH, nKv, hd, scale): row n = b·T + t at a time, four lanes of
 *  a head at a time (hd a multiple of 8, so a lane group and its rotate-half partner lie in one half).
 *  Pointers in bytes. kT's four lanes are four stores (or loads) T floats apart. */
export function seqHeadsBody(grad: boolean): { locals: number[][]; code: number[] } {
  // parameters: the six pointers, in the order above
  const [qkv, cos, sin, q, kT, vv] = grad ? [5, 3, 4, 0, 1, 2] : [0, 1, 2, 3, 4, 5];
  const n0 = 6,
    n1 = 7,
    T = 8,
    nH = 9,
    nKv = 10,
    hd = 11,
    scale = 12;
  let k = 13;
  const n = k++,
    b = k++,
    t = k++,
    h = k++,
    j = k++,
    jr = k++,
    row = k++,
    cs = k++,
    sn = k++,
    hp = k++,
    d = k++,
    hb = k++,
    half = k++,
    nHK = k++;
  const nI32 = k - 13;
  const sv = k++,
    r = k++;
  const g = op.get;
  const load = (p: number, at: number) => [...add(g(p), g(at)), ...v.load()];
  // kT's element (j/4 + l, t) of the head at d: byte d + (at + 4l)·T, `at` the lane group's byte offset j
  const kAt = (at: number, l: number) => add(g(d), mul(l ? add(g(at), op.i32(4 * l)) : g(at), g(T)));
  const gather = (at: number) => [
    ...kAt(at, 0),
    ...op.f32load(),
    ...v.fsplat,
    ...[1, 2, 3].flatMap((l) => [...kAt(at, l), ...op.f32load(), ...replaceLane(l)]),
  ];
  const jrSet = [...add(g(j), g(half)), ...g(j), ...g(half), ...i32.sub, ...g(j), ...g(half), ...op.ltU, ...select, ...op.set(jr)];
  const lanes = (body: number[]) => forLoop(j, op.i32(0), g(hb), op.i32(16), [...jrSet, ...body]);
  // the head's place in q / dq (B, nH, T, hd) and kT / dkT (B, nKv, hd, T); h counts q's heads then k's
  const qHead = add(g(q), mul(add(mul(add(mul(g(b), g(nH)), g(h)), g(T)), g(t)), g(hb)));
  const kIndex = [...add(mul(g(b), g(nKv)), g(h)), ...g(nH), ...i32.sub]; // b·nKv + h − nH
  const kHead = add(g(kT), mul(add(mul(kIndex, g(hd), g(T)), g(t)), op.i32(4)));
  const vHead = add(g(vv), mul(add(mul(add(mul(g(b), g(nKv)), g(h)), g(T)), g(t)), g(hb)));
  const scaled = (x: number[]) => [...x, ...g(sv), ...v.fmul];
  // x·cos[j] + xr·sin[j or jr] in float32: each product, then the sum, rounded (the op path's Multiply, Multiply, Add)
  const rot = (x: number[], xr: number[], sinAt: number) => [
    ...x,
    ...load(cs, j),
    ...v.fmul,
    ...xr,
    ...load(sn, sinAt),
    ...v.fmul,
    ...v.fadd,
  ];
  const heads = (from: number[], to: number[], body: number[]) =>
    forLoop(h, from, to, op.i32(1), [...add(g(row), mul(g(h), g(hb))), ...op.set(hp), ...body]);
  const perRow = grad
    ? [
        ...heads(op.i32(0), g(nH), [
          ...qHead,
          ...op.set(d),
          ...lanes([...add(g(hp), g(j)), ...rot(scaled(load(d, j)), scaled(load(d, jr)), jr), ...v.store()]),
        ]),
        ...heads(g(nH), g(nHK), [...kHead, ...op.set(d), ...lanes([...add(g(hp), g(j)), ...rot(gather(j), gather(jr), jr), ...v.store()])]),
        ...forLoop(h, op.i32(0), g(nKv), op.i32(1), [...add(g(row), mul(add(g(nHK), g(h)), g(hb))), ...vHead, ...g(hb), ...op.memoryCopy]),
      ]
    : [
        ...heads(op.i32(0), g(nH), [
          ...qHead,
          ...op.set(d),
          ...lanes([...add(g(d), g(j)), ...scaled(rot(load(hp, j), load(hp, jr), j)), ...v.store()]),
        ]),
        ...heads(g(nH), g(nHK), [
          ...kHead,
          ...op.set(d),
          ...lanes([
            ...rot(load(hp, j), load(hp, jr), j),
            ...op.set(r),
            ...[0, 1, 2, 3].flatMap((l) => [...kAt(j, l), ...g(r), ...v.lane(l), ...op.f32store()]),
          ]),
        ]),
        ...forLoop(h, op.i32(0), g(nKv), op.i32(1), [...vHead, ...add(g(row), mul(add(g(nHK), g(h)), g(hb))), ...g(hb), ...op.memoryCopy]),
      ];
  const code = [
    ...mul(g(hd), op.i32(4)),
    ...op.set(hb),
    ...mul(g(hd), op.i32(2)),
    ...op.set(half),
    ...add(g(nH), g(nKv)),
    ...op.set(nHK),
    ...g(scale),
    ...v.fsplat,
    ...op.set(sv),
    ...forLoop(n, g(n0), g(n1), op.i32(1), [
      ...g(n),
      ...g(T),
      ...i32.divU,
      ...op.set(b),
      ...g(n),
      ...mul(g(b), g(T)),
      ...i32.sub,
      ...op.set(t),
      // row: n's row of qkv (dqkv), (nH + 2·nKv)·hd floats; cs, sn: its tables' rows
      ...add(g(qkv), mul(g(n), g(hb), add(g(nHK), g(nKv)))),
      ...op.set(row),
      ...add(g(cos), mul(g(n), g(hb))),
      ...op.set(cs),
      ...add(g(sin), mul(g(n), g(hb))),
      ...op.set(sn),
      ...perRow,
    ]),
  ];
  return {
    locals: [
      [nI32, I32],
      [2, V128],
    ],
    code,
  };
}

/** The signature of both: 12 i32 and the scale (f32). */
export const SEQ_HEADS_SIG = [0x60, 13, ...new Array(12).fill(I32), F32, 0];
