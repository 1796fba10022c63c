/** AdamW as torch.optim.AdamW computes it (decoupled weight decay, bias correction, no amsgrad), global
 *  gradient-norm clipping as torch.nn.utils.clip_grad_norm_, and the optimizer state as named
 *  Float32Arrays for checkpoints. On webgpu the step is the engine's device programs (kernels/adamw.ts:
 *  one dispatch per group of variables for the update and one per group for the norm, the norm read
 *  once at the end); on other backends tfjs ops, with the norm read before the update. Leaves out
 *  param groups, amsgrad. */
import * as tf from "@tensorflow/tfjs";
import { deviceAdamW, deviceGradNorm, hasDeviceAdamW, type AdamWConstants } from "../kernels/adamw.ts";
import { NonFiniteError } from "../util/errors.ts";

export interface AdamWConfig {
  lr: number; // used when step() is given no lr (a schedule usually passes one per step)
  beta1?: number; // default 0.9
  beta2?: number; // default 0.999
  eps?: number; // default 1e-8
  weightDecay?: number; // default 0.01, torch's; transformers' Trainer passes 0.0 unless told
}

/** Global L2 norm over all gradients: sqrt(Σ_g ‖g‖²), as clip_grad_norm_ returns it. */
export async function globalNorm(grads: tf.NamedTensorMap): Promise<number> {
  const parts = Object.values(grads);
  if (parts.length === 0) return 0;
  // stack + sum rather than addN: a webgpu kernel binds at most 8–16 buffers, and tfjs' AddN does not
  // split its inputs (Concat, under stack, does)
  const sq = tf.tidy(() => tf.sum(tf.stack(parts.map((g) => tf.sum(tf.square(g))))));
  const norm = Math.sqrt((await sq.data())[0]); // one read per step (GPU backends read asynchronously)
  sq.dispose();
  return norm;
}

/** torch's clip_grad_norm_: scale every gradient by min(1, maxNorm / (norm + 1e-6)). Returns new
 *  tensors (the inputs stay the caller's to dispose) and the norm before clipping. A NaN/Inf norm
 *  throws NonFiniteError (torch's error_if_nonfinite=True) and returns nothing. */
export async function clipGradNorm(grads: tf.NamedTensorMap, maxNorm: number): Promise<{ grads: tf.NamedTensorMap; norm: number }> {
  if (!(maxNorm > 0)) throw new Error(`maxNorm ${maxNorm} must be > 0`);
  const norm = await globalNorm(grads);
  if (!Number.isFinite(norm)) throw new NonFiniteError("gradient norm", norm);
  const coef = Math.min(1, maxNorm / (norm + 1e-6));
  const out: tf.NamedTensorMap = {};
  const c = tf.scalar(coef); // one scalar for every product: a number would be one upload each on a GPU
  for (const [name, g] of Object.entries(grads)) out[name] = tf.mul(g, c);
  c.dispose();
  return { grads: out, norm };
}

export class AdamW {
  readonly lr: number;
  readonly beta1: number;
  readonly beta2: number;
  readonly eps: number;
  readonly weightDecay: number;
  private stepCount = 0;
  private readonly vars: Map<string, tf.Variable>;
  /** Per variable its m (torch's exp_avg) then its v (exp_avg_sq), flat [2·size]: one tensor the
   *  device step updates in place. */
  private moments = new Map<string, tf.Tensor1D>();

  constructor(variables: tf.Variable[], cfg: AdamWConfig) {
    this.lr = cfg.lr;
    this.beta1 = cfg.beta1 ?? 0.9;
    this.beta2 = cfg.beta2 ?? 0.999;
    this.eps = cfg.eps ?? 1e-8;
    this.weightDecay = cfg.weightDecay ?? 0.01;
    checkHyper("lr", this.lr, 0, Infinity);
    checkHyper("beta1", this.beta1, 0, 1);
    checkHyper("beta2", this.beta2, 0, 1);
    checkHyper("eps", this.eps, 0, Infinity);
    checkHyper("weightDecay", this.weightDecay, 0, Infinity);
    if (variables.length === 0) throw new Error("AdamW got no variables; pass the model's trainableVariables()");
    this.vars = new Map();
    for (const v of variables) {
      if (this.vars.has(v.name)) throw new Error(`variable name "${v.name}" appears twice; optimizer state is keyed by name`);
      this.vars.set(v.name, v);
      this.moments.set(v.name, tf.zeros([2 * v.size]));
    }
  }

