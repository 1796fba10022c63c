/** The optimizer step's WGSL programs (adamw.ts holds the op side): the squares of up to eight
 *  gradients summed per dispatch into one vector, its norm and clip coefficient, and per variable
 *  AdamW's moments (in place) and new weights. Hyperparameters and the step's bias corrections are
 *  uniforms, so one shader serves every step; sizes are compiled in. Float32 throughout, in the op
 *  path's order of operations. */
import type * as tf from "@tensorflow/tfjs";
import { setWebgpuAdamW, type AdamWConstants } from "../adamw.ts";
import { cols, RowProgram, rowPrelude, run, writeInto, type WebgpuModule } from "./program.ts";

type Util = WebgpuModule["webgpu_util"];
const WG = 256;

/** A finite norm: the update's guard (WGSL has no isFinite; NaN ≠ NaN). */
const FINITE = "(nc[0] == nc[0] && abs(nc[0]) < uniforms.INFINITY)";

/** acc[pos + i] = Σ g_i², one workgroup per gradient. */
function sumSquaresProgram(u: Util, sizes: number[], accSize: number) {
  const sums = sizes.map((n, i) => `if (i == ${i}) { ${cols(n, WG, `let x = g${i}[j]; s += x * x;`)} }`).join("\n      ");
  const p = new RowProgram(
    u,
    "sumsq",
    sizes.map((_, i) => `g${i}`),
    [accSize],
    { rows: sizes.length, wg: WG },
    `${rowPrelude(WG, sizes.length)}
    fn main(index: i32) {
      let i = row();
      var s = 0.0;
      ${sums}
      let t = reduceSum(s);
      if (rowOk() && localIndex == 0u) { result[uniforms.pos + i] = t; }
    }`,
  );
  p.uniforms = "pos : i32,";
  return p;
}

/** [√Σacc, min(1, maxNorm / (norm + 1e-6))], the coefficient 1 when maxNorm is 0. */
function normCoefProgram(u: Util, n: number) {
  const wg = 64;
  const p = new RowProgram(
    u,
    "norm_coef",
    ["acc"],
    [2],
    { rows: 1, wg },
    `${rowPrelude(wg, 1)}
    fn main(index: i32) {
      var s = 0.0;
      ${cols(n, wg, `s += acc[j];`)}
      let norm = sqrt(reduceSum(s));
      if (localIndex == 0u) {
        result[0] = norm;
        result[1] = select(1.0, min(1.0, uniforms.maxNorm / (norm + 1e-6)), uniforms.maxNorm > 0.0);
      }
    }`,
  );
  p.uniforms = "maxNorm : f32,";
  return p;
}

const ADAM_UNIFORMS = "beta1 : f32, omb1 : f32, beta2 : f32, omb2 : f32, eps : f32, decay : f32, stepSize : f32, bc2Sqrt : f32,";
/** One entry per scalar: tfjs lays out a uniform entry of n values as a vector (n ≤ 6). */
const adamUniforms = (k: AdamWConstants) =>
  [k.beta1, 1 - k.beta1, k.beta2, 1 - k.beta2, k.eps, k.decay, k.stepSize, k.bc2Sqrt].map((x) => ({ type: "float32", data: [x] }));

/** m ← β1·m + (1 − β1)·g·c and v ← β2·v + (1 − β2)·(g·c)², in place in result [2n]. */
function momentsProgram(u: Util, n: number) {
  const p = new RowProgram(
    u,
    "adam_moments",
    ["g", "nc"],
    [2 * n],
    "flat",
    `
    fn main(index: i32) {
      if (index < ${n} && ${FINITE}) {
        let x = g[index] * nc[1];
        result[index] = result[index] * uniforms.beta1 + x * uniforms.omb1;
        result[${n} + index] = result[${n} + index] * uniforms.beta2 + x * x * uniforms.omb2;
      }
    }`,
  );
  p.uniforms = ADAM_UNIFORMS;
  p.dispatch = u.computeDispatch(p.dispatchLayout, [n], p.workgroupSize); // one thread per weight
  return p;
}

/** θ·(1 − lr·wd) − stepSize · m / (√v / √(1 − β2^t) + eps); θ itself when the norm is not finite. */
function paramProgram(u: Util, n: number) {
  const p = new RowProgram(
    u,
    "adam_param",
    ["theta", "st", "nc"],
    [n],
    "flat",
    `
    fn main(index: i32) {
      if (index < ${n}) {
        let th = theta[index];
        if (${FINITE}) {
          let denom = sqrt(st[${n} + index]) / uniforms.bc2Sqrt + uniforms.eps;
          result[index] = th * uniforms.decay - st[index] / denom * uniforms.stepSize;
        } else {
          result[index] = th;
        }
      }
    }`,
  );
  p.uniforms = ADAM_UNIFORMS;
  return p;
}

/** Register the programs with adamw.ts (once the package is loaded). */
export function registerWebgpuAdamW(mod: WebgpuModule): void {
  const u = mod.webgpu_util;
  const size = (t: tf.TensorInfo) => t.shape.reduce((a, b) => a * b, 1);
  setWebgpuAdamW({
    sumSquares: (b, grads, acc, pos) =>
      writeInto(b, sumSquaresProgram(u, grads.map(size), size(acc)), grads, acc, [{ type: "int32", data: [pos] }]),
    normCoef: (b, acc, maxNorm) => run(b, normCoefProgram(u, size(acc)), [acc], [{ type: "float32", data: [maxNorm] }]),
    moments: (b, state, g, nc, k) => writeInto(b, momentsProgram(u, size(g)), [g, nc], state, adamUniforms(k)),
    param: (b, theta, state, nc, k) => run(b, paramProgram(u, size(theta)), [theta, state, nc], adamUniforms(k)),
  });
}
