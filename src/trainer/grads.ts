/** Gradient bookkeeping shared by the SFT and GRPO steps: accumulate micro-batch gradients, and a
 *  stop-gradient (tfjs has none built in). */
import * as tf from "@tensorflow/tfjs";

/** acc + grads by name. Disposes both inputs' tensors and returns the new map; acc may be null. */
export function accumulateGrads(acc: tf.NamedTensorMap | null, grads: tf.NamedTensorMap): tf.NamedTensorMap {
  if (acc === null) return grads;
  const out: tf.NamedTensorMap = { ...acc };
  for (const [name, g] of Object.entries(grads)) {
    const prev = out[name];
    if (prev === undefined) {
      out[name] = g;
    } else {
      out[name] = tf.add(prev, g);
      tf.dispose([prev, g]);
    }
  }
  return out;
}

/** Identity forward, zero gradient backward: a tensor the tape treats as a constant. */
export const stopGradient: (x: tf.Tensor) => tf.Tensor = tf.customGrad((x) => ({
  value: (x as tf.Tensor).clone(),
  gradFunc: (dy: tf.Tensor) => tf.zerosLike(dy),
})) as (x: tf.Tensor) => tf.Tensor;
