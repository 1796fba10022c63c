/** The globals Node gives every module, for src/ in the page (scripts/web.ts imports them into the src/ modules that use them):
 *  `process` and `Buffer`, each only what src/ uses (web/node/process.ts, web/node/buffer.ts). */
export { process } from "./process.ts";
export { Buffer } from "./buffer.ts";
/** Node's setImmediate (src/kernels/webgpu/device.ts throws a device error from one). */
export const setImmediate = (f: (...a: unknown[]) => void, ...a: unknown[]) => setTimeout(f, 0, ...a);
