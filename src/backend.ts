/** Picks the tfjs backend once per process: tfjs-node-gpu → tfjs-node → wasm → cpu, or the one asked
 *  for. The native bindings are optional packages (not dependencies), so they are imported by a
 *  variable name and a failed import just moves on. Also fills the one kernel gap training hits on
 *  wasm: UnsortedSegmentSum (the gradient of gather), needed when embeddings train in full mode.
 *  Leaves out: WebGL/WebGPU (this is a Node trainer). */
import * as tf from "@tensorflow/tfjs";
import "@tensorflow/tfjs-backend-wasm";

export type BackendName = "tensorflow" | "wasm" | "cpu" | "auto";
const NAMES: BackendName[] = ["tensorflow", "wasm", "cpu", "auto"];

let chosen: Promise<string> | null = null;

/** Idempotent: the first call decides, later calls return the same backend name. */
export function initBackend(name: BackendName | string = "auto"): Promise<string> {
  if (!NAMES.includes(name as BackendName))
    throw new Error(`unknown backend "${name}"; accepted: ${NAMES.join(", ")}`);
  if (!chosen) chosen = pick(name as BackendName);
  return chosen;
}

async function tryNative(): Promise<boolean> {
  for (const mod of ["@tensorflow/tfjs-node-gpu", "@tensorflow/tfjs-node"]) {
    try {
      const m = mod; // a variable keeps TypeScript from needing the optional package's types
      await import(m);
      if (await tf.setBackend("tensorflow")) return true;
    } catch {
      // not installed or no native binary for this platform: try the next one
    }
  }
  return false;
}

async function pick(name: BackendName): Promise<string> {
  if (name === "tensorflow" || name === "auto") {
    if (await tryNative()) return done();
    if (name === "tensorflow")
      throw new Error("backend tensorflow needs @tensorflow/tfjs-node or @tensorflow/tfjs-node-gpu installed (npm install @tensorflow/tfjs-node)");
  }
  if (name === "wasm" || name === "auto") {
    registerWasmExtras();
    if (await tf.setBackend("wasm").catch(() => false)) return done();
    if (name === "wasm") throw new Error("backend wasm failed to initialise");
  }
  await tf.setBackend("cpu");
  return done();
}

async function done(): Promise<string> {
  await tf.ready();
  const b = tf.getBackend();
  process.stderr.write(`tfjs backend: ${b}\n`);
  return b;
}

/** UnsortedSegmentSum for wasm, computed in JS on the heap views (only the gather gradient of a
 *  trainable embedding uses it, so simplicity beats speed here). */
export function registerWasmExtras(): void {
  if (tf.getKernel("UnsortedSegmentSum", "wasm")) return;
  tf.registerKernel({
    kernelName: "UnsortedSegmentSum",
    backendName: "wasm",
    kernelFunc: ({ inputs, backend, attrs }) => {
      const { x, segmentIds } = inputs as { x: tf.TensorInfo; segmentIds: tf.TensorInfo };
      const numSegments = (attrs as { numSegments: number }).numSegments;
      // eslint-disable-next-line @typescript-eslint/no-explicit-any
      const b = backend as any;
      const xv = b.readSync(x.dataId) as Float32Array | Int32Array;
      const ids = b.readSync(segmentIds.dataId) as Int32Array;
      const inner = x.shape.slice(segmentIds.shape.length).reduce((p, d) => p * d, 1);
      const outShape = [numSegments, ...x.shape.slice(segmentIds.shape.length)];
      const out = b.makeOutput(outShape, x.dtype) as tf.TensorInfo;
      const ov = b.typedArrayFromHeap(out) as Float32Array;
      ov.fill(0);
      for (let i = 0; i < ids.length; i++) {
        const s = ids[i];
        if (s < 0 || s >= numSegments) continue; // tf semantics: out-of-range ids are dropped
        const src = i * inner, dst = s * inner;
        for (let j = 0; j < inner; j++) ov[dst + j] += xv[src + j];
      }
      return out;
    },
  });
}
