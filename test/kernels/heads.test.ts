/** The heads kernels (src/kernels/heads.ts) on cpu and wasm: a decode step's, and any T's with its
 *  gradient, bit for bit the layer's op path (at a size whose RoPE the op path runs as its JS kernel,
 *  and at one where it runs as ops), within float32 rounding of float64 references and finite
 *  differences; one kernel each way; flat tensor counts. */
import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../src/kernels/backend.ts";
import { ropeTables } from "../../src/model/attention.ts";
import { decodeHeads, seqHeads, seqHeadsInto } from "../../src/kernels/heads.ts";
import { rope } from "../../src/kernels/rope-swiglu.ts";
import { heapHelpersReady, splitJobCount } from "../../src/kernels/wasm/heap.ts";
import { wasmThreads } from "../../src/kernels/wasm/threads.ts";
import { Rng } from "../../src/util/rng.ts";

const randn = (n: number, seed: number, scale = 1) => {
  const r = new Rng(seed);
  return Float32Array.from({ length: n }, () => scale * r.normal());
};
const hd = 8,
  half = hd / 2,
  scale = 1 / Math.sqrt(hd);
const invFreq = Float32Array.from({ length: hd / 2 }, (_, i) => 1 / 10000 ** ((2 * i) / hd));
const jr = (j: number) => (j < half ? j + half : j - half);

/** The layer's op path (qwen2.ts layer() without the kernels): split, RoPE, split, the scale, the layouts. */
function opsHeads(qkv: tf.Tensor2D, cos: tf.Tensor4D, sin: tf.Tensor4D, B: number, T: number, nH: number, nKv: number) {
  const [qk, v] = tf.split(qkv, [(nH + nKv) * hd, nKv * hd], 1);
  const [q, k] = tf.split(rope(tf.reshape(qk, [B, T, nH + nKv, hd]), cos, sin), [nH, nKv], 2);
  return [
    tf.transpose(tf.mul(q, scale), [0, 2, 1, 3]),
    tf.transpose(k, [0, 2, 3, 1]),
    tf.transpose(tf.reshape(v, [B, T, nKv, hd]), [0, 2, 1, 3]),
  ];
}

/** Inputs of a [B·T] step: qkv, real tables (positions 0..T−1 shifted per row), and the loss weights
 *  c of Σ q·c₀ + kT·c₁ + v·c₂ (whose gradient in qkv is the heads' adjoint applied to c). */
function inputs(B: number, T: number, nH: number, nKv: number) {
  const tab = ropeTables(
    Array.from({ length: B * T }, (_, n) => (n % T) + 5 * Math.floor(n / T)),
    invFreq,
  );
  const sizes = [B * nH * T * hd, B * nKv * hd * T, B * nKv * T * hd];
  return { qkv: randn(B * T * (nH + 2 * nKv) * hd, 30, 3), cos: tab.cos, sin: tab.sin, c: sizes.map((n, i) => randn(n, 31 + i)) };
}

/** q, kT, v and the gradient in qkv, through the kernel or the op path. */
function seqRun(viaOps: boolean, B: number, T: number, nH: number, nKv: number) {
  const x = inputs(B, T, nH, nKv);
  return tf.tidy(() => {
    const qkv = tf.tensor2d(x.qkv, [B * T, (nH + 2 * nKv) * hd]),
      cos = tf.tensor4d(x.cos, [B, T, 1, hd]),
      sin = tf.tensor4d(x.sin, [B, T, 1, hd]);
    const f = (a: tf.Tensor2D) => (viaOps ? opsHeads(a, cos, sin, B, T, nH, nKv) : seqHeads(a, cos, sin, B, T, nH, nKv, hd, scale)!);
    const heads = f(qkv),
      c = heads.map((h, i) => tf.tensor(x.c[i], h.shape));
    const grad = tf.grad((a: tf.Tensor) => tf.addN(f(a as tf.Tensor2D).map((h, i) => tf.sum(tf.mul(h, c[i])))) as tf.Scalar)(qkv);
    return [...heads, grad].map((t) => ({ shape: t.shape, data: t.dataSync().slice() as Float32Array }));
  });
}

/** The same in float64 on the host from qkv (the inputs' tables and weights): q, kT, v, the gradient
 *  in qkv and the loss. */
