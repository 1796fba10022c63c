/** The optimizer step's WGSL programs (adamw.ts holds the op side): the squares of a group of
 *  gradients summed per dispatch into one vector, its norm and clip coefficient, and for a group of
 *  variables per dispatch AdamW's moments (in place) and new weights. Hyperparameters and the step's
 *  bias corrections are uniforms, so one shader serves every step; sizes are compiled in. Float32 throughout, in the op
 *  path's order of operations. */
import type * as tf from "@tensorflow/tfjs";
import { setWebgpuAdamW, type AdamWConstants } from "../adamw.ts";
import { cols, RowProgram, rowPrelude, run, runMulti, writeInto, threadIndex, type WebgpuModule } from "./program.ts";
import { webgpuFamily } from "./families.ts";

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

/** AdamW for a group of variables in one dispatch, one thread per weight of them all: variable i's
 *  moments st_i [2·n_i] in place, m ← β1·m + (1 − β1)·g·c and v ← β2·v + (1 − β2)·(g·c)², then its
 *  new weights θ·(1 − lr·wd) − stepSize · m / (√v / √(1 − β2^t) + eps) into its output (result for
 *  the first, the outputs written beside it for the others); θ itself and the moments unchanged when
 *  the norm is not finite. */
function updateProgram(u: Util, sizes: number[]) {
  const total = sizes.reduce((a, b) => a + b, 0),
    off = sizes.map((_, i) => sizes.slice(0, i).reduce((a, b) => a + b, 0));
  const out = (i: number) => (i === 0 ? "result" : `out${i}`);
  const body = (i: number) => {
    const n = sizes[i];
    return `let j = g - ${off[i]};
        let th = th${i}[j];
        if (${FINITE}) {
          let x = gr${i}[j] * nc[1];
          let m = st${i}[j] * uniforms.beta1 + x * uniforms.omb1;
          let v = st${i}[${n} + j] * uniforms.beta2 + x * x * uniforms.omb2;
          st${i}[j] = m;
          st${i}[${n} + j] = v;
          ${out(i)}[j] = th * uniforms.decay - m / (sqrt(v) / uniforms.bc2Sqrt + uniforms.eps) * uniforms.stepSize;
        } else {
          ${out(i)}[j] = th;
        }`;
  };
  const idx = (name: string) => sizes.map((_, i) => `${name}${i}`);
  const p = new RowProgram(
    u,
    "adam_update",
    [...idx("th"), ...idx("gr"), "nc", ...idx("st"), ...idx("out").slice(1)],
    [sizes[0]],
    { rows: Math.ceil(total / 64), wg: 64 },
    `
    fn main(index: i32) {
      let g = ${threadIndex(64)};
      ${sizes
        .map(
          (_, i) => `${i ? "else " : ""}if (g < ${off[i] + sizes[i]}) {
        ${body(i)}
      }`,
        )
        .join(" ")}
    }`,
  );
  p.uniforms = ADAM_UNIFORMS;
  p.writes = [...idx("st"), ...idx("out").slice(1)];
  return p;
}

/** Register the programs with adamw.ts (when the backend starts), grouped as the device's storage
 *  bindings per shader stage allow: a sum of squares binds its gradients and the sums, an update four
 *  buffers per variable (weights, gradient, moments, new weights) and the norm. */
function registerWebgpuAdamW(mod: WebgpuModule, storageBindings: number): void {
  const u = mod.webgpu_util;
  const size = (t: tf.TensorInfo) => t.shape.reduce((a, b) => a * b, 1);
  setWebgpuAdamW({
    sumSquaresGroup: Math.max(1, Math.min(16, storageBindings - 1)),
    updateGroup: Math.max(1, Math.min(8, Math.floor((storageBindings - 1) / 4))),
    sumSquares: (b, grads, acc, pos) =>
      writeInto(b, sumSquaresProgram(u, grads.map(size), size(acc)), grads, acc, [{ type: "int32", data: [pos] }]),
    normCoef: (b, acc, maxNorm) => run(b, normCoefProgram(u, size(acc)), [acc], [{ type: "float32", data: [maxNorm] }]),
    update: (b, thetas, states, grads, nc, k) =>
      runMulti(
        b,
        updateProgram(u, thetas.map(size)),
        [...thetas, ...grads, nc, ...states],
        thetas.slice(1).map((t) => [size(t)]),
        adamUniforms(k),
      ),
  });
}

webgpuFamily((mod, limits) => registerWebgpuAdamW(mod, limits.maxStorageBuffersPerShaderStage));
