/** The WGSL programs of a forward whose rows share a prefix (qwen2.ts sharePrefixes): its heads from
 *  qkv (the prefix's, the rows' queries, and the keys and values each row attends over) and their
 *  gradient, and both attention parts' outputs laid out as rows and back. Registers itself (families.ts);
 *  kernels/heads.ts holds the names and the gradients. */
import type * as tf from "@tensorflow/tfjs";
import { HEADS_OUT, HEADS_OUT_GRAD, SHARED_HEADS, SHARED_HEADS_GRAD, type SharedHeadsAttrs } from "../heads.ts";
import { registerKernel } from "../kernels.ts";
import { qkvElement } from "./heads.ts";
import { f32, RowProgram, run, runMulti, threadIndex, type WebgpuModule } from "./program.ts";
import { webgpuFamily } from "./families.ts";

/** The heads of a forward whose rows share a prefix (qwen2.ts sharePrefixes) from qkv [P + B·T, width]
 *  (the prefix's P rows, then each row's T): in one dispatch, one thread per element of qkv, the
 *  prefix's q (rope · scale, [1, nH, P, hd], the result), kᵀ [1, nKv, hd, P] and v [1, nKv, P, hd]
 *  for its own attention, each row's q [B, nH, T, hd], and the keys [B, nKv, hd, P + T] and values
 *  [B, nKv, P + T, hd] each row attends over: the prefix's, written once per row, then its own. In
 *  place of two slices, two heads programs, two tiles and two concatenations. */
function sharedHeadsProgram(u: WebgpuModule["webgpu_util"], a: SharedHeadsAttrs) {
  const { P, B, T, nH, nKv, hd, scale } = a,
    width = (nH + 2 * nKv) * hd,
    half = hd / 2,
    S = P + T,
    total = (P + B * T) * width;
  const roped = (cs: string, sn: string, at: string) =>
    `(qkv[src + j] * ${cs}[${at} * ${hd} + j] + qkv[src + select(j - ${half}, j + ${half}, j < ${half})] * ${sn}[${at} * ${hd} + j])`;
  const sc = f32(Math.fround(scale));
  const p = new RowProgram(
    u,
    "shared_heads",
    ["qkv", "cosP", "sinP", "cosO", "sinO", "kTP", "vP", "qO", "keys", "vals"],
    [1, nH, P, hd],
    { rows: Math.ceil(total / 64), wg: 64 },
    `
    fn main(index: i32) {
      let g = ${threadIndex(64)};
      if (g < ${total}) {
        ${qkvElement(width, hd)}
        if (n < ${P}) {
          if (hs < ${nH}) {
            result[(hs * ${P} + n) * ${hd} + j] = ${roped("cosP", "sinP", "n")} * ${sc};
          } else if (hs < ${nH + nKv}) {
            let h = hs - ${nH};
            let k = ${roped("cosP", "sinP", "n")};
            kTP[(h * ${hd} + j) * ${P} + n] = k;
            for (var b = 0; b < ${B}; b++) { keys[((b * ${nKv} + h) * ${hd} + j) * ${S} + n] = k; }
          } else {
            let h = hs - ${nH + nKv};
            let v = qkv[src + j];
            vP[(h * ${P} + n) * ${hd} + j] = v;
            for (var b = 0; b < ${B}; b++) { vals[((b * ${nKv} + h) * ${S} + n) * ${hd} + j] = v; }
          }
        } else {
          let m = n - ${P};
          let b = m / ${T};
          let t = m - b * ${T};
          if (hs < ${nH}) {
            qO[((b * ${nH} + hs) * ${T} + t) * ${hd} + j] = ${roped("cosO", "sinO", "m")} * ${sc};
          } else if (hs < ${nH + nKv}) {
            keys[((b * ${nKv} + hs - ${nH}) * ${hd} + j) * ${S} + ${P} + t] = ${roped("cosO", "sinO", "m")};
          } else {
            vals[((b * ${nKv} + hs - ${nH + nKv}) * ${S} + ${P} + t) * ${hd} + j] = qkv[src + j];
          }
        }
      }
    }`,
  );
  p.writes = ["kTP", "vP", "qO", "keys", "vals"];
  return p;
}

