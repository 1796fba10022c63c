/** The vocabulary's WGSL programs: a row's log p(target) and entropy, the logits' gradient, and a
 *  whole-vocabulary draw (and the greedy pick), one workgroup per row, on chunks of rows no larger
 *  than the device's largest storage binding (profile.ts logitChunkFloats). Registers itself
 *  (families.ts); logprob.ts and draw.ts hold the names and the choice of path. */
import type * as tf from "@tensorflow/tfjs";
import { DRAW_ROWS, drawCall } from "../draw.ts";
import { registerKernel, type Backend } from "../kernels.ts";
import { DLOGITS, LOGP } from "../logprob.ts";
import { cols, f32, RowProgram, rowPrelude, run, wgFor, type WebgpuModule } from "./program.ts";
import { webgpuFamily } from "./families.ts";

const K = { logp: LOGP, dLogits: DLOGITS };

/** Per row of logits [n, V]: [log p(target), entropy] → [n, 2]. */
function logpProgram(u: WebgpuModule["webgpu_util"], n: number, V: number) {
  const wg = wgFor(V);
  return new RowProgram(
    u,
    "logp",
    ["logits", "targets"],
    [n, 2],
    { rows: n, wg },
    `${rowPrelude(wg, n)}
    fn main(index: i32) {
      let o = row() * ${V};
      var m = -3.402823e+38;
      ${cols(V, wg, `m = max(m, logits[o + j]);`)}
      m = reduceMax(m);
      var s = 0.0;
      var sx = 0.0;
      ${cols(
        V,
        wg,
        `let x = logits[o + j];
        let e = exp(x - m);
        s += e;
        sx += e * (x - m);`,
      )}
      let S = reduceSum(s);
      let SX = reduceSum(sx);
      if (rowOk() && localIndex == 0u) {
        let ls = log(S);
        result[row() * 2] = logits[o + targets[row()]] - m - ls;
        result[row() * 2 + 1] = ls - SX / S;
      }
    }`,
  );
}

/** d logits [n, V] = dy[:, 0]·(onehot(target) − softmax(logits)). */
function dLogitsProgram(u: WebgpuModule["webgpu_util"], n: number, V: number) {
  const wg = wgFor(V);
  return new RowProgram(
    u,
    "dlogits",
    ["logits", "targets", "dy"],
    [n, V],
    { rows: n, wg },
    `${rowPrelude(wg, n)}
    fn main(index: i32) {
      let o = row() * ${V};
      var m = -3.402823e+38;
      ${cols(V, wg, `m = max(m, logits[o + j]);`)}
      m = reduceMax(m);
      var s = 0.0;
      ${cols(V, wg, `s += exp(logits[o + j] - m);`)}
      let d = dy[row() * 2];
      let c = -d / reduceSum(s);
      let t = targets[row()];
      if (rowOk()) {
        ${cols(V, wg, `result[o + j] = c * exp(logits[o + j] - m) + select(0.0, d, j == t);`)}
      }
    }`,
  );
}

/** A whole-vocabulary draw per row (draw.ts): the id walk of rollout/sample-row.ts, one workgroup per
 *  row. Weights exp((x − max)/T) (0 below −40, NaN ignored) are float32; every sum of them (over
 *  256 contiguous chunks of ids, the chunks' running sums, the normaliser, the target u·Σ and the
 *  walk) is carried in double-float32 (a value and its rounding error), so the walk crosses where the
 *  host's float64 walk does: float32 alone resolves a cumulative sum to ~1e-7 of it, about a token's
 *  share of a flat 152k-token row, and drew a neighbour in ~1 of 200 such draws. The one thread
 *  owning the chunk the target falls in walks its ids. us holds per row u as two
 *  float32 (u = hi + lo). The WGSL after the row prelude (program.ts rowPrelude, 256 threads): row o = row()·V of the
 *  logits read through x(index), its uniform u (hi, lo), and write(token, logprob) storing the token
 *  (−1 where the row has no finite largest logit) and its log-prob (x − max)/T − log Σ, in float32.
 *  The compiled decoder (decode/) draws with the same code. */
