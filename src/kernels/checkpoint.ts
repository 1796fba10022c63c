/** Activation checkpointing for tfjs: y = f(x) where the gradient tape keeps only x, and the backward
 *  pass runs f again under its own tape to get dL/dx and dL/dvars. Costs one more forward of f; saves
 *  every intermediate of f (for a decoder layer at 256 tokens, ~75 MB of the 0.5B model's ~1.8 GB).
 *  tfjs has no checkpointing of its own, and two of its behaviours shape this file:
 *  - a customGrad forward runs with the tape off and gives gradients only for its inputs, so the
 *    variables f reads must be passed in as inputs (a variable used but not passed gets no gradient);
 *  - engine.gradients() called inside a backward pass treats itself as the outermost one: it replaces
 *    the active tape and sets it to null when done, which breaks the outer backward. The inner call
 *    therefore runs with the engine's tape state swapped out and restored (tfjs-core 4.22 internals:
 *    state.activeTape and state.gradientDepth).
 *  Leaves out: f with randomness (the recomputation must see the same values; callers keep dropout
 *  out of checkpointed functions), several outputs. */
import * as tf from "@tensorflow/tfjs";

type CustomGradFn = Parameters<typeof tf.customGrad>[0];
interface TapeState {
  activeTape: unknown[] | null;
  gradientDepth: number;
}
interface EngineInternals {
  state: TapeState;
  isTapeOn(): boolean;
  gradients(
    f: () => tf.Tensor,
    xs: tf.Tensor[],
    dy?: tf.Tensor,
    allowNoGradients?: boolean,
  ): { value: tf.Tensor; grads: (tf.Tensor | null)[] };
}
const engine = () => tf.engine() as unknown as EngineInternals;

/** Whether a gradient tape is recording here (tf.grad, variableGrads; not inside a kernel's own
 *  forward): where a custom gradient may prepare its backward pass during the forward. */
export function isRecording(): boolean {
  return engine().isTapeOn();
}

/** Seconds spent so far (in this process) running checkpointed functions again in backward passes:
 *  a trainer reads it before and after a step to report recomputation apart from the backward pass.
 *  Wall time of the calls, so on an asynchronous backend (webgpu) the time to queue the work. */
let recomputed = 0;
export function recomputeSeconds(): number {
  return recomputed;
}

/** f(x, consts) recording only x, `consts` and `vars` on the gradient tape. `consts` are tensors f reads
 *  that get no gradient (they are kept for the recomputation, which runs after the caller's tidy has
 *  freed its own copies); `vars` must hold every trainable variable f reads; f must be deterministic.
 *  When no gradient is being recorded this is just f(x, consts). */
export function checkpoint<T extends tf.Tensor>(f: (x: T, consts: tf.Tensor[]) => T, x: T, consts: tf.Tensor[], vars: tf.Variable[]): T {
  if (!isRecording()) return f(x, consts);
  const g = tf.customGrad(((...args: unknown[]) => {
    const save = args[args.length - 1] as tf.GradSaveFunc;
    const xx = args[0] as T;
    save([xx, ...consts]);
    return {
      value: f(xx, consts),
      gradFunc: (dy: tf.Tensor, saved: tf.Tensor[]) => gradOf((x1: T) => f(x1, saved.slice(1)), saved[0] as T, vars, dy),
    };
  }) as unknown as CustomGradFn);
  return g(x, ...vars) as T;
}

/** [dL/dx, dL/dvars...] by running f again under a fresh tape. A variable f did not touch gets zeros. */
function gradOf<T extends tf.Tensor>(f: (x: T) => T, x: T, vars: tf.Variable[], dy: tf.Tensor): tf.Tensor[] {
  const st = engine().state;
  const outer = { activeTape: st.activeTape, gradientDepth: st.gradientDepth };
  st.activeTape = null;
  st.gradientDepth = 0;
  let res: { value: tf.Tensor; grads: (tf.Tensor | null)[] };
  try {
    res = engine().gradients(
      () => {
        const t0 = performance.now();
        const y = f(x);
        recomputed += (performance.now() - t0) / 1000;
        return y;
      },
      [x, ...vars],
      dy,
      true,
    );
  } finally {
    st.activeTape = outer.activeTape;
    st.gradientDepth = outer.gradientDepth;
  }
  res.value.dispose();
  return res.grads.map((gr, i) => gr ?? tf.zerosLike(i === 0 ? x : vars[i - 1]));
}