/** sharedHeadsProgram's gradient with respect to qkv [P + B·T, width]: RoPE's adjoint and the scale,
 *  as seqHeadsGradProgram's, where a prefix row's key and value gradients are the prefix attention's
 *  plus every row's (the B copies it was written to). */
function sharedHeadsGradProgram(u: WebgpuModule["webgpu_util"], a: SharedHeadsAttrs) {
  const { P, B, T, nH, nKv, hd, scale } = a,
    width = (nH + 2 * nKv) * hd,
    half = hd / 2,
    S = P + T;
  const sc = f32(Math.fround(scale));
  // the key gradient of prefix element (h, jj, n): its own attention's and every row's copy's
  const dkPre = (jj: string) => `dkPre(h, ${jj}, n)`;
  return new RowProgram(
    u,
    "shared_heads_grad",
    ["dqP", "dkTP", "dvP", "dqO", "dkeys", "dvals", "cosP", "sinP", "cosO", "sinO"],
    [P + B * T, width],
    "flat",
    `
    fn dkPre(h: i32, j: i32, n: i32) -> f32 {
      var s = dkTP[(h * ${hd} + j) * ${P} + n];
      for (var b = 0; b < ${B}; b++) { s += dkeys[((b * ${nKv} + h) * ${hd} + j) * ${S} + n]; }
      return s;
    }
    fn main(index: i32) {
      if (index < ${(P + B * T) * width}) {
        let n = index / ${width};
        let c = index % ${width};
        let hh = c / ${hd};
        let j = c % ${hd};
        let jr = select(j - ${half}, j + ${half}, j < ${half});
        var out = 0.0;
        if (n < ${P}) {
          if (hh < ${nH}) {
            let o = (hh * ${P} + n) * ${hd};
            out = (dqP[o + j] * cosP[n * ${hd} + j] + dqP[o + jr] * sinP[n * ${hd} + jr]) * ${sc};
          } else if (hh < ${nH + nKv}) {
            let h = hh - ${nH};
            out = ${dkPre("j")} * cosP[n * ${hd} + j] + ${dkPre("jr")} * sinP[n * ${hd} + jr];
          } else {
            let h = hh - ${nH + nKv};
            var s = dvP[(h * ${P} + n) * ${hd} + j];
            for (var b = 0; b < ${B}; b++) { s += dvals[((b * ${nKv} + h) * ${S} + n) * ${hd} + j]; }
            out = s;
          }
        } else {
          let m = n - ${P};
          let b = m / ${T};
          let t = m - b * ${T};
          if (hh < ${nH}) {
            let o = ((b * ${nH} + hh) * ${T} + t) * ${hd};
            out = (dqO[o + j] * cosO[m * ${hd} + j] + dqO[o + jr] * sinO[m * ${hd} + jr]) * ${sc};
          } else if (hh < ${nH + nKv}) {
            let o = ((b * ${nKv} + hh - ${nH}) * ${hd}) * ${S} + ${P} + t;
            out = dkeys[o + j * ${S}] * cosO[m * ${hd} + j] + dkeys[o + jr * ${S}] * sinO[m * ${hd} + jr];
          } else {
            out = dvals[((b * ${nKv} + hh - ${nH + nKv}) * ${S} + ${P} + t) * ${hd} + j];
          }
        }
        result[index] = out;
      }
    }`,
  );
}

interface HeadsOutAttrs {
  Bs: number[];
  Ts: number[];
  nH: number;
  hd: number;
}

/** The rows of attention's outputs per part i, ctxᵢ [Bᵢ, nH, Tᵢ, hd] (as [Bᵢ·nKv, g·Tᵢ, hd]), into one
 *  [Σ Bᵢ·Tᵢ, nH·hd], or with `grad` the reverse (dy's rows into ctx₀ as the result and ctx₁ written
 *  beside it). One thread per element of the rows. */
