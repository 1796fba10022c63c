/** The row kernels of the heap module, as instructions: copyRows, SwiGLU (and its gradient), row
 *  statistics and softmax, softmax's gradient (RMSNorm's are in heap-norm-code.ts). Sums over a row go four
 *  lanes at a time; their contracts are described in heap-code.ts. */
import { I32, op, f32x4, v, Consts, vexp, forLoop, hreduce, madd, F32, V128 } from "./asm.ts";

/** copyRows(dst, dstStride, src, srcStride, rowBytes, rows). */
export function copyRowsBody(): { locals: number[][]; code: number[] } {
  const dst = 0,
    ds = 1,
    src = 2,
    ss = 3,
    n = 4,
    rows = 5;
  const r = 6;
  const code = forLoop(r, op.i32(0), op.get(rows), op.i32(1), [
    ...op.get(dst),
    ...op.get(src),
    ...op.get(n),
    ...op.memoryCopy,
    ...op.get(dst),
    ...op.get(ds),
    ...op.add,
    ...op.set(dst),
    ...op.get(src),
    ...op.get(ss),
    ...op.add,
    ...op.set(src),
  ]);
  return { locals: [[1, I32]], code };
}

/** swiglu(gu, y, rows, I) and, with grad, swigluGrad(gu, dy, dgu, rows, I): row by row, four lanes
 *  at a time. Pointers in bytes; I in floats. */
export function swigluBody(grad: boolean, relaxed = false): { locals: number[][]; code: number[] } {
  const gu = 0,
    dy = 1,
    out = grad ? 2 : 1,
    rows = grad ? 3 : 2,
    I = grad ? 4 : 3;
  let n = I + 1;
  const r = n++,
    j = n++,
    pg = n++,
    pd = n++,
    po = n++,
    half = n++;
  const nI32 = n - I - 1;
  const g = n++,
    u = n++,
    s = n++,
    x = n++,
    e = n++,
    d = n++,
    o = n++,
    f = n++;
  const c = new Consts(n),
    one = c.f32(1);
  const at = (p: number, extra: number[] = []) => [...op.get(p), ...op.get(j), ...op.add, ...extra];
  const sigmoid = [...op.get(g), ...v.fneg, ...vexp(c, x, e, o, f, relaxed), ...op.set(e)];
  const body = grad
    ? [
        ...at(pg),
        ...v.load(),
        ...op.set(g),
        ...at(pg, [...op.get(half), ...op.add]),
        ...v.load(),
        ...op.set(u),
        ...at(pd),
        ...v.load(),
        ...op.set(d),
        ...sigmoid,
        ...one,
        ...one,
        ...op.get(e),
        ...v.fadd,
        ...v.fdiv,
        ...op.set(s),
        // d gate = d·u·s·(1 + g·(1 − s)), d up = d·g·s
        ...at(po),
        ...op.get(d),
        ...op.get(u),
        ...v.fmul,
        ...op.get(s),
        ...v.fmul,
        ...one,
        ...op.get(g),
        ...one,
        ...op.get(s),
        ...v.fsub,
        ...v.fmul,
        ...v.fadd,
        ...v.fmul,
        ...v.store(),
        ...at(po, [...op.get(half), ...op.add]),
        ...op.get(d),
        ...op.get(g),
        ...v.fmul,
        ...op.get(s),
        ...v.fmul,
        ...v.store(),
      ]
    : [
        ...at(pg),
        ...v.load(),
        ...op.set(g),
        ...at(pg, [...op.get(half), ...op.add]),
        ...v.load(),
        ...op.set(u),
        ...sigmoid,
        // g / (1 + e) · u
        ...at(po),
        ...op.get(g),
        ...one,
        ...op.get(e),
        ...v.fadd,
        ...v.fdiv,
        ...op.get(u),
        ...v.fmul,
        ...v.store(),
      ];
  // po/pd advance by a row of the output/dy (4I bytes, or 8I for dgu); pg by a row of gu (8I)
  const code = [
    ...c.init(),
    ...op.get(I),
    ...op.i32(4),
    ...op.mul,
    ...op.set(half),
    ...op.get(gu),
    ...op.set(pg),
    ...op.get(out),
    ...op.set(po),
    ...(grad ? [...op.get(dy), ...op.set(pd)] : []),
    ...forLoop(r, op.i32(0), op.get(rows), op.i32(1), [
      ...forLoop(j, op.i32(0), op.get(half), op.i32(16), body),
      ...op.get(pg),
      ...op.get(half),
      ...op.get(half),
      ...op.add,
      ...op.add,
      ...op.set(pg),
      ...op.get(po),
      ...op.get(half),
      ...(grad ? [...op.get(half), ...op.add] : []),
      ...op.add,
      ...op.set(po),
      ...(grad ? [...op.get(pd), ...op.get(half), ...op.add, ...op.set(pd)] : []),
    ]),
  ];
  return {
    locals: [
      [nI32, I32],
      [n - I - 1 - nI32 + c.count, V128],
    ],
    code,
  };
}