  /** Optimizer steps taken so far (torch's state["step"]). */
  get step(): number {
    return this.stepCount;
  }

  variableNames(): string[] {
    return [...this.vars.keys()];
  }

  /** One update from gradients keyed by variable name (as tf.variableGrads returns them). Variables
   *  with no gradient are treated as zero-gradient (they still decay and use their moments, as torch
   *  does when .grad is zero; torch skips params whose .grad is None — we have no None).
   *  With maxGradNorm, clips first. A NaN/Inf gradient norm throws NonFiniteError before anything
   *  changes. Does not dispose `grads`. Returns the gradient norm before clipping. */
  async applyGradients(grads: tf.NamedTensorMap, opts: { lr?: number; maxGradNorm?: number } = {}): Promise<{ gradNorm: number }> {
    for (const name of Object.keys(grads))
      if (!this.vars.has(name))
        throw new Error(
          `gradient for "${name}" has no variable in this optimizer; known: ${[...this.vars.keys()].slice(0, 5).join(", ")}…`,
        );
    const lr = opts.lr ?? this.lr;
    checkHyper("lr", lr, 0, Infinity);
    const maxNorm = opts.maxGradNorm !== undefined && opts.maxGradNorm > 0 && Number.isFinite(opts.maxGradNorm) ? opts.maxGradNorm : 0;
    const t = this.stepCount + 1;
    const k: AdamWConstants = {
      beta1: this.beta1,
      beta2: this.beta2,
      eps: this.eps,
      decay: 1 - lr * this.weightDecay,
      stepSize: lr / (1 - this.beta1 ** t),
      bc2Sqrt: Math.sqrt(1 - this.beta2 ** t),
    };
    const gradNorm = hasDeviceAdamW() ? await this.deviceStep(grads, maxNorm, k) : await this.opStep(grads, maxNorm, k);
    this.stepCount = t;
    return { gradNorm };
  }

  /** The step as device programs: the norm is read once, after the update, which the programs skip
   *  when it is not finite. */
  private async deviceStep(grads: tf.NamedTensorMap, maxNorm: number, k: AdamWConstants): Promise<number> {
    const zeros: tf.Tensor[] = [];
    const gs = [...this.vars].map(([name, v]) => grads[name] ?? (zeros.push(tf.zerosLike(v)), zeros[zeros.length - 1]));
    const nc = deviceGradNorm(gs, maxNorm);
    try {
      const vars = [...this.vars.values()];
      const next = deviceAdamW(
        vars,
        vars.map((v) => this.moments.get(v.name)!),
        gs,
        nc,
        k,
      );
      vars.forEach((v, i) => v.assign(next[i]));
      tf.dispose(next);
      const norm = (await nc.data())[0];
      if (!Number.isFinite(norm)) throw new NonFiniteError("gradient norm", norm);
      return norm;
    } finally {
      tf.dispose([nc, ...zeros]);
    }
  }