function headsOutProgram(u: WebgpuModule["webgpu_util"], a: HeadsOutAttrs, grad: boolean) {
  const { Bs, Ts, nH, hd } = a,
    W = nH * hd,
    rows = Bs.map((b, i) => b * Ts[i]),
    total = rows.reduce((x, y) => x + y, 0) * W;
  const part = (i: number) => {
    const off = rows.slice(0, i).reduce((x, y) => x + y, 0),
      T = Ts[i],
      at = `((b * ${nH} + h) * ${T} + t) * ${hd} + j`,
      ctx = grad ? (i === 0 ? "result" : `c${i}`) : `c${i}`;
    return `let m = n - ${off};
        let b = m / ${T};
        let t = m - b * ${T};
        ${grad ? `${ctx}[${at}] = dy[g];` : `result[g] = ${ctx}[${at}];`}`;
  };
  const p = new RowProgram(
    u,
    grad ? "heads_out_grad" : "heads_out",
    grad ? ["dy", ...Bs.slice(1).map((_, i) => `c${i + 1}`)] : Bs.map((_, i) => `c${i}`),
    grad ? [Bs[0] * nH * Ts[0] * hd] : [total / W, W],
    { rows: Math.ceil(total / 64), wg: 64 },
    `
    fn main(index: i32) {
      let g = ${threadIndex(64)};
      if (g < ${total}) {
        let n = g / ${W};
        let c = g - n * ${W};
        let h = c / ${hd};
        let j = c - h * ${hd};
        ${rows.map((_, i) => `${i ? "else " : ""}if (n < ${rows.slice(0, i + 1).reduce((x, y) => x + y, 0)}) { ${part(i)} }`).join(" ")}
      }
    }`,
  );
  if (grad) p.writes = Bs.slice(1).map((_, i) => `c${i + 1}`);
  return p;
}

/** Register the shared-prefix heads' kernels for the webgpu backend (when the backend starts). */
function registerWebgpuSharedHeads(mod: WebgpuModule): void {
  const u = mod.webgpu_util;
  const on = ["webgpu"];
  registerKernel(
    SHARED_HEADS,
    () =>
      ({ inputs, backend, attrs }) => {
        const a = attrs as unknown as SharedHeadsAttrs,
          { qkv, cosP, sinP, cosO, sinO } = inputs as Record<string, tf.TensorInfo>;
        const { P, B, T, nH, nKv, hd } = a;
        return runMulti(
          backend,
          sharedHeadsProgram(u, a),
          [qkv, cosP, sinP, cosO, sinO],
          [
            [1, nKv, hd, P],
            [1, nKv, P, hd],
            [B, nH, T, hd],
            [B, nKv, hd, P + T],
            [B, nKv, P + T, hd],
          ],
        );
      },
    on,
  );
  registerKernel(
    SHARED_HEADS_GRAD,
    () =>
      ({ inputs, backend, attrs }) => {
        const i = inputs as Record<string, tf.TensorInfo>;
        return run(backend, sharedHeadsGradProgram(u, attrs as unknown as SharedHeadsAttrs), [
          i.dqP,
          i.dkTP,
          i.dvP,
          i.dqO,
          i.dkeys,
          i.dvals,
          i.cosP,
          i.sinP,
          i.cosO,
          i.sinO,
        ]);
      },
    on,
  );
  registerKernel(
    HEADS_OUT,
    () =>
      ({ inputs, backend, attrs }) => {
        const a = attrs as unknown as HeadsOutAttrs;
        return run(
          backend,
          headsOutProgram(u, a, false),
          a.Bs.map((_, i) => (inputs as Record<string, tf.TensorInfo>)[`c${i}`]),
        );
      },
    on,
  );
  registerKernel(
    HEADS_OUT_GRAD,
    () =>
      ({ inputs, backend, attrs }) => {
        const a = attrs as unknown as HeadsOutAttrs;
        const size = (i: number) => a.Bs[i] * a.nH * a.Ts[i] * a.hd;
        return runMulti(
          backend,
          headsOutProgram(u, a, true),
          [(inputs as Record<string, tf.TensorInfo>).dy],
          a.Bs.slice(1).map((_, i) => [size(i + 1)]),
        );
      },
    on,
  );
}

webgpuFamily(registerWebgpuSharedHeads);
