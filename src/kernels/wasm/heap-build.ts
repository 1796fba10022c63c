/** Which build of the heap module runs (relaxed SIMD or plain simd128, and the product kernel's rows
 *  per register block for it), and Node's WebAssembly as the heap module uses it. heap.ts builds the
 *  module for the build chosen here and builds it again when the choice changes. */
import v8 from "node:v8";

// Node's WebAssembly, typed here (the project compiles without the DOM library).
export interface WasmMemory {
  buffer: ArrayBuffer | SharedArrayBuffer;
}
export const WA = (
  globalThis as unknown as {
    WebAssembly: {
      Memory: new (d: object) => WasmMemory;
      Module: new (b: Uint8Array) => object;
      Instance: new (m: object, i: object) => { exports: unknown };
      validate: (b: Uint8Array) => boolean;
    };
  }
).WebAssembly;

/** Rows per register block of the plain SIMD build: 4 rows × 8 columns = 8 accumulators, within x64's
 *  16 vector registers with the two halves of B's row and the broadcast A value (5 rows spill: half
 *  the speed). The relaxed build's fused multiply-add needs no register for the product: see MR_RELAXED. */
const MR = 4;
/** Rows per register block of the relaxed-SIMD build: 6 × 8 = 12 accumulators + b0, b1, a where V8
 *  keeps 15 vector registers usable (Node 24: xmm15 is its scratch); Node 20's and 22's V8 spill at 6
 *  rows, so 4 there. One thread, GFLOP/s, 512×1024×1024 / 256×896×4864, 2-core machine shared and
 *  loaded, back to back: Node 24 6 rows 37.5 / 35.4, 4 rows 21.2 / 28.7; Node 20 6 rows 15.7 / 22.1,
 *  4 rows 34.4 / 33.5. 1024³ / 2048×896×4864, medians of 5, two alternating rounds: Node 24 6 rows
 *  43.0 / 42.9 and 30.4 / 39.5, 4 rows 24.7 / 37.3 and 36.8 / 30.6; Node 22 6 rows 26.4 / 24.8 and
 *  22.2 / 25.7, 4 rows 34.4 / 34.2 and 37.4 / 35.2. */
const MR_RELAXED = Number(process.versions.node.split(".")[0]) >= 24 ? 6 : 4;

/** Which build of the heap module runs: "relaxed" (the product's multiply-adds as f32x4.relaxed_madd)
 *  or "simd128" (multiply, then add). */
export type WasmSimd = "relaxed" | "simd128";
/** Picks the build: MINI_AGENTIC_RL_WASM_SIMD=simd128 or =relaxed asks for one (tests, A/B runs). */
export const WASM_SIMD_ENV = "MINI_AGENTIC_RL_WASM_SIMD";

/** A function of no parameters returning f32x4.relaxed_madd(0, 0, 0): validates where the runtime has relaxed SIMD. */
const RELAXED_PROBE = (() => {
  const zero = [0xfd, 0x0c, ...new Array(16).fill(0)];
  const body = [0, ...zero, ...zero, ...zero, 0xfd, 0x85, 0x02, 0x0b];
  return Uint8Array.from([
    0,
    0x61,
    0x73,
    0x6d,
    1,
    0,
    0,
    0,
    1,
    5,
    1,
    0x60,
    0,
    1,
    0x7b,
    3,
    2,
    1,
    0,
    10,
    body.length + 2,
    1,
    body.length,
    ...body,
  ]);
})();

let relaxedOk: boolean | null = null;
/** Whether this runtime validates relaxed SIMD. On Node < 22 (V8 keeps it behind a flag there) the flag
 *  is set first, from inside the process: V8 flags are process-wide, so helper threads see it too.
 *  Node ≥ 22 ships it on (Node 24 no longer knows the flag). */
export function relaxedSimdAvailable(): boolean {
  if (relaxedOk === null) {
    if (Number(process.versions.node.split(".")[0]) < 22) {
      try {
        v8.setFlagsFromString("--experimental-wasm-relaxed-simd");
      } catch {
        // no flag: validate says no
      }
    }
    relaxedOk = WA.validate(RELAXED_PROBE);
  }
  return relaxedOk;
}

let simdChoice: WasmSimd | null = null;
/** The build this process runs: the one asked for by MINI_AGENTIC_RL_WASM_SIMD, else relaxed where
 *  the runtime validates it, else simd128. Asking for relaxed where it does not validate is an error. */
export function wasmSimd(): WasmSimd {
  if (!simdChoice) {
    const asked = process.env[WASM_SIMD_ENV] || undefined; // set but empty: as unset
    if (asked && asked !== "relaxed" && asked !== "simd128") throw new Error(`${WASM_SIMD_ENV}=${asked}: expected relaxed or simd128`);
    if (asked === "relaxed" && !relaxedSimdAvailable()) throw new Error(`${WASM_SIMD_ENV}=relaxed: this runtime has no relaxed SIMD`);
    simdChoice = (asked as WasmSimd | undefined) ?? (relaxedSimdAvailable() ? "relaxed" : "simd128");
  }
  return simdChoice;
}

/** For the kernels' tests and A/B benchmarks: run this build from the next kernel on (the heap
 *  module is rebuilt; an earlier instance's helper threads are left waiting, unreferenced). */
export function setWasmSimd(s: WasmSimd): void {
  if (s === "relaxed" && !relaxedSimdAvailable()) throw new Error("relaxed SIMD: this runtime has none");
  simdChoice = s;
}

/** Rows per register block of the product kernel in build `simd`. */
export const rowsPerBlock = (simd: WasmSimd): number => (simd === "relaxed" ? MR_RELAXED : MR);