  /** The step as tfjs ops: clip (reading the norm), then per variable the moments and the weight. */
  private async opStep(grads: tf.NamedTensorMap, maxNorm: number, k: AdamWConstants): Promise<number> {
    let use = grads;
    let gradNorm: number;
    if (maxNorm > 0) {
      const c = await clipGradNorm(grads, maxNorm); // throws on NaN/Inf before any change
      use = c.grads;
      gradNorm = c.norm;
    } else {
      gradNorm = await globalNorm(grads);
      if (!Number.isFinite(gradNorm)) throw new NonFiniteError("gradient norm", gradNorm);
    }
    // The step's constants as tensors once, shared by every variable: as numbers each product made a
    // scalar of its own, which a GPU backend uploads through a new buffer (8 per variable).
    const c = tf.tidy(() => ({
      decay: tf.scalar(k.decay),
      beta1: tf.scalar(k.beta1),
      oneMinusBeta1: tf.scalar(1 - k.beta1),
      beta2: tf.scalar(k.beta2),
      oneMinusBeta2: tf.scalar(1 - k.beta2),
      bc2Sqrt: tf.scalar(k.bc2Sqrt),
      eps: tf.scalar(k.eps),
      stepSize: tf.scalar(k.stepSize),
    }));
    try {
      for (const [name, v] of this.vars) {
        const prev = this.moments.get(name)!;
        const next = tf.tidy(() => {
          const g = use[name] ?? tf.zerosLike(v);
          const [m0, v0] = tf.split(prev, 2).map((x) => tf.reshape(x, v.shape));
          // Decoupled weight decay first, on the pre-update weights: θ ← θ·(1 − lr·wd).
          const decayed = this.weightDecay === 0 ? v : tf.mul(v, c.decay);
          const m = tf.add(tf.mul(m0, c.beta1), tf.mul(g, c.oneMinusBeta1)); // exp_avg
          const s = tf.add(tf.mul(v0, c.beta2), tf.mul(tf.square(g), c.oneMinusBeta2)); // exp_avg_sq
          const denom = tf.add(tf.div(tf.sqrt(s), c.bc2Sqrt), c.eps);
          v.assign(tf.sub(decayed, tf.mul(tf.div(m, denom), c.stepSize)));
          return tf.concat([tf.reshape(m, [-1]), tf.reshape(s, [-1])]) as tf.Tensor1D;
        });
        this.moments.set(name, next);
        prev.dispose();
      }
    } finally {
      tf.dispose(Object.values(c));
    }
    if (use !== grads) tf.dispose(Object.values(use));
    return gradNorm;
  }

  /** State as flat named arrays: "step" (length 1) and "<var>.exp_avg", "<var>.exp_avg_sq" (torch's
   *  names). Copies; importState of the result restores the optimizer bit for bit. */
  async exportState(): Promise<Record<string, Float32Array>> {
    const out: Record<string, Float32Array> = { step: new Float32Array([this.stepCount]) };
    for (const [name, v] of this.vars) {
      const mv = (await this.moments.get(name)!.data()) as Float32Array;
      out[`${name}.exp_avg`] = mv.slice(0, v.size);
      out[`${name}.exp_avg_sq`] = mv.slice(v.size);
    }
    return out;
  }

  /** Restore exportState() output. Every variable's moments must be present with the right size. */
  importState(state: Record<string, Float32Array>): void {
    const step = state.step;
    if (!step || step.length !== 1 || !Number.isInteger(step[0]) || step[0] < 0)
      throw new Error(`optimizer state "step" is ${step ? `[${Array.from(step)}]` : "missing"}; expected one non-negative integer`);
    const next = new Map<string, tf.Tensor1D>();
    for (const [name, v] of this.vars) {
      const arrays = [state[`${name}.exp_avg`], state[`${name}.exp_avg_sq`]];
      arrays.forEach((a, i) => {
        const key = `${name}.${i === 0 ? "exp_avg" : "exp_avg_sq"}`;
        if (!a) throw new Error(`optimizer state has no "${key}"; it does not match this model's trainable variables`);
        if (a.length !== v.size)
          throw new Error(`optimizer state "${key}" has ${a.length} values; expected ${v.size} (shape [${v.shape}])`);
      });
      const mv = new Float32Array(2 * v.size);
      mv.set(arrays[0]);
      mv.set(arrays[1], v.size);
      next.set(name, tf.tensor1d(mv, "float32"));
    }
    for (const [name, mv] of next) {
      this.moments.get(name)!.dispose();
      this.moments.set(name, mv);
    }
    this.stepCount = step[0];
  }

  /** Frees the moment tensors (not the variables, which belong to the model). */
  dispose(): void {
    tf.dispose([...this.moments.values()]);
    this.moments.clear();
  }
}

function checkHyper(name: string, x: number, lo: number, hi: number): void {
  const ok = Number.isFinite(x) ? x >= lo && (hi === Infinity ? true : x < hi) : false;
  if (!ok) throw new Error(`AdamW ${name} ${x} must be in [${lo}, ${hi === Infinity ? "∞" : hi})`);
}
