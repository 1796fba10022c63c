/** LoRA's terms of a fused module as three WGSL programs (lora-linear.ts holds the op and its
 *  gradient): the forward (y + s·(x·A)·blockdiag(B), and s·x·A kept for the backward pass), the input
 *  gradient (s·dy·blockdiag(B)ᵀ and its product with Aᵀ) and the factors' gradients (xᵀ·dxa and
 *  (s·x·A)ᵀ·dy, every member's in one dispatch). Gate/up can take SwiGLU in the first two (the
 *  activation as the forward's output, its gradient formed as the input gradient reads dy). Members
 *  share one rank r; each has its own A [in, r] and B [r, outᵢ] binding (as many members as the
 *  device's storage bindings allow: lora-linear.ts loraLinearRuns), so fused modules need no
 *  concatenated or padded factors. The row count is read from the shapes' uniforms, so one shader
 *  serves every batch. */
import type * as tf from "@tensorflow/tfjs";
import { LORA_DW, LORA_DX, LORA_FWD, type LoraAttrs } from "../lora-linear.ts";
import { registerKernel } from "../kernels.ts";
import { f32, RowProgram, runMulti, WORKGROUP, type WebgpuModule } from "./program.ts";
import { webgpuFamily } from "./families.ts";

type Util = WebgpuModule["webgpu_util"];
const WG = 64;

/** Member i's columns [off, off + outᵢ) of the fused output. */
const offsets = (outs: number[]) => outs.map((_, i) => outs.slice(0, i).reduce((a, b) => a + b, 0));

/** The sizes the programs compile in: k members, KR = k·r rows of factors, OUT = Σ outᵢ columns at
 *  offsets off, I the first member's width (SwiGLU's), and the members' factor bindings A and B. */
function sizes(a: LoraAttrs) {
  const k = a.outs.length;
  return {
    ...a,
    k,
    KR: k * a.r,
    OUT: a.outs.reduce((x, y) => x + y, 0),
    off: offsets(a.outs),
    I: a.outs[0],
    A: Array.from({ length: k }, (_, i) => `a${i}`),
    B: Array.from({ length: k }, (_, i) => `b${i}`),
  };
}

/** `body(i)` for the member i that row-of-factors index m (m = i·r + t) falls in: a chain of ifs, as
 *  each member's factor is its own binding. */
const perMember = (k: number, r: number, m: string, body: (i: number) => string) =>
  Array.from({ length: k }, (_, i) => `${i ? "else " : ""}if (${m} < ${(i + 1) * r}) { ${body(i)} }`).join(" ");

/** Forward, one workgroup per row n: xs = s·x[n]·[A₁|…] into workgroup memory (and the output xas),
 *  then result[n] = y[n] + xs·blockdiag(B). With swiglu (gate and up, I columns each) result[n] is
 *  silu(gate)·up [I] instead, and gate and up themselves go to the output pre [N, 2I] (the
 *  activation's backward reads them). */
