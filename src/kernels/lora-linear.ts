/** A frozen linear module with LoRA on its members, as one op with its own gradient (webgpu):
 *  out = x·W (+ bias) (+ addend) + s·(x·[A₁|…])·blockdiag(B₁, …). Forward: the base product (its
 *  epilogue the bias and the addend) and one kernel for the LoRA terms, which also keeps s·x·A for the
 *  backward pass. Backward: one kernel for the LoRA input gradient, the base's input gradient with it
 *  as the epilogue, and one kernel for every factor's gradient: 5 dispatches a module where the ops
 *  took 10 to 17 (the products per member, the scaling, the concatenated A and block-diagonal B, and
 *  their gradients' slices, splits and sums). The members' factors stay their own variables (PEFT's).
 *  Gate/up may take SwiGLU inside its kernels (act "swiglu").
 *  The kernels are in webgpu/lora.ts; other backends keep lora.ts' ops and their bits. */
import * as tf from "@tensorflow/tfjs";
import type { CustomGradFn } from "./kernels.ts";
import type { FrozenProduct } from "./matmul.ts";
import { backendProfile } from "./profile.ts";

export const LORA_FWD = "MarlLoraFwd";
export const LORA_DX = "MarlLoraDx";
export const LORA_DW = "MarlLoraDw";

/** The kernels' attributes: the members' rank, their output widths, the scaling alpha / r. */
export interface LoraAttrs {
  r: number;
  outs: number[];
  scale: number;
  /** Gate and up (two members of one width) through SwiGLU: the op's output is silu(gate)·up. */
  swiglu: boolean;
}

/** Whether loraLinear runs for these factors: webgpu with the kernels registered, every member's A
 *  [in, r] and B [r, outᵢ] of one rank, float32, and the kernels' buffers (2 per member and up to 5
 *  more) within the device's storage bindings per stage. */
export function loraLinearRuns(as: tf.Tensor2D[], bs: tf.Tensor2D[]): boolean {
  if (tf.getBackend() !== "webgpu" || tf.getKernel(LORA_FWD, "webgpu") === undefined) return false;
  const r = as[0].shape[1];
  return (
    2 * as.length + 5 <= backendProfile().storageBindings &&
    as.every((a, i) => a.shape[1] === r && a.shape[0] === as[0].shape[0] && bs[i].shape[0] === r) &&
    [...as, ...bs].every((t) => t.dtype === "float32")
  );
}

/** x [N, in] through the frozen base (its bias and `addend` [N, Σout] the product's epilogue) plus the
 *  LoRA terms of members with factors as [in, r] and bs [r, outᵢ] → [N, Σout], differentiable in x,
 *  the addend and every factor. With act "swiglu" (gate and up, two members of width I) the output is
 *  silu(gate)·up [N, I], the activation and its gradient inside the LoRA kernels (two dispatches fewer
 *  than SwiGLU's own). Call where loraLinearRuns. */
export function loraLinear(
  x: tf.Tensor2D,
  base: FrozenProduct,
  addend: tf.Tensor2D | undefined,
  as: tf.Tensor2D[],
  bs: tf.Tensor2D[],
  scale: number,
  act?: "swiglu",
): tf.Tensor2D {
  const k = as.length,
    swiglu = act === "swiglu",
    attrs: LoraAttrs = { r: as[0].shape[1], outs: bs.map((b) => b.shape[1]), scale, swiglu };
  if (swiglu && (k !== 2 || attrs.outs[0] !== attrs.outs[1]))
    throw new Error(`loraLinear: swiglu takes gate and up of one width, got widths ${attrs.outs.join(", ")}`);
  const named = (name: string, ts: tf.Tensor2D[]) => Object.fromEntries(ts.map((t, i) => [`${name}${i}`, t]));
  const lead = addend ? 2 : 1;
  const f = tf.customGrad(((...args: unknown[]) => {
    const save = args.pop() as tf.GradSaveFunc;
    const ts = args as tf.Tensor2D[];
    const xx = ts[0],
      fa = ts.slice(lead, lead + k),
      fb = ts.slice(lead + k);
    const y = base.forward(xx, addend ? ts[1] : undefined);
    const [out, xas, pre] = tf
      .engine()
      .runKernel(LORA_FWD, { x: xx, y, ...named("a", fa), ...named("b", fb) }, attrs as never) as tf.Tensor2D[];
    y.dispose();
    save([xx, xas, ...(pre ? [pre] : []), ...fa, ...fb]);
    return {
      value: out,
      gradFunc: (dy: tf.Tensor2D, saved: tf.Tensor[]) => {
        const [sx, sxas, ...rest] = saved as tf.Tensor2D[];
        const spre = swiglu ? rest.shift() : undefined;
        const sa = rest.slice(0, k),
          sb = rest.slice(k);
        const [dxLora, dxa, dgu] = tf
          .engine()
          .runKernel(
            LORA_DX,
            { dy, ...(spre ? { pre: spre } : {}), ...named("a", sa), ...named("b", sb) },
            attrs as never,
          ) as tf.Tensor2D[];
        const dOut = dgu ?? dy; // the gradient of the fused output (before the activation)
        const dx = base.inputGrad(dOut, dxLora);
        const dw = tf.engine().runKernel(LORA_DW, { x: sx, dxa, xas: sxas, dy: dOut }, attrs as never) as tf.Tensor2D[];
        const dAddend = addend ? [tf.clone(dOut)] : [];
        tf.dispose([dxLora, dxa, ...(dgu ? [dgu] : [])]);
        return [dx, ...dAddend, ...dw];
      },
    };
  }) as unknown as CustomGradFn);
  return f(...([x, ...(addend ? [addend] : []), ...as, ...bs] as [tf.Tensor])) as tf.Tensor2D;
}
