/** The tfjs "webgpu" backend in Node: Dawn's bindings (npm `webgpu`) provide the WebGPU API that
 *  @tensorflow/tfjs-backend-webgpu expects from a browser. Dawn reaches the GPU through Vulkan on
 *  Linux (libvulkan.so.1 and a driver), Metal on macOS, D3D12 on Windows; a GPU-less Linux machine
 *  can use Mesa's software Vulkan adapter (scripts/setup-webgpu-adapter.sh).
 *
 *  The backend is registered here rather than by the package itself, so that the device asks for the
 *  adapter's maximum limits (buffer sizes, bindings, workgroups: the defaults cap a storage binding at
 *  128 MiB), so that a missing driver is one clear line instead of a stack, and so that Dawn's
 *  validation errors, which do not throw and leave stale data behind, stop the process loudly.
 *  Leaves out: choosing among several adapters (Dawn's `adapter=NAME` in MARL_DAWN_OPTS does that). */
import * as tf from "@tensorflow/tfjs";
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, statSync } from "node:fs";
import { totalmem } from "node:os";
import { startWebgpuFamilies, type WebgpuLimits } from "./families.ts";
import { withWrites } from "./program.ts";
import { batchUniforms } from "./uniforms.ts";
// The kernel families: each registers itself (families.ts) and goes on the backend when it starts.
import "./adamw.ts";
import "./dequant.ts";
import "./gather-rows.ts";
import "./heads.ts";
import "./lora.ts";
import "./rows.ts";
import "./shared-heads.ts";
import "./vocab.ts";

/** What the adapter is, as printed once when the backend starts. */
export interface WebgpuAdapterInfo {
  description: string;
  /** A software or otherwise fallback adapter (Mesa lavapipe): correct, but slower than wasm. */
  fallback: boolean;
  maxStorageBufferBindingSize: number;
  maxBufferSize: number;
  /** The device's limits this module asks for (the adapter's maxima), by WebGPU's names. */
  limits: Record<string, number>;
  /** The adapter's optional features (shader-f16, subgroups, timestamp-query, …), sorted. */
  features: string[];
}

/** The outcome of trying to start the backend: the adapter, or why there is none (one line). */
export type WebgpuProbe = { ok: true; info: WebgpuAdapterInfo } | { ok: false; reason: string };

const HOW_TO =
  "install the Vulkan loader and the GPU's Vulkan driver (Debian/Ubuntu: apt install libvulkan1, plus " +
  "the vendor's driver; an NVIDIA driver also needs libglvnd's libGLX/libEGL, and in a container " +
  "VK_DRIVER_FILES naming its nvidia_icd.json), or on a GPU-less Debian 12 machine run " +
  "scripts/setup-webgpu-adapter.sh and source the env.sh it prints";

const WANTED_LIMITS = [
  "maxBufferSize",
  "maxStorageBufferBindingSize",
  "maxStorageBuffersPerShaderStage",
  "maxUniformBufferBindingSize",
  "maxComputeWorkgroupStorageSize",
  "maxComputeInvocationsPerWorkgroup",
  "maxComputeWorkgroupSizeX",
  "maxComputeWorkgroupSizeY",
  "maxComputeWorkgroupSizeZ",
  "maxComputeWorkgroupsPerDimension",
];

/** Dawn caps the dynamic buffers of a pipeline layout at 16 and, when the driver allows more (Mesa's
 *  lavapipe and RADV do), prints "Warning: maxDynamic{Uniform,Storage}BuffersPerPipelineLayout
 *  artificially reduced from N to 16 …" on stderr from its native code, where this process cannot
 *  catch it. Neither tfjs' kernels nor this project's use dynamic buffer offsets, so the cap changes
 *  nothing: one line says so, where an adapter's limits sit at the cap. null elsewhere. */
export const DAWN_DYNAMIC_BUFFER_CAP = 16;
export function dawnLimitNote(l: {
  maxDynamicUniformBuffersPerPipelineLayout: number;
  maxDynamicStorageBuffersPerPipelineLayout: number;
}): string | null {
  const capped = [l.maxDynamicUniformBuffersPerPipelineLayout, l.maxDynamicStorageBuffersPerPipelineLayout].includes(
    DAWN_DYNAMIC_BUFFER_CAP,
  );
  return capped
    ? `note: Dawn's "artificially reduced … to fit dynamic offset allocation limit" warnings, where printed above, are expected: ` +
        `it caps dynamic buffers per pipeline layout at ${DAWN_DYNAMIC_BUFFER_CAP}, and no kernel here uses them`
    : null;
}

let limitNote: string | null = null;
/** dawnLimitNote for the registered adapter, once: null after the first call. */
export function takeWebgpuLimitNote(): string | null {
  const n = limitNote;
  limitNote = null;
  return n;
}