/** rowStats(x, out, rows, V) and, with softmax, softmaxRows(x, coef, out, rows, V). */
export function rowsBody(softmax: boolean, relaxed = false): { locals: number[][]; code: number[] } {
  const x = 0,
    coef = 1,
    out = softmax ? 2 : 1,
    rows = softmax ? 3 : 2,
    V = softmax ? 4 : 3;
  let n = V + 1;
  const r = n++,
    j = n++,
    px = n++,
    po = n++,
    vb = n++;
  const nI32 = n - V - 1;
  const m = n++,
    c = n++;
  const acc = n++,
    acc2 = n++,
    xv = n++,
    mv = n++,
    t1 = n++,
    t2 = n++,
    cv = n++,
    t3 = n++,
    t4 = n++;
  const k = new Consts(n);
  const at = (p: number) => [...op.get(p), ...op.get(j), ...op.add];
  const rowLoop = (body: number[]) => forLoop(j, op.i32(0), op.get(vb), op.i32(16), body);
  const ex = [...at(px), ...v.load(), ...op.tee(xv), ...op.get(mv), ...v.fsub, ...vexp(k, t1, t2, t3, t4, relaxed)]; // exp(x − m)
  const code = [
    ...op.get(V),
    ...op.i32(4),
    ...op.mul,
    ...op.set(vb),
    ...op.get(x),
    ...op.set(px),
    ...op.get(out),
    ...op.set(po),
    ...forLoop(r, op.i32(0), op.get(rows), op.i32(1), [
      ...f32x4(-Infinity),
      ...op.set(acc),
      ...rowLoop([...at(px), ...v.load(), ...op.get(acc), ...v.pmax, ...op.set(acc)]),
      ...hreduce(acc, 0x97),
      ...op.tee(m),
      ...v.fsplat,
      ...op.set(mv),
      ...v.zero,
      ...op.set(acc),
      ...v.zero,
      ...op.set(acc2),
      ...(softmax
        ? [
            // out = exp(x − m), summed; then out ·= coef[r] / s in place
            ...rowLoop([...at(po), ...ex, ...op.tee(t1), ...v.store(), ...op.get(t1), ...op.get(acc), ...v.fadd, ...op.set(acc)]),
            ...op.get(coef),
            ...op.get(r),
            ...op.i32(4),
            ...op.mul,
            ...op.add,
            ...op.f32load(),
            ...hreduce(acc, 0x92),
            0x95,
            ...op.set(c),
            ...op.get(c),
            ...v.fsplat,
            ...op.set(cv),
            ...rowLoop([...at(po), ...at(po), ...v.load(), ...op.get(cv), ...v.fmul, ...v.store()]),
            ...op.get(po),
            ...op.get(vb),
            ...op.add,
            ...op.set(po),
          ]
        : [
            ...rowLoop([
              ...ex,
              ...op.tee(t1),
              ...op.get(acc),
              ...v.fadd,
              ...op.set(acc),
              ...op.get(t1),
              ...op.get(xv),
              ...v.fmul,
              ...op.get(acc2),
              ...v.fadd,
              ...op.set(acc2),
            ]),
            ...op.get(po),
            ...op.get(m),
            ...op.f32store(0),
            ...op.get(po),
            ...hreduce(acc, 0x92),
            ...op.f32store(4),
            ...op.get(po),
            ...hreduce(acc2, 0x92),
            ...op.f32store(8),
            ...op.get(po),
            ...op.i32(12),
            ...op.add,
            ...op.set(po),
          ]),
      ...op.get(px),
      ...op.get(vb),
      ...op.add,
      ...op.set(px),
    ]),
  ];
  return {
    locals: [
      [nI32, I32],
      [2, F32],
      [9 + k.count, V128],
    ],
    code: [...k.init(), ...code],
  };
}

/** softmaxGrad(y, dy, dx, rows, S). */
export function softmaxGradBody(relaxed = false): { locals: number[][]; code: number[] } {
  const y = 0,
    dy = 1,
    dx = 2,
    rows = 3,
    S = 4;
  const r = 5,
    j = 6,
    sb = 7;
  const acc = 8,
    dot = 9;
  const at = (p: number) => [...op.get(p), ...op.get(j), ...op.add];
  const rowLoop = (body: number[]) => forLoop(j, op.i32(0), op.get(sb), op.i32(16), body);
  const code = [
    ...op.get(S),
    ...op.i32(4),
    ...op.mul,
    ...op.set(sb),
    ...forLoop(r, op.i32(0), op.get(rows), op.i32(1), [
      ...v.zero,
      ...op.set(acc),
      ...rowLoop([...at(y), ...v.load(), ...at(dy), ...v.load(), ...madd(relaxed, op.get(acc)), ...op.set(acc)]),
      ...hreduce(acc, 0x92),
      ...v.fsplat,
      ...op.set(dot),
      ...rowLoop([...at(dx), ...at(dy), ...v.load(), ...op.get(dot), ...v.fsub, ...at(y), ...v.load(), ...v.fmul, ...v.store()]),
      ...[y, dy, dx].flatMap((p) => [...op.get(p), ...op.get(sb), ...op.add, ...op.set(p)]),
    ]),
  ];
  return {
    locals: [
      [3, I32],
      [2, V128],
    ],
    code,
  };
}