export interface DrawIo {
  /** The logits' element at a WGSL index expression. */
  x: (index: string) => string;
  /** The row's uniform as two float32 WGSL expressions (u = hi + lo); draws only. */
  u: [string, string];
  /** WGSL statements storing the row's token and log-prob (float32 expressions). */
  write: (token: string, logprob: string) => string;
}

export function drawWgsl(V: number, T: number, io: DrawIo): string {
  const wg = 256,
    C = Math.ceil(V / wg),
    x = io.x;
  return `
  var<workgroup> sums: array<vec2<f32>, ${wg}>;
  var<workgroup> pre: array<vec2<f32>, ${wg + 1}>;
  var<workgroup> pick: i32;
  var<workgroup> rem: vec2<f32>;
  fn wt(v: f32, m: f32) -> f32 {
    let z = (v - m) / ${f32(T)};
    if (z > -40.0) { return exp(z); }
    return 0.0;
  }
  fn twoSum(a: f32, b: f32) -> vec2<f32> {
    let s = a + b;
    let bb = s - a;
    return vec2<f32>(s, (a - (s - bb)) + (b - bb));
  }
  fn norm(a: f32, b: f32) -> vec2<f32> {
    let s = a + b;
    return vec2<f32>(s, b - (s - a));
  }
  fn ddAdd(a: vec2<f32>, b: f32) -> vec2<f32> {
    let s = twoSum(a.x, b);
    return norm(s.x, s.y + a.y);
  }
  fn ddAdd2(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let s = twoSum(a.x, b.x);
    return norm(s.x, s.y + (a.y + b.y));
  }
  fn ddLess(a: vec2<f32>, b: vec2<f32>) -> bool { return a.x < b.x || (a.x == b.x && a.y < b.y); }
  fn main(index: i32) {
    let o = row() * ${V};
    var m = -3.4028234663852886e38;
    ${cols(V, wg, `let v = ${x("o + j")}; if (v > m) { m = v; }`)}
    m = reduceMax(m);
    let j0 = i32(localIndex) * ${C};
    let j1 = min(${V}, j0 + ${C});
    var s = vec2<f32>(0.0, 0.0);
    for (var j = j0; j < j1; j++) { s = ddAdd(s, wt(${x("o + j")}, m)); }
    sums[localIndex] = s;
    workgroupBarrier();
    if (localIndex == 0u) {
      var acc = vec2<f32>(0.0, 0.0);
      for (var t = 0; t < ${wg}; t++) { pre[t] = acc; acc = ddAdd2(acc, sums[t]); }
      pre[${wg}] = acc;
      let uh = ${io.u[0]};
      let ul = ${io.u[1]};
      let p = uh * acc.x;
      let tgt = norm(p, fma(uh, acc.x, -p) + (uh * acc.y + ul * acc.x));
      var c = 0;
      for (var t = 0; t < ${wg}; t++) {
        if (sums[t].x > 0.0) {
          c = t;
          if (ddLess(tgt, pre[t + 1])) { break; }
        }
      }
      pick = c;
      let d = twoSum(tgt.x, -pre[c].x);
      rem = norm(d.x, d.y + (tgt.y - pre[c].y));
    }
    workgroupBarrier();
    if (rowOk() && i32(localIndex) == pick) {
      var walked = vec2<f32>(0.0, 0.0);
      var tok = j0;
      for (var j = j0; j < j1; j++) {
        let w = wt(${x("o + j")}, m);
        if (w > 0.0) {
          walked = ddAdd(walked, w);
          tok = j;
          if (ddLess(rem, walked)) { break; }
        }
      }
      let total = pre[${wg}].x + pre[${wg}].y;
      let finite = m > -3.4028234663852886e38 && m < 3.4028234663852886e38;
      ${io.write("select(-1.0, f32(tok), finite)", `(${x("o + tok")} - m) / ${f32(T)} - log(total)`)}
    }
  }`;
}

