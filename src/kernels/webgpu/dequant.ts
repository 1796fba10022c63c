/** The dequantization kernel (dequant.ts) on the webgpu backend: one WGSL program, one thread
 *  per output weight, reading its int32 word of packed codes and its scale. tfjs' op-based path needs
 *  BitwiseAnd, which tfjs-backend-webgpu does not have, and its int32 `mod` is wrong for large
 *  values. Shapes are compiled into the shader (a model has a handful of distinct matrix shapes). */
import * as tf from "@tensorflow/tfjs";
import { DEQUANTIZE, type DequantizeAttrs } from "../dequant.ts";
import { registerKernel } from "../kernels.ts";
import { webgpuFamily } from "./families.ts";

type WebgpuModule = typeof import("@tensorflow/tfjs-backend-webgpu");

class DequantizeProgram {
  variableNames = ["packed", "scales"];
  size = true;
  workgroupSize: [number, number, number] = [64, 1, 1];
  outputShape: number[];
  dispatchLayout: { x: number[] };
  dispatch: [number, number, number];
  shaderKey: string;

  constructor(
    util: WebgpuModule["webgpu_util"],
    private a: DequantizeAttrs,
    private rowsPerField: number,
    private n: number,
  ) {
    this.outputShape = [a.inDim, n];
    this.dispatchLayout = util.flatDispatchLayout(this.outputShape);
    this.dispatch = util.computeDispatch(this.dispatchLayout, this.outputShape, this.workgroupSize);
    this.shaderKey = `marl_dequantize_${a.kind}_${rowsPerField}_${n}_${a.block}`;
  }

  getUserCode(): string {
    const { kind, table, block } = this.a;
    const bits = kind === "int8" ? 8 : 4,
      field = (1 << bits) - 1,
      n = this.n,
      P = this.rowsPerField;
    // output row r = k·P + i holds field k of packed row i (the slab layout of quant.ts)
    const value = kind === "int8" ? `(f32(code) - 128.0) * scales[j]` : `NF4[code] * scales[(r / ${block}) * ${n} + j]`;
    const f = (x: number) => (Number.isInteger(x) ? `${x}.0` : `${x}`);
    return `
      var<private> NF4: array<f32, 16> = array<f32, 16>(${(kind === "nf4" ? table : new Array(16).fill(0)).map(f).join(", ")});
      fn main(index : i32) {
        if (index < uniforms.size) {
          let r = index / ${n};
          let j = index - r * ${n};
          let k = r / ${P};
          let i = r - k * ${P};
          let word = bitcast<u32>(packed[i * ${n} + j]);
          let code = (word >> (${bits}u * u32(k))) & ${field}u;
          setOutputAtIndex(index, ${value});
        }
      }
    `;
  }
}

/** Register the kernel for the webgpu backend (when the backend starts). */
function registerWebgpuDequantize(mod: WebgpuModule): void {
  registerKernel(
    DEQUANTIZE,
    () =>
      ({ inputs, backend, attrs }) => {
        const { packed, scales } = inputs as { packed: tf.TensorInfo; scales: tf.TensorInfo };
        const program = new DequantizeProgram(mod.webgpu_util, attrs as unknown as DequantizeAttrs, packed.shape[0], packed.shape[1]);
        return (backend as InstanceType<WebgpuModule["WebGPUBackend"]>).runWebGPUProgram(program as never, [packed, scales], "float32");
      },
    ["webgpu"],
  );
}

webgpuFamily(registerWebgpuDequantize);
