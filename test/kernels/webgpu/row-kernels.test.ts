/** The fused WGSL row kernels (src/kernels/webgpu/rows.ts) against float64 references computed on the
 *  host from the same float32 inputs: RMSNorm, SwiGLU, RoPE and attention's softmax with their gradients,
 *  a decode step's q/k/v heads, and a row's log p(target), entropy and logits gradient. Each also
 *  checks it ran as the fused dispatches (not the op path). Widths that are not multiples of 4 and
 *  rows wider than a workgroup are included. */
import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../../../src/kernels/backend.ts";
import { dLogits, logpEntropy } from "../../../src/kernels/logprob.ts";
import { rmsNorm } from "../../../src/kernels/rmsnorm.ts";
import { decodeHeads, headsOut, seqHeads, sharedSeqHeads } from "../../../src/kernels/heads.ts";
import { rope, swiglu } from "../../../src/kernels/rope-swiglu.ts";
import { softmax, softmaxBiased } from "../../../src/kernels/softmax.ts";
import { webgpuTraffic } from "../../../src/kernels/webgpu/device.ts";
import { blockDiagonal } from "../../../src/kernels/block-diag.ts";
import { gatherRows } from "../../../src/kernels/gather-rows.ts";
import { Rng } from "../../../src/util/rng.ts";
import { webgpuForTests } from "./helpers/adapter.ts";

const gpu = await webgpuForTests();
const randn = (n: number, seed: number, scale = 1) => {
  const r = new Rng(seed);
  return Float32Array.from({ length: n }, () => r.normal() * scale);
};

/** float32 rounding of the sums involved: |got − want| ≤ tol·(|want| + scale), scale the row's typical magnitude. */
function close(got: ArrayLike<number>, want: ArrayLike<number>, what: string, tol = 2e-6, scale = 1): void {
  expect(got.length, what).toBe(want.length);
  let worst = 0,
    at = -1;
  for (let i = 0; i < want.length; i++) {
    const e = Math.abs(got[i] - want[i]) / (Math.abs(want[i]) + scale);
    if (!(e <= worst)) [worst, at] = [e, i];
  }
  expect(worst, `${what}: worst relative error at ${at}: got ${got[at]}, want ${want[at]}`).toBeLessThanOrEqual(tol);
}

/** Dispatches `f` makes (its tensors disposed after). */
async function dispatchesOf(f: () => tf.Tensor | tf.Tensor[]): Promise<{ n: number; values: Float32Array[] }> {
  const t0 = webgpuTraffic().dispatches;
  const out = f();
  const n = webgpuTraffic().dispatches - t0;
  const list = Array.isArray(out) ? out : [out];
  const values = await Promise.all(list.map(async (t) => (await t.data()) as Float32Array));
  tf.dispose(list);
  return { n, values };
}