/** Whether libvulkan.so.1 is where the dynamic loader will look (Linux only; a hint for the error). */
function vulkanLoaderFound(): boolean {
  if (process.platform !== "linux") return true;
  const dirs = [
    ...(process.env.LD_LIBRARY_PATH ?? "").split(":").filter(Boolean),
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/local/lib",
  ];
  return dirs.some((d) => existsSync(`${d}/libvulkan.so.1`));
}

/** Whether the Vulkan loader will find a driver (an ICD manifest), as it searches on Linux: the files
 *  or folders VK_DRIVER_FILES / VK_ICD_FILENAMES name (or VK_ADD_DRIVER_FILES adds), else the
 *  icd.d folders under XDG_CONFIG_HOME, XDG_CONFIG_DIRS (default /etc/xdg), sysconf, XDG_DATA_HOME
 *  (default ~/.local/share) and XDG_DATA_DIRS (default /usr/local/share:/usr/share). A folder counts
 *  when it holds a .json file. Other platforms: true (Metal, D3D12). */
export function vulkanDriverFound(env: NodeJS.ProcessEnv = process.env, platform: string = process.platform, sysconf = "/etc"): boolean {
  if (platform !== "linux") return true;
  const manifest = (p: string) => {
    try {
      return statSync(p).isDirectory() ? readdirSync(p).some((f) => f.endsWith(".json")) : existsSync(p);
    } catch {
      return false;
    }
  };
  const list = (v: string | undefined) => (v ?? "").split(":").filter(Boolean);
  const named = [...list(env.VK_DRIVER_FILES ?? env.VK_ICD_FILENAMES), ...list(env.VK_ADD_DRIVER_FILES)];
  if (env.VK_DRIVER_FILES ?? env.VK_ICD_FILENAMES) return named.some(manifest); // they replace the search
  const home = env.HOME ?? "";
  const config = [env.XDG_CONFIG_HOME ?? `${home}/.config`, ...list(env.XDG_CONFIG_DIRS ?? "/etc/xdg"), sysconf];
  const data = [env.XDG_DATA_HOME ?? `${home}/.local/share`, ...list(env.XDG_DATA_DIRS ?? "/usr/local/share:/usr/share")];
  return named.some(manifest) || [...config, ...data].some((d) => manifest(`${d}/vulkan/icd.d`));
}

let probe: Promise<WebgpuProbe> | null = null;

/** Whether the current backend is webgpu on a software (fallback) adapter. */
export async function webgpuIsSoftware(): Promise<boolean> {
  if (tf.getBackend() !== "webgpu" || !probe) return false;
  const p = await probe;
  return p.ok && p.info.fallback;
}

/** Start Dawn, take an adapter and a device with the adapter's maximum limits, and register the tfjs
 *  backend "webgpu" on it. `hardwareOnly` (the `auto` choice) refuses a fallback adapter. Idempotent:
 *  the first call decides. Does not switch the current backend. */
export function registerWebgpu(hardwareOnly: boolean): Promise<WebgpuProbe> {
  probe ??= start(hardwareOnly);
  return probe;
}

