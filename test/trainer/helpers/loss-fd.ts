/** The policy loss's tfjs value and gradient w.r.t. logp against a float64 reference and its central
 *  differences. Shared by the loss tests. */
import { expect } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { aggregateLoss, perTokenLoss, policyLoss, type PolicyLossConfig } from "../../../src/trainer/policy-loss.ts";

export interface LossCase {
  logp: number[][];
  old: number[][];
  ref: number[][];
  A: number[];
  mask: number[][];
}

/** Checks value and every gradient entry (5 decimals, no tensors left behind); returns how many
 *  gradient entries are clearly nonzero, so a caller can tell the check is not vacuous. */
export function expectGradMatchesFd(c: LossCase, cfg: PolicyLossConfig, f: (logp: number[][]) => number): number {
  const before = tf.memory().numTensors;
  const consts = { oldLogp: tf.tensor2d(c.old), refLogp: tf.tensor2d(c.ref), advantages: tf.tensor1d(c.A), mask: tf.tensor2d(c.mask) };
  const x = tf.tensor2d(c.logp);
  const g = tf.grad((lp: tf.Tensor) => {
    const r = policyLoss({ ...consts, logp: lp as tf.Tensor2D }, cfg);
    tf.dispose(Object.values(r.sums));
    return r.loss;
  })(x);
  const got = g.arraySync() as number[][];
  const value = tf.tidy(() => aggregateLoss(perTokenLoss({ ...consts, logp: x }, cfg).loss, consts.mask, cfg));
  expect(value.dataSync()[0]).toBeCloseTo(f(c.logp), 5);
  const h = 1e-6;
  let nonzero = 0;
  c.logp.forEach((row, n) =>
    row.forEach((_, t) => {
      const up = c.logp.map((r) => [...r]),
        dn = c.logp.map((r) => [...r]);
      up[n][t] += h;
      dn[n][t] -= h;
      const fd = (f(up) - f(dn)) / (2 * h);
      expect(got[n][t]).toBeCloseTo(fd, 5);
      if (Math.abs(fd) > 1e-3) nonzero++;
    }),
  );
  tf.dispose([g, x, value, ...Object.values(consts)]);
  expect(tf.memory().numTensors).toBe(before);
  return nonzero;
}
