/** How the project's own kernels are registered with tfjs, and the CPU backends' heap I/O they share.
 *
 *  Every custom kernel is one `registerKernel(name, body)` call (a new kernel for wasm and cpu, or
 *  the backends named) or one `replaceKernel(name, backend, make)` call (in place of tfjs' kernel,
 *  which the new one may fall back to). Both register once per process, so an op file calls them
 *  lazily on first use. Gradients are defined beside the op with tf.customGrad (CustomGradFn).
 *
 *  Adding a heap kernel (one that runs on the wasm heap, split over the helper threads):
 *    1. its body as instructions in a wasm/heap-*-code.ts file (wasm/heap-code.ts exports it from the module),
 *    2. a `heap<Name>(backend, …offsets)` wrapper in wasm/heap-ops.ts that runs it as a job (wasm/heap.ts),
 *    3. one registerKernel call in the op's file, whose body calls that wrapper.
 *  A WebGPU kernel is one registerKernel(name, body, ["webgpu"]) call in its family's file under webgpu/,
 *  which registers itself (webgpu/families.ts).
 *  Leaves out: kernels for the tensorflow (tfjs-node) backend, which has its own. */
import * as tf from "@tensorflow/tfjs";

/** tf.customGrad's argument, whose published type does not admit a function of several tensors. */
export type CustomGradFn = Parameters<typeof tf.customGrad>[0];

/** A tfjs backend object (its internals are not in the published types). */
export type Backend = any;

/** A CPU backend's way to make a float32 output and to view a tensor's values in place. */
export interface CpuIo {
  output: (b: Backend, shape: number[]) => tf.TensorInfo;
  view: (b: Backend, t: tf.TensorInfo) => any; // Float32Array or Int32Array, by the tensor's dtype
}

export const CPU_IO: Record<"wasm" | "cpu", CpuIo> = {
  wasm: { output: (b, shape) => b.makeOutput(shape, "float32"), view: (b, t) => b.typedArrayFromHeap(t) },
  cpu: {
    output: (b, shape) => b.makeTensorInfo(shape, "float32", new Float32Array(shape.reduce((n, d) => n * d, 1))),
    view: (b, t) => b.data.get(t.dataId).values,
  },
};

/** A wasm tensor's byte offset on the heap. */
export const heapOffset = (b: Backend, t: tf.TensorInfo): number => b.dataIdMap.get(t.dataId).memoryOffset as number;

const done = new Set<string>();

/** Register kernel `name` on each backend in `on` (default: wasm and cpu), with the body `body` makes
 *  for that backend from its name and heap I/O. A kernel already registered here is left as it is. */
export function registerKernel(
  name: string,
  body: (io: CpuIo, backendName: string) => tf.KernelFunc,
  on: readonly string[] = ["wasm", "cpu"],
): void {
  for (const backendName of on) {
    if (done.has(`${name}/${backendName}`)) continue;
    done.add(`${name}/${backendName}`);
    tf.registerKernel({ kernelName: name, backendName, kernelFunc: body(CPU_IO[backendName as keyof typeof CPU_IO], backendName) });
  }
}

/** Put the kernel `make(tfjs' own)` in place of tfjs' kernel `name` on `backendName` (it may call
 *  tfjs' for the cases it leaves out). Once; a no-op where tfjs has no such kernel. */
export function replaceKernel(name: string, backendName: string, make: (fallback: tf.KernelFunc) => tf.KernelFunc): void {
  const original = tf.getKernel(name, backendName);
  if (done.has(`${name}/${backendName}`) || !original) return;
  done.add(`${name}/${backendName}`);
  tf.unregisterKernel(name, backendName);
  tf.registerKernel({ ...original, kernelFunc: make(original.kernelFunc) });
}

/** `f` run on the first call only: an op file's lazy registration of its kernels. */
export function once(f: () => void): () => void {
  let ran = false;
  return () => {
    if (ran) return;
    ran = true;
    f();
  };
}