function forwardProgram(u: Util, N: number, inDim: number, a: LoraAttrs) {
  const { r, outs, scale, swiglu, k, KR, OUT, off, I, A, B } = sizes(a);
  const term = (i: number, j: string) => `y[n * ${OUT} + ${off[i]} + ${j}] + dot${i}(${j})`;
  const dots = outs
    .map(
      (o, i) => `fn dot${i}(j: i32) -> f32 {
    var s = 0.0;
    for (var t = 0; t < ${r}; t++) { s += xs[${i * r} + t] * b${i}[t * ${o} + j]; }
    return s;
  }`,
    )
    .join("\n  ");
  const write = swiglu
    ? `for (var j = i32(localIndex); j < ${I}; j += ${WG}) {
        let g = ${term(0, "j")};
        let up = ${term(1, "j")};
        pre[n * ${2 * I} + j] = g;
        pre[n * ${2 * I} + ${I} + j] = up;
        result[n * ${I} + j] = g / (1.0 + exp(-g)) * up;
      }`
    : outs
        .map(
          (o, i) => `for (var j = i32(localIndex); j < ${o}; j += ${WG}) {
        result[n * ${OUT} + ${off[i]} + j] = ${term(i, "j")};
      }`,
        )
        .join("\n      ");
  const p = new RowProgram(
    u,
    `lora_fwd_${inDim}_${r}_${outs.join("_")}_${scale}${swiglu ? "_swiglu" : ""}`,
    ["x", "y", ...A, ...B, "xas", ...(swiglu ? ["pre"] : [])],
    swiglu ? [N, I] : [N, OUT],
    { rows: N, wg: WG },
    `
  var<workgroup> xs: array<f32, ${KR}>;
  var<private> n: i32;
  ${dots}
  fn main(index: i32) {
    let N = uniforms.xShape[0];
    n = min(${WORKGROUP}, N - 1);
    for (var m = i32(localIndex); m < ${KR}; m += ${WG}) {
      var s = 0.0;
      ${perMember(
        k,
        r,
        "m",
        (i) => `let t = m - ${i * r};
        for (var c = 0; c < ${inDim}; c++) { s += x[n * ${inDim} + c] * a${i}[c * ${r} + t]; }`,
      )}
      xs[m] = s * ${f32(Math.fround(scale))};
    }
    workgroupBarrier();
    if (${WORKGROUP} < N) {
      for (var m = i32(localIndex); m < ${KR}; m += ${WG}) { xas[n * ${KR} + m] = xs[m]; }
      ${write}
    }
  }`,
  );
  p.writes = ["xas", ...(swiglu ? ["pre"] : [])];
  return p;
}

/** Input gradient, one workgroup per row n: dxa[n] = s·dy[n]·blockdiag(B)ᵀ (workgroup memory and the
 *  output dxa), then result[n] = dxa[n]·[A₁|…]ᵀ. The first product is summed as the forward's second
 *  reads: each thread a stride of dy's columns (adjacent threads, adjacent columns of dy and B), its r
 *  partial sums per member then added across the workgroup. With swiglu, dy is the activation's
 *  gradient [N, I]: each column's gradient of gate and up (from pre, the forward's) is formed as it
 *  is read, and written to the output dgu [N, 2I] for the base's and the factors' gradients. */