async function start(hardwareOnly: boolean): Promise<WebgpuProbe> {
  // Without a loader or a driver Dawn can only fail (and warns on stderr, three lines from Vulkan):
  // `auto` moves on quietly. Dawn options (MARL_DAWN_OPTS) may pick another backend: then it tries.
  if (hardwareOnly && !process.env.MARL_DAWN_OPTS) {
    if (!vulkanLoaderFound()) return { ok: false, reason: "the Vulkan loader libvulkan.so.1 is not installed" };
    if (!vulkanDriverFound()) return { ok: false, reason: "no Vulkan driver is installed (no ICD manifest where the loader looks)" };
  }
  let dawn: typeof import("webgpu");
  try {
    dawn = await import("webgpu");
  } catch (err) {
    return {
      ok: false,
      reason: `the webgpu package (Dawn) failed to load on ${process.platform}-${process.arch}: ${(err as Error).message.split("\n")[0]}`,
    };
  }
  Object.assign(globalThis, dawn.globals); // GPUBufferUsage, GPUMapMode, ... as a browser has them
  const gpu = dawn.create((process.env.MARL_DAWN_OPTS ?? "").split(" ").filter(Boolean));
  const adapter = await gpu.requestAdapter({ powerPreference: "high-performance" }).catch(() => null);
  if (!adapter) {
    const what = vulkanLoaderFound()
      ? "no WebGPU adapter found (no Vulkan driver Dawn accepts)"
      : "no WebGPU adapter: the Vulkan loader libvulkan.so.1 is not installed";
    return { ok: false, reason: `${what}; ${HOW_TO}` };
  }
  const ai = adapter.info;
  const fallback = ai.isFallbackAdapter === true || /llvmpipe|lavapipe|swiftshader/i.test(`${ai.device} ${ai.description}`);
  const description = [ai.vendor, ai.architecture, ai.device, ai.description].filter(Boolean).join(" ").trim() || "unknown adapter";
  if (hardwareOnly && fallback) return { ok: false, reason: `only a software WebGPU adapter (${description}), slower than wasm` };

  // The adapter's maximum for the limits tfjs' kernels and our weights run into (the default device
  // caps a storage binding at 128 MiB and a buffer at 256 MiB).
  const requiredLimits: Record<string, number> = {};
  for (const key of WANTED_LIMITS) {
    const v = (adapter.limits as unknown as Record<string, unknown>)[key];
    if (typeof v === "number") requiredLimits[key] = v;
  }
  limitNote = dawnLimitNote(adapter.limits);
  const requiredFeatures = (["shader-f16", "timestamp-query"] as GPUFeatureName[]).filter((f) => adapter.features.has(f));
  let device: GPUDevice;
  try {
    device = await adapter.requestDevice({ requiredLimits, requiredFeatures });
  } catch (err) {
    return { ok: false, reason: `the WebGPU adapter ${description} refused a device: ${(err as Error).message.split("\n")[0]}` };
  }
  device.addEventListener("uncapturederror", (ev) => {
    // A validation or out-of-memory error does not throw where it happens and leaves results stale:
    // stop instead of training on wrong numbers.
    const msg = (ev as GPUUncapturedErrorEvent).error.message.split("\n")[0];
    setImmediate(() => {
      throw new Error(`WebGPU error (results would be wrong, stopping): ${msg}`);
    });
  });
  const limits: WebgpuLimits = {
    maxStorageBufferBindingSize: device.limits.maxStorageBufferBindingSize,
    maxBufferSize: device.limits.maxBufferSize,
    maxStorageBuffersPerShaderStage: device.limits.maxStorageBuffersPerShaderStage,
    memoryBytes: adapterMemoryBytes(fallback),
  };

  // The package registers its kernels on import, and registers its own backend factory only when it
  // sees navigator.gpu, which is not set yet; ours is registered instead.
  const mod = await import("@tensorflow/tfjs-backend-webgpu");
  startWebgpuFamilies(mod, limits);
  Object.defineProperty(globalThis, "navigator", {
    value: { ...((globalThis as { navigator?: object }).navigator ?? {}), gpu },
    configurable: true,
    writable: true,
  }); // Node 21+ has a read-only getter
  // Programs that write more than `result` (program.ts runMulti) have those bindings made read_write.
  const shaderModule = device.createShaderModule.bind(device);
  device.createShaderModule = (d: GPUShaderModuleDescriptor) => shaderModule({ ...d, code: withWrites(d.code) });
  if (tf.findBackendFactory("webgpu")) tf.removeBackend("webgpu");
  tf.registerBackend("webgpu", () => countTraffic(batchUniforms(new mod.WebGPUBackend(device, ai))), 3);
  return {
    ok: true,
    info: {
      description,
      fallback,
      maxStorageBufferBindingSize: limits.maxStorageBufferBindingSize,
      maxBufferSize: limits.maxBufferSize,
      limits: Object.fromEntries(WANTED_LIMITS.map((k) => [k, (device.limits as unknown as Record<string, number>)[k]])),
      features: [...adapter.features].map(String).sort(),
    },
  };
}

/** The adapter's memory where the system tells (WebGPU does not): the host's for a software adapter,
 *  NVIDIA's first GPU's through nvidia-smi; undefined elsewhere. */
function adapterMemoryBytes(fallback: boolean): number | undefined {
  if (fallback) return totalmem();
  try {
    const out = execFileSync("nvidia-smi", ["--query-gpu=memory.total", "--format=csv,noheader,nounits"], {
      encoding: "utf8",
      timeout: 10_000,
      stdio: ["ignore", "pipe", "ignore"],
    });
    const mib = Number(out.split("\n")[0].trim());
    return mib > 0 ? mib * 2 ** 20 : undefined;
  } catch {
    return undefined;
  }
}

/** Run f inside a WebGPU out-of-memory error scope: whether an allocation failed for lack of device
 *  memory meanwhile (f's results are then garbage; an error f threw because of it is dropped). Other
 *  backends: f's outcome, false. */
export async function deviceOutOfMemory(f: () => Promise<void>): Promise<boolean> {
  const device = (tf.backend() as unknown as { device?: GPUDevice }).device;
  if (tf.getBackend() !== "webgpu" || !device) {
    await f();
    return false;
  }
  device.pushErrorScope("out-of-memory");
  let thrown: unknown = null;
  try {
    await f();
  } catch (err) {
    thrown = err ?? new Error("unknown error");
  }
  const oom = (await device.popErrorScope()) !== null;
  if (thrown !== null && !oom) throw thrown;
  return oom;
}

