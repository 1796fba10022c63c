/** Per row of logits [n, V]: log p(target) and the entropy, and the gradient of log p(target) with
 *  respect to the logits. Through tfjs ops these are ~15 passes over [n, V] (logSumExp's max, sub,
 *  exp and sum, a second exp, the entropy's product and sum; the backward's one-hot, cast, softmax,
 *  sub and product), each single-threaded: for Qwen2.5's 151,936-token vocabulary, 155 M elements a
 *  pass per 1,024 tokens. On wasm (V a multiple of 4) they are two kernels of the heap module
 *  (heap-code.ts rowStats, softmaxRows: two or three vector passes per row, rows split over the
 *  helper threads); results agree with the op forms to float32 rounding. On webgpu they are two WGSL
 *  programs (webgpu/vocab.ts, one workgroup per row, any V), given chunks of rows no larger than the
 *  device's largest binding by head-logprobs.ts. Other backends keep the ops. */
import * as tf from "@tensorflow/tfjs";
import { heapOffset, once, registerKernel, type Backend } from "./kernels.ts";
import { heapRowStats, heapSoftmaxRows } from "./wasm/heap-ops.ts";

export const LOGP = "MarlLogpEntropy",
  DLOGITS = "MarlDLogits";

function checkTargets(targets: number[], n: number, V: number): void {
  if (targets.length !== n) throw new Error(`log-probs: ${targets.length} targets for ${n} rows of logits`);
  for (const t of targets)
    if (!(Number.isInteger(t) && t >= 0 && t < V)) throw new Error(`log-probs: target ${t} is not a token id in [0, ${V})`);
}

const register = once(() => {
  registerKernel(
    LOGP,
    () =>
      ({ inputs, backend, attrs }) => {
        const { logits } = inputs as { logits: tf.TensorInfo };
        const targets = (attrs as { targets: number[] }).targets;
        const [n, V] = logits.shape;
        checkTargets(targets, n, V);
        const b = backend as Backend,
          out = b.makeOutput([n, 2], "float32") as tf.TensorInfo;
        const st = heapRowStats(b, heapOffset(b, logits), n, V);
        const x = b.typedArrayFromHeap(logits) as Float32Array,
          o = b.typedArrayFromHeap(out) as Float32Array; // after every allocation
        for (let r = 0; r < n; r++) {
          const s = st[3 * r + 1],
            lse = st[3 * r] + Math.log(s);
          o[2 * r] = x[r * V + targets[r]] - lse;
          o[2 * r + 1] = lse - st[3 * r + 2] / s;
        }
        return out;
      },
    ["wasm"],
  );
  registerKernel(
    DLOGITS,
    () =>
      ({ inputs, backend, attrs }) => {
        const { logits, dy } = inputs as { logits: tf.TensorInfo; dy: tf.TensorInfo };
        const targets = (attrs as { targets: number[] }).targets;
        const [n, V] = logits.shape;
        checkTargets(targets, n, V);
        const b = backend as Backend,
          out = b.makeOutput([n, V], "float32") as tf.TensorInfo;
        const dyv = b.typedArrayFromHeap(dy) as Float32Array,
          d = Float32Array.from({ length: n }, (_, r) => dyv[2 * r]);
        heapSoftmaxRows(
          b,
          heapOffset(b, logits),
          d.map((x) => -x),
          heapOffset(b, out),
          n,
          V,
        );
        const o = b.typedArrayFromHeap(out) as Float32Array;
        for (let r = 0; r < n; r++) o[r * V + targets[r]] += d[r];
        return out;
      },
    ["wasm"],
  );
});

const useKernels = (logits: tf.Tensor2D) => {
  register();
  return tf.getBackend() === "wasm" && logits.dtype === "float32" && logits.shape[1] % 4 === 0;
};

/** webgpu's kernels (webgpu/vocab.ts) read the targets from an int32 tensor (an upload, no dispatch). */
const useWebgpu = (logits: tf.Tensor2D) =>
  tf.getBackend() === "webgpu" && logits.dtype === "float32" && tf.getKernel(LOGP, "webgpu") !== undefined;
function onWebgpu(name: string, logits: tf.Tensor2D, targets: number[], dy?: tf.Tensor2D): tf.Tensor2D {
  const [n, V] = logits.shape;
  checkTargets(targets, n, V);
  const t = tf.tensor1d(targets, "int32");
  const out = tf.engine().runKernel(name, dy ? { logits, targets: t, dy } : { logits, targets: t }) as tf.Tensor2D;
  t.dispose();
  return out;
}

/** The op forms (every backend; the reference the kernels are tested against). */
export function logpEntropyOps(logits: tf.Tensor2D, targets: number[]): tf.Tensor2D {
  const V = logits.shape[1];
  return tf.tidy(() => {
    const lse = tf.logSumExp(logits, 1); // [n]
    const picked = tf.gather(
      tf.reshape(logits, [-1]),
      tf.tensor1d(
        targets.map((t, i) => i * V + t),
        "int32",
      ),
    ); // [n]
    const p = tf.exp(tf.sub(logits, tf.expandDims(lse, 1)));
    const ent = tf.sub(lse, tf.sum(tf.mul(p, logits), 1));
    return tf.stack([tf.sub(picked, lse), ent], 1) as tf.Tensor2D;
  });
}
export function dLogitsOps(logits: tf.Tensor2D, targets: number[], dy: tf.Tensor2D): tf.Tensor2D {
  const [n, V] = logits.shape;
  return tf.tidy(() => {
    const onehot = tf.cast(tf.oneHot(tf.tensor1d(targets, "int32"), V), "float32");
    return tf.mul(tf.sub(onehot, tf.softmax(logits)), tf.slice(dy, [0, 0], [n, 1])) as tf.Tensor2D;
  });
}

/** From logits [n, V] and the target ids: [n, 2] = log p(target) and the entropy of each row. */
export function logpEntropy(logits: tf.Tensor2D, targets: number[]): tf.Tensor2D {
  if (useWebgpu(logits)) return onWebgpu(LOGP, logits, targets);
  return useKernels(logits) ? (tf.engine().runKernel(LOGP, { logits }, { targets }) as tf.Tensor2D) : logpEntropyOps(logits, targets);
}

/** The gradient with respect to the logits [n, V] of dy [n, 2]: only log p is differentiated,
 *  dy[:, 0] · (onehot(target) − softmax(logits)). */
export function dLogits(logits: tf.Tensor2D, targets: number[], dy: tf.Tensor2D): tf.Tensor2D {
  if (useWebgpu(logits)) return onWebgpu(DLOGITS, logits, targets, dy);
  return useKernels(logits)
    ? (tf.engine().runKernel(DLOGITS, { logits, dy }, { targets }) as tf.Tensor2D)
    : dLogitsOps(logits, targets, dy);
}
