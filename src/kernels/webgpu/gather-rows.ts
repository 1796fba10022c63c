/** gather-rows.ts' two WGSL programs: rows picked by index (−1: zeros), and the gradient's sums of
 *  dy's rows into their source rows through a host-built map. One thread per output element.
 *  Registers itself (families.ts). */
import type * as tf from "@tensorflow/tfjs";
import { GATHER_ROWS, SCATTER_ROWS } from "../gather-rows.ts";
import { registerKernel } from "../kernels.ts";
import { RowProgram, run, type WebgpuModule } from "./program.ts";
import { webgpuFamily } from "./families.ts";

type Util = WebgpuModule["webgpu_util"];

/** result [n, C]: row i is x's row idx[i], or zeros where idx[i] < 0. */
function gatherProgram(u: Util, n: number, C: number) {
  return new RowProgram(
    u,
    `gather_rows_${C}`,
    ["x", "idx"],
    [n, C],
    "flat",
    `
    fn main(index: i32) {
      if (index < uniforms.outShape[0] * ${C}) {
        let i = idx[index / ${C}];
        result[index] = select(0.0, x[max(i, 0) * ${C} + index % ${C}], i >= 0);
      }
    }`,
  );
}

/** result [R, C]: row r is the sum of dy's rows list[start[r]] … list[start[r + 1] − 1]. */
function scatterProgram(u: Util, R: number, C: number) {
  return new RowProgram(
    u,
    `scatter_rows_${C}`,
    ["dy", "start", "list"],
    [R, C],
    "flat",
    `
    fn main(index: i32) {
      if (index < uniforms.outShape[0] * ${C}) {
        let r = index / ${C};
        let c = index % ${C};
        var s = 0.0;
        for (var p = start[r]; p < start[r + 1]; p++) { s += dy[list[p] * ${C} + c]; }
        result[index] = s;
      }
    }`,
  );
}

function registerWebgpuGatherRows(mod: WebgpuModule): void {
  const u = mod.webgpu_util,
    on = ["webgpu"];
  registerKernel(
    GATHER_ROWS,
    () =>
      ({ inputs, backend }) => {
        const { x, idx } = inputs as { x: tf.TensorInfo; idx: tf.TensorInfo };
        return run(backend, gatherProgram(u, idx.shape[0], x.shape[1]), [x, idx]);
      },
    on,
  );
  registerKernel(
    SCATTER_ROWS,
    () =>
      ({ inputs, backend, attrs }) => {
        const { dy, start, list } = inputs as { dy: tf.TensorInfo; start: tf.TensorInfo; list: tf.TensorInfo };
        return run(backend, scatterProgram(u, (attrs as { rows: number }).rows, dy.shape[1]), [dy, start, list]);
      },
    on,
  );
}

webgpuFamily(registerWebgpuGatherRows);