/** What the webgpu backend has sent to the GPU and read back since it started: compute dispatches
 *  (by program name) and bytes copied back to the host. A Reshape or Identity costs no dispatch. */
export interface WebgpuTraffic {
  dispatches: number;
  readbackBytes: number;
  byProgram: Map<string, number>;
  /** Host milliseconds in the backend's program runs (runWebGPUProgram: the shader key, uploads,
   *  bind groups, uniforms and encoding; runs that compiled a pipeline are left out, with their
   *  dispatches: dispatchesTimed counts the rest). */
  hostMs: number;
  /** Of hostMs, the part in recordAndSubmit (bind groups, the uniform buffer, encoding the pass). */
  recordMs: number;
  dispatchesTimed: number;
}
const traffic: WebgpuTraffic = { dispatches: 0, readbackBytes: 0, byProgram: new Map(), hostMs: 0, recordMs: 0, dispatchesTimed: 0 };

/** Device memory the backend holds in buffers (tfjs keeps released ones for reuse: they count), now
 *  and at most since the last resetWebgpuPeak(); zeros before the backend starts. */
const memory = { peakBytes: 0, current: () => 0 };
export function webgpuMemory(): { bytes: number; peakBytes: number } {
  return { bytes: memory.current(), peakBytes: memory.peakBytes };
}
export function resetWebgpuPeak(): void {
  memory.peakBytes = memory.current();
}

/** The running totals (zeros before the backend starts); take differences around a step. */
export function webgpuTraffic(): WebgpuTraffic {
  return { ...traffic, byProgram: new Map(traffic.byProgram) };
}

/** A compiled pipeline whose getBindGroupLayout(0) answers the same layout every time: tfjs asks for
 *  it at every dispatch, and Dawn makes a new one each time (~15 µs of a dispatch's ~150 on the
 *  software adapter). A pipeline still compiling (a promise) is left as it is. */
function holdLayout<P>(pipeline: P): P {
  const p = pipeline as { getBindGroupLayout?: (i: number) => GPUBindGroupLayout };
  if (typeof p.getBindGroupLayout !== "function") return pipeline;
  const get = p.getBindGroupLayout.bind(p),
    held = new Map<number, GPUBindGroupLayout>();
  p.getBindGroupLayout = (i: number) => {
    let l = held.get(i);
    if (!l) held.set(i, (l = get(i)));
    return l;
  };
  return pipeline;
}

/** Count each dispatch (recordAndSubmit records one) and each read back (getBufferData copies a
 *  whole buffer to a staging buffer and maps it), and time the host's part of each program run,
 *  wrapping the backend's own methods. */
function countTraffic<B extends object>(backend: B): B {
  const b = backend as unknown as {
    recordAndSubmit: (program: object, ...rest: unknown[]) => unknown;
    runWebGPUProgram: (program: object, ...rest: unknown[]) => unknown;
    getBufferData: (buffer: GPUBuffer) => Promise<ArrayBuffer>;
    pipelineCache: Record<string, unknown>;
    bufferManager: { acquireBuffer: (...args: unknown[]) => unknown; numBytesAllocated: number };
  };
  const manager = b.bufferManager,
    acquire = manager.acquireBuffer.bind(manager);
  manager.acquireBuffer = (...args) => {
    const out = acquire(...args);
    memory.peakBytes = Math.max(memory.peakBytes, manager.numBytesAllocated);
    return out;
  };
  memory.current = () => manager.numBytesAllocated;
  const record = b.recordAndSubmit.bind(b),
    runProgram = b.runWebGPUProgram.bind(b),
    read = b.getBufferData.bind(b);
  let recorded = 0,
    compiles = 0;
  b.pipelineCache = new Proxy(b.pipelineCache, {
    set: (target, key, value) => {
      compiles++;
      return Reflect.set(target, key, holdLayout(value));
    },
  });
  b.recordAndSubmit = (program, ...rest) => {
    traffic.dispatches++;
    const name = program.constructor.name;
    traffic.byProgram.set(name, (traffic.byProgram.get(name) ?? 0) + 1);
    const t0 = performance.now();
    try {
      return record(program, ...rest);
    } finally {
      recorded = performance.now() - t0;
    }
  };
  b.runWebGPUProgram = (program, ...rest) => {
    const t0 = performance.now(),
      n0 = traffic.dispatches,
      c0 = compiles;
    recorded = 0;
    const out = runProgram(program, ...rest);
    if (traffic.dispatches === n0 + 1 && compiles === c0) {
      traffic.hostMs += performance.now() - t0;
      traffic.recordMs += recorded;
      traffic.dispatchesTimed++;
    }
    return out;
  };
  b.getBufferData = (buffer) => {
    traffic.readbackBytes += buffer.size;
    return read(buffer);
  };
  return backend;
}
