/** LoRA on webgpu while generation holds the fused factors: y + the module's terms is the last
 *  product's epilogue (one dispatch, no Add), with the bits of the product and an Add, at a scaling
 *  folded into B (2) and one kept as a product (1.5). The LoRA linear op (a frozen base with its
 *  members' terms, trained): its value and the gradients of the input, the residual and every factor
 *  against float64, over f32, int8 and NF4 bases. */
import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../../src/kernels/backend.ts";
import { LoraAdapter, moduleDims } from "../../../src/model/lora.ts";
import { FUSED } from "../../../src/model/types.ts";
import { cfg, randn } from "../../model/helpers/lora-setup.ts";
import { webgpuForTests } from "./helpers/adapter.ts";
import { BaseWeight } from "../../../src/model/weight.ts";
import { LORA_DW, LORA_DX, LORA_FWD, loraLinear, loraLinearRuns } from "../../../src/kernels/lora-linear.ts";

const gpu = await webgpuForTests();
describe.skipIf(!gpu)("LoRA terms on webgpu (held factors)", () => {
  it.each([8, 6])("alpha %d, r 4: y + terms in the product's epilogue, the bits of product + Add", async (alpha) => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    const ad = LoraAdapter.init(cfg, { r: 4, alpha, dropout: 0, targetModules: ["q_proj", "v_proj", "o_proj"] }, 3);
    ad.variables().forEach((v, i) => v.name.includes("lora_B") && v.assign(randn(v.shape, 10 + i)));
    const x = randn([3, cfg.hiddenSize], 1) as tf.Tensor2D;
    const release = ad.holdFactors([FUSED.qkv_proj, FUSED.o_proj], (m) => moduleDims(cfg, m)[1]); // built now
    const n0 = tf.memory().numTensors;
    for (const f of ["qkv_proj", "o_proj"] as const) {
      const ms = FUSED[f],
        outs = ms.map((m) => moduleDims(cfg, m)[1]);
      const y = randn([3, outs.reduce((a, b) => a + b, 0)], 2) as tf.Tensor2D;
      const ref = tf.tidy(() => tf.add(y, ad.fusedDelta(0, ms, outs, x, false)!));
      const prof = await tf.profile(() => tf.tidy(() => ad.addFusedDelta(0, ms, outs, x, false, y)));
      const got = prof.result as tf.Tensor;
      const names = prof.kernels.map((k) => k.name);
      expect(names, f).toContain("_FusedMatMul");
      expect(names, f).not.toContain("Add");
      expect(Array.from(await got.data()), f).toEqual(Array.from(await ref.data()));
      tf.dispose([y, ref, got]);
    }
    expect(tf.memory().numTensors).toBe(n0);
    release();
    tf.dispose(x);
    ad.dispose();
  });
});

/** Float64 matrix product of row-major a [n, k] and b [k, m] (bT: b given as [m, k]). */
function matmul64(
  a: Float64Array | Float32Array,
  b: Float64Array | Float32Array,
  n: number,
  k: number,
  m: number,
  bT = false,
): Float64Array {
  const out = new Float64Array(n * m);
  for (let i = 0; i < n; i++)
    for (let j = 0; j < m; j++) {
      let s = 0;
      for (let t = 0; t < k; t++) s += a[i * k + t] * (bT ? b[j * k + t] : b[t * m + j]);
      out[i * m + j] = s;
    }
  return out;
}
const transpose64 = (a: Float64Array | Float32Array, n: number, m: number) => {
  const out = new Float64Array(n * m);
  for (let i = 0; i < n; i++) for (let j = 0; j < m; j++) out[j * n + i] = a[i * m + j];
  return out;
};
/** max |got − want| / max |want|. */
const relErr = (got: Float32Array, want: Float64Array) => {
  let e = 0,
    w = 0;
  for (let i = 0; i < want.length; i++) {
    e = Math.max(e, Math.abs(got[i] - want[i]));
    w = Math.max(w, Math.abs(want[i]));
  }
  return e / w;
};