function reference(qkv: ArrayLike<number>, B: number, T: number, nH: number, nKv: number) {
  const { cos, sin, c } = inputs(B, T, nH, nKv),
    width = (nH + 2 * nKv) * hd;
  const out = c.map((a) => new Float64Array(a.length)),
    dx = new Float64Array(qkv.length);
  for (let b = 0; b < B; b++)
    for (let t = 0; t < T; t++) {
      const n = b * T + t,
        x = (h: number, j: number) => qkv[n * width + h * hd + j];
      for (let h = 0; h < nH + 2 * nKv; h++) {
        const [part, hh] = h < nH ? [0, h] : h < nH + nKv ? [1, h - nH] : [2, h - nH - nKv],
          heads = part === 0 ? nH : nKv,
          s = part === 0 ? scale : 1;
        // (b, hh, t, j) in the part's layout; kT is (B, nKv, hd, T)
        const at = (j: number) => (part === 1 ? ((b * heads + hh) * hd + j) * T + t : ((b * heads + hh) * T + t) * hd + j);
        for (let j = 0; j < hd; j++) {
          out[part][at(j)] = part === 2 ? x(h, j) : (x(h, j) * cos[n * hd + j] + x(h, jr(j)) * sin[n * hd + j]) * s;
          dx[n * width + h * hd + j] =
            part === 2 ? c[2][at(j)] : (c[part][at(j)] * cos[n * hd + j] + c[part][at(jr(j))] * sin[n * hd + jr(j)]) * s;
        }
      }
    }
  const loss = out.reduce((sum, o, p) => o.reduce((acc, y, i) => acc + y * c[p][i], sum), 0);
  return { out, dx, loss };
}

const expectBits = (got: Float32Array, want: Float32Array, what: string) => {
  const at = got.findIndex((x, i) => !Object.is(x, want[i]));
  expect(at === -1 ? "same bits" : `${what}[${at}]: ${got[at]} vs ${want[at]}`).toBe("same bits");
};
const maxRel = (got: ArrayLike<number>, want: ArrayLike<number>) =>
  Array.from(want).reduce((m, w, i) => Math.max(m, Math.abs(got[i] - w) / (Math.abs(w) + 1)), 0);