function inputGradProgram(u: Util, N: number, inDim: number, a: LoraAttrs) {
  const { r, outs, scale, swiglu, k, KR, OUT, off, I, A, B } = sizes(a);
  // the partial sums [wg, r] in workgroup memory beside ds: at most 8 KB of them
  const wg = Math.max(1, Math.min(WG, 2 ** Math.floor(Math.log2(2048 / r))));
  // member i's dy at column j: read, or (swiglu) formed from gate, up and the activation's gradient
  const dyAt = (i: number) =>
    !swiglu
      ? `let d = dy[n * ${OUT} + ${off[i]} + j];`
      : `let g = pre[n * ${2 * I} + j];
      let sg = 1.0 / (1.0 + exp(-g));
      let da = dy[n * ${I} + j];
      let d = ${i === 0 ? `da * pre[n * ${2 * I} + ${I} + j] * sg * (1.0 + g * (1.0 - sg))` : "da * g * sg"};
      if (live) { dgu[n * ${2 * I} + ${i * I} + j] = d; }`;
  const p = new RowProgram(
    u,
    `lora_dx_${inDim}_${r}_${outs.join("_")}_${scale}${swiglu ? "_swiglu" : ""}`,
    ["dy", ...(swiglu ? ["pre"] : []), ...A, ...B, "dxa", ...(swiglu ? ["dgu"] : [])],
    [N, inDim],
    { rows: N, wg },
    `
  var<workgroup> ds: array<f32, ${KR}>;
  var<workgroup> part: array<f32, ${wg * r}>;
  fn main(index: i32) {
    let N = uniforms.dyShape[0];
    let n = min(${WORKGROUP}, N - 1);
    let live = ${WORKGROUP} < N;
    let l = i32(localIndex);
    var acc: array<f32, ${r}>;
    ${outs
      .map(
        (o, i) => `for (var t = 0; t < ${r}; t++) { acc[t] = 0.0; }
    for (var j = l; j < ${o}; j += ${wg}) {
      ${dyAt(i)}
      for (var t = 0; t < ${r}; t++) { acc[t] += d * b${i}[t * ${o} + j]; }
    }
    for (var t = 0; t < ${r}; t++) { part[l * ${r} + t] = acc[t]; }
    workgroupBarrier();
    for (var t = l; t < ${r}; t += ${wg}) {
      var s = 0.0;
      for (var q = 0; q < ${wg}; q++) { s += part[q * ${r} + t]; }
      ds[${i * r} + t] = s * ${f32(Math.fround(scale))};
    }
    workgroupBarrier();`,
      )
      .join("\n    ")}
    if (live) {
      for (var m = l; m < ${KR}; m += ${wg}) { dxa[n * ${KR} + m] = ds[m]; }
      for (var c = l; c < ${inDim}; c += ${wg}) {
        var s = 0.0;
        ${A.map((_, i) => `for (var t = 0; t < ${r}; t++) { s += ds[${i * r} + t] * a${i}[c * ${r} + t]; }`).join("\n        ")}
        result[n * ${inDim} + c] = s;
      }
    }
  }`,
  );
  p.writes = ["dxa", ...(swiglu ? ["dgu"] : [])];
  return p;
}

/** The factors' gradients, one output column per thread group: dAᵢ[c, :] = Σₙ x[n, c]·dxa[n, i·r + ·]
 *  (column (i, c)) and dBᵢ[:, j] = Σₙ xas[n, i·r + ·]·dy[n, j] (column j), r sums each. A workgroup
 *  takes 8 adjacent columns (adjacent threads read adjacent elements of a row of x or dy) and L lanes
 *  that split the rows, whose partial sums are then added in workgroup memory: the rows (thousands in
 *  a training micro-step) are shared by L threads and the columns spread over many workgroups. result
 *  is dA₀; the other members' dA and every dB are the outputs written beside it. */