function drawProgram(u: WebgpuModule["webgpu_util"], B: number, V: number, T: number) {
  return new RowProgram(u, "draw", ["x", "us"], [B, 2], { rows: B, wg: 256 }, `${rowPrelude(256, B)}${drawWgsl(V, T, resultIo)}`);
}

/** The standalone kernels' io: logits `x`, uniforms `us` [B, 2], output `result` [B, 2]. */
const resultIo: DrawIo = {
  x: (i) => `x[${i}]`,
  u: ["us[row() * 2]", "us[row() * 2 + 1]"],
  write: (tok, lp) => `result[row() * 2] = ${tok};\n      result[row() * 2 + 1] = ${lp};`,
};

/** Greedy per row (draw.ts at temperature 0): the largest logit's lowest id (NaN passed over, as the
 *  host's argmax), log-prob 0; token −1 where the row has no finite largest logit. The WGSL after the
 *  row prelude (256 threads), io as drawWgsl's (no uniform). */
export function greedyWgsl(V: number, io: Pick<DrawIo, "x" | "write">): string {
  const wg = 256,
    x = io.x;
  return `
  var<workgroup> at: array<i32, ${wg}>;
  fn main(index: i32) {
    let o = row() * ${V};
    var m = -3.4028234663852886e38;
    var best = ${V};
    ${cols(
      V,
      wg,
      `let v = ${x("o + j")};
      if (v > m) { m = v; best = j; }`,
    )}
    let top = reduceMax(m);
    at[localIndex] = select(${V}, best, m == top);
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
      if (localIndex < s) { at[localIndex] = min(at[localIndex], at[localIndex + s]); }
      workgroupBarrier();
    }
    if (rowOk() && localIndex == 0u) {
      let finite = top > -3.4028234663852886e38 && top < 3.4028234663852886e38 && at[0] < ${V};
      ${io.write("select(-1.0, f32(at[0]), finite)", "0.0")}
    }
  }`;
}

function greedyProgram(u: WebgpuModule["webgpu_util"], B: number, V: number) {
  return new RowProgram(u, "greedy", ["x"], [B, 2], { rows: B, wg: 256 }, `${rowPrelude(256, B)}${greedyWgsl(V, resultIo)}`);
}

/** Register the vocabulary kernels for the webgpu backend (when the backend starts). */
function registerWebgpuVocab(mod: WebgpuModule): void {
  const u = mod.webgpu_util;
  const on = ["webgpu"];
  registerKernel(
    DRAW_ROWS,
    () =>
      ({ inputs, backend, attrs }) => {
        const { logits, temperature, us, B, V } = drawCall(inputs, attrs);
        const b = backend as Backend;
        if (temperature === 0) return run(b, greedyProgram(u, B, V), [logits]);
        const hiLo = new Float32Array(2 * B); // each uniform as float32 hi + lo
        us.forEach((x, r) => {
          hiLo[2 * r] = Math.fround(x);
          hiLo[2 * r + 1] = x - hiLo[2 * r];
        });
        const uv = b.makeTensorInfo([B, 2], "float32", hiLo) as tf.TensorInfo;
        const out = run(b, drawProgram(u, B, V, temperature), [logits, uv]);
        b.disposeData(uv.dataId);
        return out;
      },
    on,
  );
  registerKernel(
    K.logp,
    () =>
      ({ inputs, backend }) => {
        const { logits, targets } = inputs as { logits: tf.TensorInfo; targets: tf.TensorInfo };
        return run(backend, logpProgram(u, logits.shape[0], logits.shape[1]), [logits, targets]);
      },
    on,
  );
  registerKernel(
    K.dLogits,
    () =>
      ({ inputs, backend }) => {
        const { logits, targets, dy } = inputs as { logits: tf.TensorInfo; targets: tf.TensorInfo; dy: tf.TensorInfo };
        return run(backend, dLogitsProgram(u, logits.shape[0], logits.shape[1]), [logits, targets, dy]);
      },
    on,
  );
}

webgpuFamily(registerWebgpuVocab);
