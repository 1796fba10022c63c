/** The scaffolding of the project's WGSL programs on tfjs' webgpu backend: RowProgram (its inputs,
 *  output shape, dispatch and body; the tfjs header declares the inputs as arrays named by
 *  `inputs`, the output as `result`), the row prelude every row reduction shares (the row index and
 *  tree reductions in workgroup memory), and running a program with a new output or in place.
 *  Sizes are compiled into a shader (a model has a handful of widths). */
import type * as tf from "@tensorflow/tfjs";
import type { Backend } from "../kernels.ts";

export type WebgpuModule = typeof import("@tensorflow/tfjs-backend-webgpu");

export const f32 = (x: number) => (Number.isInteger(x) ? `${x}.0` : `${x}`);

/** One program: its inputs, output shape, dispatch and WGSL body (the tfjs header declares the
 *  inputs as arrays named by `inputs`, the output as `result`). */
export class RowProgram {
  variableNames: string[];
  outputShape: number[];
  workgroupSize: [number, number, number];
  dispatchLayout: { x: number[] };
  dispatch: [number, number, number];
  shaderKey: string;
  /** Uniforms of the program's own ("name : type,"), their values passed to runWebGPUProgram. */
  uniforms?: string;
  /** Inputs the program writes (its outputs beside `result`, runMulti): device.ts binds them
   *  read_write, as tfjs binds `result`. */
  writes: string[] = [];
  constructor(
    util: WebgpuModule["webgpu_util"],
    name: string,
    inputs: string[],
    outputShape: number[],
    /** "rows": one workgroup of `wg` per row of `rows`; "flat": one thread per output element. */
    grid: { rows: number; wg: number } | "flat",
    private body: string,
  ) {
    this.variableNames = inputs;
    this.outputShape = outputShape;
    this.dispatchLayout = util.flatDispatchLayout(outputShape);
    if (grid === "flat") {
      this.workgroupSize = [64, 1, 1];
      this.dispatch = util.computeDispatch(this.dispatchLayout, outputShape, this.workgroupSize);
    } else {
      this.workgroupSize = [grid.wg, 1, 1];
      this.dispatch = [grid.rows, 1, 1];
    }
    this.shaderKey = `marl_${name}_${body.length}_${hash(body)}`;
  }
  getUserCode(): string {
    // Every binding statically used: the pipeline's "auto" layout leaves out the unused ones, and
    // tfjs binds all of them (the uniforms included).
    const uses = ["_ = uniforms.NAN;", ...this.variableNames.map((v) => `_ = ${v}[0];`)].join(" ");
    return (
      (this.writes.length ? `${WRITES_MARK}${this.writes.join(" ")}\n` : "") +
      this.body.replace("fn main(index: i32) {", `fn main(index: i32) {\n      ${uses}`)
    );
  }
}

/** The line a program's code starts with when it writes inputs (RowProgram.writes), followed by their
 *  names: device.ts' shader hook makes those bindings read_write. */
export const WRITES_MARK = "// marl-writes: ";

/** WGSL source with the bindings its WRITES_MARK line names declared read_write instead of read
 *  (tfjs declares every input read-only); other code is returned as it is. */
export function withWrites(code: string): string {
  const at = code.indexOf(WRITES_MARK);
  if (at < 0) return code;
  const names = code
    .slice(at + WRITES_MARK.length, code.indexOf("\n", at))
    .trim()
    .split(" ");
  for (const n of names) code = code.replace(new RegExp(`var<storage, read> ${n}\\s*:`), `var<storage, read_write> ${n}:`);
  return code;
}

function hash(s: string): string {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619);
  return (h >>> 0).toString(36);
}

/** The workgroup's index in its dispatch, as WGSL (tfjs spreads a long dispatch over y and z). */
export const WORKGROUP = "i32(workgroupId.z * numWorkgroups.x * numWorkgroups.y + workgroupId.y * numWorkgroups.x + workgroupId.x)";
/** A thread's index in a dispatch of workgroups of `wg` threads, as WGSL. */
export const threadIndex = (wg: number) => `${WORKGROUP} * ${wg} + i32(localIndex)`;

/** Workgroup size for rows of `width`: 256 threads on wide rows, 64 on narrow ones. */
export const wgFor = (width: number) => (width >= 2048 ? 256 : 64);

/** The row index (workgroups past the last row, from a dispatch tfjs reshaped to 2-D or 3-D, compute
 *  row rows − 1 again and write nothing: barriers need every thread) and tree reductions. */
export const rowPrelude = (wg: number, rows: number | string) => `
  const WG = ${wg}u;
  var<workgroup> red: array<f32, ${wg}>;
  fn rowIndex() -> i32 {
    return ${WORKGROUP};
  }
  fn rowOk() -> bool { return rowIndex() < ${rows}; }
  fn row() -> i32 { return min(rowIndex(), ${rows} - 1); }
  fn reduceSum(v: f32) -> f32 {
    red[localIndex] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
      if (localIndex < s) { red[localIndex] = red[localIndex] + red[localIndex + s]; }
      workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
  }
  fn reduceMax(v: f32) -> f32 {
    red[localIndex] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
      if (localIndex < s) { red[localIndex] = max(red[localIndex], red[localIndex + s]); }
      workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
  }
`;

/** The loop of a row program over its row's columns j in [0, n), strided by the workgroup's wg
 *  threads (each thread its own j): the scaffolding every row kernel repeats, written once. */
export const cols = (n: number | string, wg: number, body: string) => `for (var j = i32(localIndex); j < ${n}; j += ${wg}) { ${body} }`;

/** Runs p on inputs into a new float32 output (uniforms: the program's own, e.g. a step's constants).
 *  Inputs the program writes (p.writes) lose any copy of their values held on the host. */
export function run(b: Backend, p: RowProgram, inputs: tf.TensorInfo[], uniforms?: object[]): tf.TensorInfo {
  const out = b.runWebGPUProgram(p, inputs, "float32", uniforms) as tf.TensorInfo;
  for (const name of p.writes) b.tensorMap.get(inputs[p.variableNames.indexOf(name)].dataId).values = null;
  return out;
}

/** Runs p into a new float32 `result` and new float32 outputs of `extra` shapes, passed to the
 *  program as its last inputs (named last in p's inputs and in p.writes), which it writes: several
 *  outputs from one dispatch. Returns [result, ...extras]. */
export function runMulti(b: Backend, p: RowProgram, inputs: tf.TensorInfo[], extra: number[][], uniforms?: object[]): tf.TensorInfo[] {
  const outs = extra.map((shape) => b.makeTensorInfo(shape, "float32") as tf.TensorInfo);
  return [run(b, p, [...inputs, ...outs], uniforms), ...outs];
}

/** Runs p with dst as its output, written in place (uniforms: the program's own, e.g. a position);
 *  a copy of dst read back earlier is stale then. */
export function writeInto(b: Backend, p: RowProgram, inputs: tf.TensorInfo[], dst: tf.TensorInfo, uniforms: object[] = []): void {
  b.runWebGPUProgram(p, inputs, "float32", uniforms, dst);
  b.tensorMap.get(dst.dataId).values = null;
}