describe.skipIf(!gpu)("webgpu fused row kernels", () => {
  it("RMSNorm and its gradient: one dispatch forward, three backward, float64 reference", async () => {
    expect(await initBackend("webgpu")).toBe("webgpu");
    const before = tf.memory().numTensors;
    for (const [N, H] of [
      [5, 96],
      [3, 2100],
    ]) {
      const xs = randn(N * H, 1),
        ws = randn(H, 2, 0.5).map((v) => 1 + v),
        dys = randn(N * H, 3),
        eps = 1e-6;
      const x = tf.tensor2d(xs, [N, H]),
        w = tf.tensor1d(ws),
        dy = tf.tensor2d(dys, [N, H]);
      const y = new Float64Array(N * H),
        dx = new Float64Array(N * H),
        dw = new Float64Array(H);
      for (let n = 0; n < N; n++) {
        let ss = 0,
          s = 0;
        for (let j = 0; j < H; j++) ((ss += xs[n * H + j] ** 2), (s += dys[n * H + j] * ws[j] * xs[n * H + j]));
        const r = 1 / Math.sqrt(ss / H + eps);
        for (let j = 0; j < H; j++) {
          y[n * H + j] = xs[n * H + j] * r * ws[j];
          dx[n * H + j] = r * dys[n * H + j] * ws[j] - (r ** 3 * xs[n * H + j] * s) / H;
          dw[j] += dys[n * H + j] * xs[n * H + j] * r;
        }
      }
      const f = await dispatchesOf(() => rmsNorm(x, w, eps));
      expect(f.n, "forward dispatches").toBe(1);
      close(f.values[0], y, `rmsnorm ${N}×${H}`);
      const g = await dispatchesOf(() =>
        tf.grads((a: tf.Tensor, b: tf.Tensor) => rmsNorm(a as tf.Tensor2D, b as tf.Tensor1D, eps))([x, w], dy),
      );
      expect(g.n, "forward + backward dispatches").toBe(4);
      close(g.values[0], dx, `rmsnorm dx ${N}×${H}`, 1e-5);
      close(g.values[1], dw, `rmsnorm dw ${N}×${H}`, 1e-5, Math.sqrt(N));
      // a frozen weight (LoRA training): dx alone, one dispatch
      const gx = await dispatchesOf(() => [tf.grad((a: tf.Tensor) => rmsNorm(a as tf.Tensor2D, w, eps))(x, dy)]);
      expect(gx.n, "forward + backward dispatches, dx only").toBe(2);
      close(gx.values[0], dx, `rmsnorm dx only ${N}×${H}`, 1e-5);
      tf.dispose([x, w, dy]);
    }
    expect(tf.memory().numTensors).toBe(before);
  });

  it("SwiGLU and its gradient: one dispatch each way", async () => {
    await initBackend("webgpu");
    const N = 6,
      I = 75;
    const gus = randn(N * 2 * I, 4, 3),
      dys = randn(N * I, 5);
    const y = new Float64Array(N * I),
      dgu = new Float64Array(N * 2 * I);
    for (let n = 0; n < N; n++)
      for (let j = 0; j < I; j++) {
        const g = gus[n * 2 * I + j],
          u = gus[n * 2 * I + I + j],
          d = dys[n * I + j],
          s = 1 / (1 + Math.exp(-g));
        y[n * I + j] = g * s * u;
        dgu[n * 2 * I + j] = d * u * s * (1 + g * (1 - s));
        dgu[n * 2 * I + I + j] = d * g * s;
      }
    const gu = tf.tensor2d(gus, [N, 2 * I]),
      dy = tf.tensor2d(dys, [N, I]);
    const f = await dispatchesOf(() => swiglu(gu));
    expect(f.n).toBe(1);
    close(f.values[0], y, "swiglu", 1e-6);
    const g = await dispatchesOf(() => tf.grad((a: tf.Tensor) => swiglu(a as tf.Tensor2D))(gu, dy));
    expect(g.n).toBe(2);
    close(g.values[0], dgu, "swiglu grad", 1e-6);
    tf.dispose([gu, dy]);
  });

  it("attention softmax and its gradient (masked scores get exactly 0): one dispatch each way", async () => {
    await initBackend("webgpu");
    const [B, H, T, S] = [2, 3, 4, 37];
    const xs = randn(B * H * T * S, 6, 4),
      dys = randn(B * H * T * S, 7);
    for (let i = 0; i < xs.length; i += 5) xs[i] = -1e9; // masked
    const R = B * H * T;
    const y = new Float64Array(R * S),
      dx = new Float64Array(R * S);
    for (let r = 0; r < R; r++) {
      const row = Array.from(xs.subarray(r * S, (r + 1) * S)),
        m = Math.max(...row),
        e = row.map((v) => Math.exp(v - m)),
        z = e.reduce((a, b) => a + b, 0);
      let t = 0;
      for (let j = 0; j < S; j++) ((y[r * S + j] = e[j] / z), (t += dys[r * S + j] * (e[j] / z)));
      for (let j = 0; j < S; j++) dx[r * S + j] = y[r * S + j] * (dys[r * S + j] - t);
    }
    const x = tf.tensor4d(xs, [B, H, T, S]),
      dy = tf.tensor4d(dys, [B, H, T, S]);
    const f = await dispatchesOf(() => softmax(x));
    expect(f.n).toBe(1);
    close(f.values[0], y, "softmax", 2e-6, 1e-6);
    for (let i = 0; i < xs.length; i += 5) expect(f.values[0][i]).toBe(0);
    const g = await dispatchesOf(() => tf.grad((a: tf.Tensor) => softmax(a))(x, dy));
    expect(g.n).toBe(2);
    close(g.values[0], dx, "softmax grad", 2e-6, 0.1); // dy − Σ dy·y cancels: float32 rounding of terms ~0.1
    tf.dispose([x, dy]);
  });

  it("attention softmax with the mask added as it reads the scores: one dispatch, bias row (b, t) for every head", async () => {
    await initBackend("webgpu");
    const [B, H, T, S] = [2, 3, 5, 9];
    const xs = randn(B * H * T * S, 8),
      bs = randn(B * T * S, 9);
    for (let i = 0; i < bs.length; i += 4) bs[i] = -1e9; // masked
    const y = new Float64Array(B * H * T * S);
    for (let b = 0; b < B; b++)
      for (let h = 0; h < H; h++)
        for (let t = 0; t < T; t++) {
          const r = (b * H + h) * T + t,
            row = Array.from({ length: S }, (_, j) => xs[r * S + j] + bs[(b * T + t) * S + j]);
          const m = Math.max(...row),
            e = row.map((v) => Math.exp(v - m)),
            z = e.reduce((a, c) => a + c, 0);
          for (let j = 0; j < S; j++) y[r * S + j] = e[j] / z;
        }
    const x = tf.tensor4d(xs, [B, H, T, S]),
      bias = tf.tensor4d(bs, [B, 1, T, S]);
    const f = await dispatchesOf(() => softmaxBiased(x, bias));
    expect(f.n).toBe(1);
    close(f.values[0], y, "softmax(x + bias)", 2e-6, 1e-6);
    for (let i = 0; i < y.length; i++) if (y[i] === 0) expect(f.values[0][i]).toBe(0);
    // its gradient is the softmax's (the bias is a constant)
    const dy = tf.tensor4d(randn(B * H * T * S, 10), [B, H, T, S]);
    const [g, want] = tf.tidy(() => [
      tf.grad((a: tf.Tensor) => softmaxBiased(a as tf.Tensor4D, bias))(x, dy),
      tf.grad((a: tf.Tensor) => softmax(tf.add(a, bias)))(x, dy),
    ]);
    close(await g.data(), await want.data(), "gradient", 1e-6);
    tf.dispose([x, bias, dy, g, want]);
  });

  it("rows by host indices (repeated, and −1 for zeros) and their gradient: one dispatch each way", async () => {
    await initBackend("webgpu");
    const [R, C] = [7, 5];
    const xs = randn(R * C, 11);
    const idx = Int32Array.from([3, -1, 0, 3, 6, 3, -1, 1]);
    const dys = randn(idx.length * C, 12);
    const want = new Float64Array(idx.length * C),
      dx = new Float64Array(R * C);
    idx.forEach((r, i) => {
      for (let c = 0; c < C; c++) {
        want[i * C + c] = r < 0 ? 0 : xs[r * C + c];
        if (r >= 0) dx[r * C + c] += dys[i * C + c];
      }
    });
    const x = tf.tensor2d(xs, [R, C]),
      dy = tf.tensor2d(dys, [idx.length, C]);
    const f = await dispatchesOf(() => gatherRows(x, idx));
    expect(f.n).toBe(1);
    close(f.values[0], want, "rows", 0);
    const g = await dispatchesOf(() => tf.grad((a: tf.Tensor) => gatherRows(a as tf.Tensor2D, idx))(x, dy));
    expect(g.n).toBe(2); // the forward again, and the gradient's one
    close(g.values[0], dx, "gradient", 1e-6);
    expect(() => gatherRows(x, Int32Array.from([R]))).toThrow(/index 7 outside \[-1, 7\)/);
    tf.dispose([x, dy]);
  });

  it("the heads of rows sharing a prefix and their gradient: one dispatch each way, as heads of the parts, tiles and concatenations", async () => {
    await initBackend("webgpu");
    const [P, B, T, nH, nKv, hd] = [5, 3, 4, 4, 2, 8],
      width = (nH + 2 * nKv) * hd,
      scale = 1 / Math.sqrt(hd);
    const qkv = tf.tensor2d(randn((P + B * T) * width, 30), [P + B * T, width]),
      cosP = tf.tensor4d(randn(P * hd, 31), [1, P, 1, hd]),
      sinP = tf.tensor4d(randn(P * hd, 32), [1, P, 1, hd]),
      cosO = tf.tensor4d(randn(B * T * hd, 33), [B, T, 1, hd]),
      sinO = tf.tensor4d(randn(B * T * hd, 34), [B, T, 1, hd]);
    const a = { P, B, T, nH, nKv, hd, scale };
    // the op path the layer takes elsewhere: the parts' heads, the prefix's keys and values tiled per row
    const reference = (x: tf.Tensor2D) => {
      const [qp, kp, vp] = seqHeads(tf.slice(x, [0, 0], [P, width]), cosP, sinP, 1, P, nH, nKv, hd, scale)!;
      const [qo, ko, vo] = seqHeads(tf.slice(x, [P, 0], [B * T, width]), cosO, sinO, B, T, nH, nKv, hd, scale)!;
      return [qp, kp, vp, qo, tf.concat([tf.tile(kp, [B, 1, 1, 1]), ko], 3), tf.concat([tf.tile(vp, [B, 1, 1, 1]), vo], 2)];
    };
    const f = await dispatchesOf(() => sharedSeqHeads(qkv, cosP, sinP, cosO, sinO, a)!);
    expect(f.n).toBe(1);
    const want = tf.tidy(() => reference(qkv));
    for (let i = 0; i < 6; i++) {
      expect(f.values[i].length, `output ${i}`).toBe(want[i].size);
      close(f.values[i], await want[i].data(), `output ${i}`, 0);
    }
    // a cotangent for every output: the gradient sums the prefix's key and value over its copies
    const cts = want.map((w, i) => tf.tensor(randn(w.size, 40 + i), w.shape));
    const loss = (outs: tf.Tensor[]) => tf.addN(outs.map((o, i) => tf.sum(tf.mul(o, cts[i]))));
    const g = await dispatchesOf(() => tf.grad((x: tf.Tensor) => loss(sharedSeqHeads(x as tf.Tensor2D, cosP, sinP, cosO, sinO, a)!))(qkv));
    const gw = tf.tidy(() => tf.grad((x: tf.Tensor) => loss(reference(x as tf.Tensor2D)))(qkv));
    close(g.values[0], await gw.data(), "gradient", 1e-6);
    tf.dispose([qkv, cosP, sinP, cosO, sinO, ...want, ...cts, gw]);
  });

  it("attention outputs of two parts as the rows of one matrix, and back: one dispatch each way", async () => {
    await initBackend("webgpu");
    const [nH, nKv, hd] = [4, 2, 8],
      g = nH / nKv,
      parts = [
        { B: 1, T: 5 },
        { B: 3, T: 4 },
      ];
    const ctxs = parts.map(({ B, T }, i) => tf.tensor3d(randn(B * nH * T * hd, 50 + i), [B * nKv, g * T, hd]));
    const reference = (cs: tf.Tensor[]) =>
      tf.concat(
        cs.map((c, i) =>
          tf.reshape(tf.transpose(tf.reshape(c, [parts[i].B, nH, parts[i].T, hd]), [0, 2, 1, 3]), [parts[i].B * parts[i].T, nH * hd]),
        ),
        0,
      );
    const f = await dispatchesOf(() => headsOut(ctxs, parts, nH, hd)!);
    expect(f.n).toBe(1);
    const want = reference(ctxs);
    close(f.values[0], await want.data(), "rows", 0);
    const dy = tf.tensor2d(randn(want.size, 60), want.shape as [number, number]);
    const got = tf.grads((a: tf.Tensor, b: tf.Tensor) =>
      tf.sum(tf.mul(headsOut([a as tf.Tensor3D, b as tf.Tensor3D], parts, nH, hd)!, dy)),
    )(ctxs);
    const ref = tf.grads((a: tf.Tensor, b: tf.Tensor) => tf.sum(tf.mul(reference([a, b]), dy)))(ctxs);
    for (let i = 0; i < 2; i++) {
      expect(got[i].shape).toEqual(ctxs[i].shape);
      close(await got[i].data(), await ref[i].data(), `gradient ${i}`, 0);
    }
    tf.dispose([...ctxs, want, dy, ...got, ...ref]);
  });

  it("RoPE and its gradient (the adjoint rotation): one dispatch each way, float64 reference", async () => {
    await initBackend("webgpu");
    const [B, T, H, hd] = [2, 3, 5, 8],
      rows = B * T;
    const xs = randn(rows * H * hd, 13),
      cs = randn(rows * hd, 14),
      ss = randn(rows * hd, 15),
      dys = randn(rows * H * hd, 16);
    const y = new Float64Array(xs.length),
      dx = new Float64Array(xs.length);
    for (let r = 0; r < rows; r++)
      for (let h = 0; h < H; h++)
        for (let j = 0; j < hd; j++) {
          const o = (r * H + h) * hd,
            jr = j < hd / 2 ? j + hd / 2 : j - hd / 2;
          y[o + j] = xs[o + j] * cs[r * hd + j] + xs[o + jr] * ss[r * hd + j];
          // d/dx of Σ dy·y: x_j feeds y_j through cos_j and y_jr through sin_jr
          dx[o + j] = dys[o + j] * cs[r * hd + j] + dys[o + jr] * ss[r * hd + jr];
        }
    const x = tf.tensor4d(xs, [B, T, H, hd]),
      cos = tf.tensor4d(cs, [B, T, 1, hd]),
      sin = tf.tensor4d(ss, [B, T, 1, hd]),
      dy = tf.tensor4d(dys, [B, T, H, hd]);
    const f = await dispatchesOf(() => rope(x, cos, sin));
    expect(f.n).toBe(1);
    close(f.values[0], y, "rope", 1e-6);
    const g = await dispatchesOf(() => tf.grad((a: tf.Tensor) => rope(a as tf.Tensor4D, cos, sin))(x, dy));
    expect(g.n).toBeLessThanOrEqual(4); // forward, the adjoint, and the zero gradients of the tables
    close(g.values[0], dx, "rope grad", 1e-6);
    tf.dispose([x, cos, sin, dy]);
  });

  it("a decode step's q/k/v heads with RoPE: three dispatches, the layouts attention reads", async () => {
    await initBackend("webgpu");
    const [B, nH, nKv, hd] = [3, 6, 2, 8],
      width = (nH + 2 * nKv) * hd,
      scale = 1 / Math.sqrt(hd);
    const qkvs = randn(B * width, 8),
      cs = randn(B * hd, 9),
      ss = randn(B * hd, 10);
    const rot = (b: number, h: number, j: number) => {
      const o = b * width + h * hd,
        jr = j < hd / 2 ? j + hd / 2 : j - hd / 2;
      return qkvs[o + j] * cs[b * hd + j] + qkvs[o + jr] * ss[b * hd + j];
    };
    const q: number[] = [],
      k: number[] = [],
      v: number[] = [];
    for (let b = 0; b < B; b++) {
      for (let h = 0; h < nH; h++) for (let j = 0; j < hd; j++) q.push(rot(b, h, j) * scale);
      for (let h = 0; h < nKv; h++) for (let j = 0; j < hd; j++) k.push(rot(b, nH + h, j));
      for (let h = 0; h < nKv; h++) for (let j = 0; j < hd; j++) v.push(qkvs[b * width + (nH + nKv + h) * hd + j]);
    }
    const qkv = tf.tensor2d(qkvs, [B, width]),
      cos = tf.tensor4d(cs, [B, 1, 1, hd]),
      sin = tf.tensor4d(ss, [B, 1, 1, hd]);
    let shapes: number[][] = [];
    const r = await dispatchesOf(() => {
      const out = decodeHeads(qkv, cos, sin, nH, nKv, hd, scale)!;
      shapes = out.map((t) => t.shape);
      return out;
    });
    expect(r.n).toBe(3);
    expect(shapes).toEqual([
      [B * nKv, nH / nKv, hd],
      [B, nKv, hd, 1],
      [B, nKv, 1, hd],
    ]);
    close(r.values[0], q, "q", 1e-6);
    close(r.values[1], k, "k", 1e-6);
    close(r.values[2], v, "v", 0);
    tf.dispose([qkv, cos, sin]);
  });

  it("the heads of any T (prefill, training) and their gradient: one dispatch each way", async () => {
    await initBackend("webgpu");
    const [B, T, nH, nKv, hd] = [2, 3, 4, 2, 8],
      width = (nH + 2 * nKv) * hd,
      N = B * T,
      scale = 1 / Math.sqrt(hd),
      half = hd / 2;
    const qkvs = randn(N * width, 17),
      cs = randn(N * hd, 18),
      ss = randn(N * hd, 19);
    const dqs = randn(B * nH * T * hd, 20),
      dks = randn(B * nKv * hd * T, 21),
      dvs = randn(B * nKv * T * hd, 22);
    const jr = (j: number) => (j < half ? j + half : j - half);
    const rot = (n: number, h: number, j: number) =>
      qkvs[n * width + h * hd + j] * cs[n * hd + j] + qkvs[n * width + h * hd + jr(j)] * ss[n * hd + j];
    const q = new Float64Array(dqs.length),
      k = new Float64Array(dks.length),
      v = new Float64Array(dvs.length),
      dx = new Float64Array(N * width);
    for (let b = 0; b < B; b++)
      for (let t = 0; t < T; t++) {
        const n = b * T + t;
        for (let j = 0; j < hd; j++) {
          for (let h = 0; h < nH; h++) {
            const o = ((b * nH + h) * T + t) * hd;
            q[o + j] = rot(n, h, j) * scale;
            dx[n * width + h * hd + j] = (dqs[o + j] * cs[n * hd + j] + dqs[o + jr(j)] * ss[n * hd + jr(j)]) * scale;
          }
          for (let h = 0; h < nKv; h++) {
            const o = (b * nKv + h) * hd * T + t; // kT (B, nKv, hd, T)
            k[o + j * T] = rot(n, nH + h, j);
            dx[n * width + (nH + h) * hd + j] = dks[o + j * T] * cs[n * hd + j] + dks[o + jr(j) * T] * ss[n * hd + jr(j)];
            const ov = ((b * nKv + h) * T + t) * hd;
            v[ov + j] = qkvs[n * width + (nH + nKv + h) * hd + j];
            dx[n * width + (nH + nKv + h) * hd + j] = dvs[ov + j];
          }
        }
      }
    const qkv = tf.tensor2d(qkvs, [N, width]),
      cos = tf.tensor4d(cs, [B, T, 1, hd]),
      sin = tf.tensor4d(ss, [B, T, 1, hd]);
    const f = await dispatchesOf(() => seqHeads(qkv, cos, sin, B, T, nH, nKv, hd, scale)!);
    expect(f.n).toBe(1);
    close(f.values[0], q, "q", 1e-6);
    close(f.values[1], k, "kT", 1e-6);
    close(f.values[2], v, "v", 0);
    const dq = tf.tensor(dqs, [B, nH, T, hd]),
      dk = tf.tensor(dks, [B, nKv, hd, T]),
      dv = tf.tensor(dvs, [B, nKv, T, hd]);
    // Σ dq·q + dk·kT + dv·v: its gradient in qkv is the heads' adjoint applied to (dq, dk, dv)
    const g = await dispatchesOf(() =>
      tf.grad((x: tf.Tensor) => {
        const [a, c, e] = seqHeads(x as tf.Tensor2D, cos, sin, B, T, nH, nKv, hd, scale)!;
        return tf.addN([tf.sum(tf.mul(a, dq)), tf.sum(tf.mul(c, dk)), tf.sum(tf.mul(e, dv))]);
      })(qkv),
    );
    expect(g.n).toBeLessThanOrEqual(3 + 6 + 1 + 6 + 1); // forward 3, the loss's 6 + addN, its backward, and ours: 1
    close(g.values[0], dx, "d qkv", 1e-6);
    tf.dispose([qkv, cos, sin, dq, dk, dv]);
  });

  it("LoRA's block-diagonal B: one dispatch, gradients the blocks of the output's", async () => {
    await initBackend("webgpu");
    const r = 2,
      outs = [3, 1, 2],
      total = 6;
    const bs = outs.map((o, i) => randn(r * o, 30 + i));
    const want = new Float64Array(outs.length * r * total);
    let off = 0;
    outs.forEach((o, i) => {
      for (let a = 0; a < r; a++) for (let c = 0; c < o; c++) want[(i * r + a) * total + off + c] = bs[i][a * o + c];
      off += o;
    });
    const ts = bs.map((b, i) => tf.tensor2d(b, [r, outs[i]]));
    const f = await dispatchesOf(() => blockDiagonal(ts)!);
    expect(f.n).toBe(1);
    close(f.values[0], want, "block diagonal", 0);
    const ws = randn(want.length, 40),
      w = tf.tensor2d(ws, [outs.length * r, total]);
    const g = await dispatchesOf(() => tf.grads((...xs: tf.Tensor[]) => tf.sum(tf.mul(blockDiagonal(xs as tf.Tensor2D[])!, w)))(ts));
    off = 0;
    outs.forEach((o, i) => {
      const blk: number[] = [];
      for (let a = 0; a < r; a++) for (let c = 0; c < o; c++) blk.push(ws[(i * r + a) * total + off + c]);
      close(g.values[i], blk, `d b${i}`, 0);
      off += o;
    });
    tf.dispose([...ts, w]);
  });

  it("log p(target), entropy and the logits gradient over a wide vocabulary: one dispatch each", async () => {
    await initBackend("webgpu");
    const [n, V] = [5, 3001];
    const xs = randn(n * V, 11, 3),
      targets = [0, 3000, 17, 1500, 17],
      dys = randn(n * 2, 12);
    const lp: number[] = [],
      dl = new Float64Array(n * V);
    for (let r = 0; r < n; r++) {
      const row = Array.from(xs.subarray(r * V, (r + 1) * V)),
        m = Math.max(...row),
        z = row.reduce((a, x) => a + Math.exp(x - m), 0),
        lse = m + Math.log(z);
      lp.push(row[targets[r]] - lse, lse - row.reduce((a, x) => a + Math.exp(x - lse) * x, 0));
      for (let j = 0; j < V; j++) dl[r * V + j] = dys[2 * r] * ((j === targets[r] ? 1 : 0) - Math.exp(row[j] - lse));
    }
    const logits = tf.tensor2d(xs, [n, V]),
      dy = tf.tensor2d(dys, [n, 2]);
    const f = await dispatchesOf(() => logpEntropy(logits, targets));
    expect(f.n).toBe(1);
    close(f.values[0], lp, "log p and entropy", 2e-6);
    const g = await dispatchesOf(() => dLogits(logits, targets, dy));
    expect(g.n).toBe(1);
    close(g.values[0], dl, "d logits", 2e-6, 1e-4);
    tf.dispose([logits, dy]);
  });
});
