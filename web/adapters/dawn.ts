/** Dawn's `webgpu` package for the page: in Node it provides the WebGPU API (src/kernels/webgpu/device.ts
 *  starts it); a browser has that API built in, so `create` hands out the browser's navigator.gpu and
 *  `globals` (GPUBufferUsage, GPUMapMode, ...) are already the page's. */
export const globals = {};
export function create(options: string[]): GPU {
  if (options.length > 0) throw new Error(`Dawn options ${options.join(" ")}: the browser's WebGPU takes none`);
  const gpu = (navigator as Navigator & { gpu?: GPU }).gpu;
  if (!gpu) throw new Error("this browser offers no WebGPU (navigator.gpu is missing)");
  return gpu;
}