describe("attention heads kernels", () => {
  it("a decode step's heads: one kernel on cpu and wasm, bit-identical to the op path (GQA, 2 query heads per kv head)", async () => {
    await initBackend("wasm");
    const rows = 3,
      nH = 4,
      nKv = 2,
      width = (nH + 2 * nKv) * hd,
      scale = 1 / Math.sqrt(hd);
    const qkvs = randn(rows * width, 9, 3),
      tab = ropeTables([5, 17, 300], invFreq);
    const run = (viaOps: boolean) =>
      tf.tidy(() => {
        const qkv = tf.tensor2d(qkvs, [rows, width]),
          cos = tf.tensor4d(tab.cos, [rows, 1, 1, hd]),
          sin = tf.tensor4d(tab.sin, [rows, 1, 1, hd]);
        if (!viaOps) return decodeHeads(qkv, cos, sin, nH, nKv, hd, scale)!.map((t) => ({ shape: t.shape, data: t.dataSync().slice() }));
        // The layer's op path at T = 1 (its RoPE kernel): split, rope, split, scale, the attention layouts.
        const [qk, v] = tf.split(qkv, [(nH + nKv) * hd, nKv * hd], 1);
        const [q, k] = tf.split(rope(tf.reshape(qk, [rows, 1, nH + nKv, hd]), cos, sin), [nH, nKv], 2);
        const qg = tf.reshape(tf.transpose(tf.mul(q, scale), [0, 2, 1, 3]), [rows * nKv, nH / nKv, hd]);
        return [qg, tf.transpose(k, [0, 2, 3, 1]), tf.transpose(tf.reshape(v, [rows, 1, nKv, hd]), [0, 2, 1, 3])].map((t) => ({
          shape: t.shape,
          data: t.dataSync().slice(),
        }));
      });
    await tf.setBackend("cpu");
    const ref = run(true);
    expect(ref.map((r) => r.shape)).toEqual([
      [rows * nKv, 2, hd],
      [rows, nKv, hd, 1],
      [rows, nKv, 1, hd],
    ]);
    for (const backend of ["cpu", "wasm"]) {
      await tf.setBackend(backend);
      const before = tf.memory().numTensors;
      const got = run(false);
      got.forEach((g, i) => {
        expect(g.shape, `${backend} output ${i}`).toEqual(ref[i].shape);
        expect(Array.from(g.data), `${backend} output ${i}`).toEqual(Array.from(ref[i].data));
      });
      const qkv = tf.tensor2d(qkvs, [rows, width]),
        cos = tf.tensor4d(tab.cos, [rows, 1, 1, hd]),
        sin = tf.tensor4d(tab.sin, [rows, 1, 1, hd]);
      const prof = await tf.profile(() => {
        tf.dispose(decodeHeads(qkv, cos, sin, nH, nKv, hd, scale)!);
      });
      expect(
        prof.kernels.map((k) => k.name),
        backend,
      ).toEqual(["MarlDecodeHeads"]);
      tf.dispose([qkv, cos, sin]);
      expect(tf.memory().numTensors, backend).toBe(before);
    }
    await tf.setBackend("wasm");
  });

  // 2 × 3 positions: RoPE of 288 elements, which the op path runs as its JS kernel (one rounding);
  // 2 × 700: 67 200 elements, past that kernel's limit, so as ops (each product and the sum rounded):
  // on wasm the heap module's kernel then, its rows split over the helper threads where there are two.
  for (const [B, T] of [
    [2, 3],
    [2, 700],
  ])
    it(`any T's heads and their gradient, B ${B} T ${T}: bit-identical to the op path on cpu and wasm, float64 within rounding, one kernel each way`, async () => {
      await initBackend("wasm");
      const nH = 4,
        nKv = 2;
      const ref = reference(inputs(B, T, nH, nKv).qkv, B, T, nH, nKv);
      for (const backend of ["cpu", "wasm"]) {
        await tf.setBackend(backend);
        const before = tf.memory().numTensors;
        if (backend === "wasm") {
          const splits = () => {
            const at = splitJobCount();
            seqRun(false, B, T, nH, nKv);
            return splitJobCount() - at;
          };
          // seqRun's two forwards (the values, and the one tf.grad runs) and a backward, once the helper
          // threads (started in the background with the heap module) take jobs
          const n = wasmThreads() > 1 && T > 3 ? 3 : 0;
          await heapHelpersReady(tf.backend());
          expect(splits()).toBe(n);
        }
        const ops = seqRun(true, B, T, nH, nKv),
          got = seqRun(false, B, T, nH, nKv);
        ["q", "kT", "v", "d qkv"].forEach((what, i) => {
          expect(got[i].shape, `${backend} ${what}`).toEqual(ops[i].shape);
          expectBits(got[i].data, ops[i].data, `${backend} ${what}`);
          expect(maxRel(got[i].data, i < 3 ? ref.out[i] : ref.dx), `${backend} ${what}`).toBeLessThan(1e-6);
        });
        expect(tf.memory().numTensors, backend).toBe(before);
      }
      // The other rounding gives other bits here: the comparison above can tell them apart.
      const x = inputs(B, T, nH, nKv),
        [q1, q2] = [true, false].map((once) => {
          const q = new Float32Array(x.c[0].length);
          seqHeadsInto(
            q,
            new Float32Array(x.c[1].length),
            new Float32Array(x.c[2].length),
            x.qkv,
            x.cos,
            x.sin,
            T,
            nH,
            nKv,
            hd,
            scale,
            once,
          );
          return q;
        });
      expect(q1.some((a, i) => a !== q2[i])).toBe(true);
      await tf.setBackend("wasm");
    });

  it("any T's heads: one kernel each way, no transposes or splits; gradient matches finite differences; an output the loss skips gets zeros", async () => {
    await initBackend("wasm");
    const [B, T, nH, nKv] = [2, 5, 4, 2],
      width = (nH + 2 * nKv) * hd,
      x = inputs(B, T, nH, nKv);
    for (const backend of ["cpu", "wasm"]) {
      await tf.setBackend(backend);
      const before = tf.memory().numTensors;
      const qkv = tf.tensor2d(x.qkv, [B * T, width]),
        cos = tf.tensor4d(x.cos, [B, T, 1, hd]),
        sin = tf.tensor4d(x.sin, [B, T, 1, hd]);
      const heads = (a: tf.Tensor) => seqHeads(a as tf.Tensor2D, cos, sin, B, T, nH, nKv, hd, scale)!;
      const prof = await tf.profile(() => {
        tf.dispose(tf.grad((a: tf.Tensor) => tf.addN(heads(a).map((h) => tf.sum(h))) as tf.Scalar)(qkv));
      });
      const names = prof.kernels.map((k) => k.name);
      expect(
        names.filter((n) => n.startsWith("Marl")),
        backend,
      ).toEqual(["MarlSeqHeads", "MarlSeqHeadsGrad"]);
      expect(
        names.filter((n) => ["Transpose", "SplitV", "Concat"].includes(n)),
        backend,
      ).toEqual([]);
      // Σ q only: kT and v have no gradient from the loss, and their columns get zeros.
      const dq = tf.tidy(() =>
        tf
          .grad((a: tf.Tensor) => tf.sum(heads(a)[0]))(qkv)
          .dataSync()
          .slice(),
      );
      for (let n = 0; n < B * T; n++) expect(dq.slice(n * width + nH * hd, (n + 1) * width).every((d) => d === 0)).toBe(true);
      expect(dq.some((d) => d !== 0)).toBe(true);
      tf.dispose([qkv, cos, sin]);
      expect(tf.memory().numTensors, backend).toBe(before);
    }
    await tf.setBackend("wasm");
    const d = seqRun(false, B, T, nH, nKv)[3].data,
      at = Float64Array.from(x.qkv),
      h = 1e-3;
    for (const k of [0, 3, 5, 12, width - 1, width + 17, 3 * width + 40, B * T * width - 1]) {
      const o = at[k];
      at[k] = o + h;
      const up = reference(at, B, T, nH, nKv).loss;
      at[k] = o - h;
      const dn = reference(at, B, T, nH, nKv).loss;
      at[k] = o;
      expect(d[k], `d qkv[${k}]`).toBeCloseTo((up - dn) / (2 * h), 4);
    }
  });
});