describe.skipIf(!gpu)("LoRA linear op on webgpu (lora-linear.ts)", () => {
  it.each([
    { name: "q/k/v-like, bias, f32 base", outs: [24, 8, 8], bias: true, addend: false, quantize: "none" as const },
    { name: "one member, residual, nf4 base", outs: [32], bias: false, addend: true, quantize: "nf4" as const },
    { name: "gate/up-like, both, int8 base", outs: [48, 48], bias: true, addend: true, quantize: "int8" as const },
    { name: "gate/up through SwiGLU, nf4 base", outs: [48, 48], bias: false, addend: false, quantize: "nf4" as const, swiglu: true },
    { name: "SwiGLU with a bias and an addend", outs: [40, 40], bias: true, addend: true, quantize: "none" as const, swiglu: true },
    {
      name: "rank 40 (more than a workgroup's threads sum each row)",
      outs: [24, 8, 8],
      bias: false,
      addend: false,
      quantize: "none" as const,
      r: 40,
    },
  ])("$name: value and every gradient equal a float64 reference", async ({ outs, bias, addend, quantize, r = 4, swiglu = false }) => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    const N = 70, // more than one workgroup of rows' threads, not a multiple of 64
      IN = 32,
      s = 1.5,
      k = outs.length,
      OUT = outs.reduce((a, b) => a + b, 0),
      I = outs[0],
      W = swiglu ? I : OUT; // the op's output width
    const act = swiglu ? ("swiglu" as const) : undefined;
    const wData = (await randn([IN, OUT], 1).data()) as Float32Array;
    const base = BaseWeight.fromFloat32(wData, IN, OUT, quantize);
    const w = (await tf.tidy(() => base.value()).data()) as Float32Array; // what the base multiplies by
    const x = randn([N, IN], 2) as tf.Tensor2D,
      b1 = bias ? (randn([OUT], 3) as tf.Tensor1D) : undefined,
      add = addend ? (randn([N, OUT], 4) as tf.Tensor2D) : undefined,
      as = outs.map((_, i) => randn([IN, r], 10 + i) as tf.Tensor2D),
      bs = outs.map((o, i) => randn([r, o], 20 + i) as tf.Tensor2D),
      C = randn([N, W], 5);
    expect(loraLinearRuns(as, bs)).toBe(true);
    const n0 = tf.memory().numTensors;
    const inputs = [x, ...(add ? [add] : []), ...as, ...bs];
    const prof = await tf.profile(() =>
      tf.tidy(() => {
        const { value, grads } = tf.valueAndGrads((...ts: tf.Tensor[]) => {
          const [xx, ...rest] = ts as tf.Tensor2D[];
          const aa = add ? rest.shift() : undefined;
          return tf.sum(tf.mul(loraLinear(xx, base.frozen(b1)!, aa, rest.slice(0, k), rest.slice(k), s, act), C));
        })(inputs);
        return [value, ...grads];
      }),
    );
    const names = prof.kernels.map((kk) => kk.name);
    for (const kn of [LORA_FWD, LORA_DX, LORA_DW]) expect(names).toContain(kn);
    // (a bias and a residual together are summed first: no module of the model has both)
    for (const gone of ["Concat", "MarlBlockDiag", "SplitV", "Slice", "MarlSwiglu", "MarlSwigluGrad", ...(bias && addend ? [] : ["Add"])])
      expect(names).not.toContain(gone);
    const [, ...grads] = prof.result as tf.Tensor[];
    // the reference, in float64: the fused output y (before any activation), then the activation
    const xd = (await x.data()) as Float32Array,
      cd = (await C.data()) as Float32Array;
    const ad = await Promise.all(as.map(async (a) => (await a.data()) as Float32Array)),
      bd = await Promise.all(bs.map(async (b) => (await b.data()) as Float32Array));
    const off = outs.map((_, i) => outs.slice(0, i).reduce((a, b) => a + b, 0));
    const block = (m: Float32Array | Float64Array, i: number) => {
      const out = new Float64Array(N * outs[i]);
      for (let n = 0; n < N; n++) for (let j = 0; j < outs[i]; j++) out[n * outs[i] + j] = m[n * OUT + off[i] + j];
      return out;
    };
    const y = matmul64(xd, w, N, IN, OUT);
    const bv = b1 ? ((await b1.data()) as Float32Array) : null,
      av = add ? ((await add.data()) as Float32Array) : null;
    for (let i = 0; i < k; i++) {
      const t = matmul64(
        matmul64(xd, ad[i], N, IN, r).map((v) => v * s),
        bd[i],
        N,
        r,
        outs[i],
      );
      for (let n = 0; n < N; n++) for (let j = 0; j < outs[i]; j++) y[n * OUT + off[i] + j] += t[n * outs[i] + j];
    }
    for (let n = 0; n < N; n++) for (let j = 0; j < OUT; j++) y[n * OUT + j] += (bv?.[j] ?? 0) + (av?.[n * OUT + j] ?? 0);
    let value = y,
      dOut: Float64Array = Float64Array.from(cd); // the gradient of y
    if (swiglu) {
      value = new Float64Array(N * I);
      dOut = new Float64Array(N * OUT);
      for (let n = 0; n < N; n++)
        for (let j = 0; j < I; j++) {
          const g = y[n * OUT + j],
            up = y[n * OUT + I + j],
            sg = 1 / (1 + Math.exp(-g)),
            c = cd[n * I + j];
          value[n * I + j] = g * sg * up;
          dOut[n * OUT + j] = c * up * sg * (1 + g * (1 - sg));
          dOut[n * OUT + I + j] = c * g * sg;
        }
    }
    let dx = matmul64(dOut, w, N, OUT, IN, true);
    const dA: Float64Array[] = [],
      dB: Float64Array[] = [];
    for (let i = 0; i < k; i++) {
      const xas = matmul64(xd, ad[i], N, IN, r).map((v) => v * s);
      const Ci = block(dOut, i);
      const dxa = matmul64(Ci, bd[i], N, outs[i], r, true).map((v) => v * s);
      const dxl = matmul64(dxa, ad[i], N, r, IN, true);
      dx = dx.map((v, j) => v + dxl[j]);
      dA.push(matmul64(transpose64(xd, N, IN), dxa, IN, N, r));
      dB.push(matmul64(transpose64(xas, N, r), Ci, r, N, outs[i]));
    }
    const want = [dx, ...(add ? [dOut] : []), ...dA, ...dB];
    expect(grads.length).toBe(want.length);
    for (let i = 0; i < want.length; i++)
      expect(relErr((await grads[i].data()) as Float32Array, want[i]), `gradient ${i}`).toBeLessThan(1e-5);
    const v = tf.tidy(() => loraLinear(x, base.frozen(b1)!, add, as, bs, s, act));
    expect(v.shape).toEqual([N, W]);
    expect(relErr((await v.data()) as Float32Array, value)).toBeLessThan(1e-5);
    v.dispose();
    tf.dispose(prof.result as tf.Tensor[]);
    expect(tf.memory().numTensors).toBe(n0);
    tf.dispose([x, C, ...as, ...bs, ...(b1 ? [b1] : []), ...(add ? [add] : [])]);
    base.dispose();
  });

  it("refuses SwiGLU on members that are not gate and up of one width", async () => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    const base = BaseWeight.fromFloat32(new Float32Array(8 * 12), 8, 12, "none");
    const as = [0, 1].map(() => tf.zeros([8, 2]) as tf.Tensor2D),
      bs = [4, 8].map((o) => tf.zeros([2, o]) as tf.Tensor2D),
      x = tf.zeros([3, 8]) as tf.Tensor2D;
    expect(() => loraLinear(x, base.frozen()!, undefined, as, bs, 2, "swiglu")).toThrow(/gate and up of one width, got widths 4, 8/);
    tf.dispose([...as, ...bs, x]);
    base.dispose();
  });
});
