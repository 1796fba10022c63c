/** The started WebGPU device as the rest of kernels/ sees it: its limits (profile.ts reads them) and
 *  the kernel families, each of which registers itself here from its own file (`webgpuFamily(register)`
 *  at import). device.ts puts every family on the backend when it starts; a family loaded after that
 *  goes on at once. A leaf (it imports no values), so that no import runs from a family's op file
 *  back through the device to the family. */
import type { WebgpuModule } from "./program.ts";

/** The device's limits that model and kernel code plan around. */
export interface WebgpuLimits {
  maxStorageBufferBindingSize: number;
  maxBufferSize: number;
  maxStorageBuffersPerShaderStage: number;
  /** Bytes of device memory where the system tells (device.ts adapterMemoryBytes). */
  memoryBytes?: number;
}

type Register = (mod: WebgpuModule, limits: WebgpuLimits) => void;

const families: Register[] = [];
let started: { mod: WebgpuModule; limits: WebgpuLimits } | null = null;

/** Register a family's kernels on the webgpu backend: now if it has started, else when it starts. */
export function webgpuFamily(register: Register): void {
  families.push(register);
  if (started) register(started.mod, started.limits);
}

/** Put every family on the backend (device.ts, once the device and the tfjs package are there). */
export function startWebgpuFamilies(mod: WebgpuModule, limits: WebgpuLimits): void {
  started = { mod, limits };
  for (const register of families) register(mod, limits);
}

/** The device's limits once the webgpu backend is registered (null before). Model code splits any
 *  buffer larger than maxStorageBufferBindingSize (see profile.ts). */
export function webgpuLimits(): WebgpuLimits | null {
  return started?.limits ?? null;
}