function factorGradProgram(u: Util, inDim: number, a: LoraAttrs) {
  const { r, outs, k, KR, OUT, off } = sizes(a);
  const dA = Array.from({ length: k }, (_, i) => (i === 0 ? "result" : `da${i}`)),
    dB = Array.from({ length: k }, (_, i) => `db${i}`);
  const columns = k * inDim + OUT,
    CW = 8,
    L = Math.max(1, Math.min(8, 2 ** Math.floor(Math.log2(256 / r)))), // partial sums ≤ 8 KB
    wg = CW * L;
  const p = new RowProgram(
    u,
    `lora_dw_${inDim}_${r}_${outs.join("_")}`,
    ["x", "dxa", "xas", "dy", ...dA.slice(1), ...dB],
    [inDim, r],
    { rows: Math.ceil(columns / CW), wg },
    `
  var<workgroup> part: array<f32, ${wg * r}>;
  fn main(index: i32) {
    let N = uniforms.xShape[0];
    let l = i32(localIndex);
    let g = ${WORKGROUP} * ${CW} + l % ${CW}; // the column
    let lane = l / ${CW};
    var acc: array<f32, ${r}>;
    for (var t = 0; t < ${r}; t++) { acc[t] = 0.0; }
    if (g < ${k * inDim}) {
      let i = g / ${inDim};
      let c = g - i * ${inDim};
      for (var n = lane; n < N; n += ${L}) {
        let xv = x[n * ${inDim} + c];
        for (var t = 0; t < ${r}; t++) { acc[t] += xv * dxa[n * ${KR} + i * ${r} + t]; }
      }
    } else if (g < ${columns}) {
      let j = g - ${k * inDim};
      ${outs
        .map(
          (o, i) => `${i ? "else " : ""}if (j < ${off[i] + o}) {
        for (var n = lane; n < N; n += ${L}) {
          let dv = dy[n * ${OUT} + j];
          for (var t = 0; t < ${r}; t++) { acc[t] += xas[n * ${KR} + ${i * r} + t] * dv; }
        }
      }`,
        )
        .join(" ")}
    }
    for (var t = 0; t < ${r}; t++) { part[l * ${r} + t] = acc[t]; }
    workgroupBarrier();
    if (lane == 0 && g < ${columns}) {
      for (var q = 1; q < ${L}; q++) {
        for (var t = 0; t < ${r}; t++) { acc[t] += part[(q * ${CW} + l) * ${r} + t]; }
      }
      if (g < ${k * inDim}) {
        let i = g / ${inDim};
        let c = g - i * ${inDim};
        ${dA
          .map(
            (d, i) => `${i ? "else " : ""}if (i == ${i}) {
          for (var t = 0; t < ${r}; t++) { ${d}[c * ${r} + t] = acc[t]; } }`,
          )
          .join(" ")}
      } else {
        let j = g - ${k * inDim};
        ${outs
          .map(
            (o, i) =>
              `${i ? "else " : ""}if (j < ${off[i] + o}) { for (var t = 0; t < ${r}; t++) { db${i}[t * ${o} + j - ${off[i]}] = acc[t]; } }`,
          )
          .join(" ")}
      }
    }
  }`,
  );
  p.writes = [...dA.slice(1), ...dB];
  return p;
}

/** Registers the three kernels on webgpu (when the backend starts). */
function registerWebgpuLora(mod: WebgpuModule): void {
  const u = mod.webgpu_util;
  /** A kernel whose body gets the attributes, the inputs by name and the members' factors in order. */
  const kernel = (
    name: string,
    body: (a: LoraAttrs, ins: Record<string, tf.TensorInfo>, factors: tf.TensorInfo[], backend: unknown) => tf.TensorInfo[],
  ) =>
    registerKernel(
      name,
      () =>
        ({ inputs, backend, attrs }) => {
          const a = attrs as unknown as LoraAttrs,
            ins = inputs as Record<string, tf.TensorInfo>;
          const factors = ["a", "b"].flatMap((f) => a.outs.map((_, i) => ins[`${f}${i}`]).filter((t) => t !== undefined));
          return body(a, ins, factors, backend);
        },
      ["webgpu"],
    );
  // the row outputs beside the result: s·x·A [N, k·r], and (SwiGLU) gate and up [N, 2I]
  const rowOutputs = (a: LoraAttrs, N: number) => [[N, a.outs.length * a.r], ...(a.swiglu ? [[N, 2 * a.outs[0]]] : [])];
  kernel(LORA_FWD, (a, ins, factors, b) => {
    const [N, inDim] = ins.x.shape;
    return runMulti(b, forwardProgram(u, N, inDim, a), [ins.x, ins.y, ...factors], rowOutputs(a, N));
  });
  kernel(LORA_DX, (a, ins, factors, b) => {
    const N = ins.dy.shape[0];
    return runMulti(b, inputGradProgram(u, N, ins.a0.shape[0], a), [ins.dy, ...(a.swiglu ? [ins.pre] : []), ...factors], rowOutputs(a, N));
  });
  kernel(LORA_DW, (a, ins, _factors, b) => {
    const inDim = ins.x.shape[1];
    return runMulti(
      b,
      factorGradProgram(u, inDim, a),
      [ins.x, ins.dxa, ins.xas, ins.dy],
      [...a.outs.slice(1).map(() => [inDim, a.r]), ...a.outs.map((o) => [a.r, o])],
    );
  });
}

webgpuFamily(registerWebgpuLora);
