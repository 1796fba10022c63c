/** `process` for src/ in the page (scripts/web.ts imports it into the src/ modules that use it): what src/ reads of it. stderr lines
 *  go to the page's log (setLogSink), the environment is empty, and `versions.node` says which V8
 *  generation runs: src/kernels picks V8-dependent register blocking by Node's major version, and
 *  the Chromium this page needs (WebAssembly relaxed SIMD, V8 ≥ 13) is at least Node 24's V8. */
let sink: (line: string) => void = (line) => console.log(line);
/** Where the lines src/ writes to stderr/stdout go. */
export function setLogSink(f: (line: string) => void): void {
  sink = f;
}
let pending = "";
const stream = {
  isTTY: false,
  columns: 120,
  write(chunk: string | Uint8Array): boolean {
    pending += typeof chunk === "string" ? chunk : new TextDecoder().decode(chunk);
    const lines = pending.split("\n");
    pending = lines.pop() ?? "";
    for (const l of lines) sink(l);
    return true;
  },
  on: () => stream,
};
type Mem = { usedJSHeapSize?: number };
export const process = {
  env: {} as Record<string, string | undefined>,
  pid: 1,
  platform: "browser",
  arch: "wasm",
  argv: [] as string[],
  versions: { node: "24.0.0" } as Record<string, string>,
  stderr: stream,
  stdout: stream,
  cwd: () => "/",
  /** What the page can see of its memory: the JS heap in use (Chromium's performance.memory). */
  memoryUsage: () => {
    const used = (performance as unknown as { memory?: Mem }).memory?.usedJSHeapSize ?? 0;
    return { rss: used, heapUsed: used, heapTotal: used, external: 0, arrayBuffers: 0 };
  },
  on: () => process,
  once: () => process,
  off: () => process,
  removeListener: () => process,
  nextTick: (f: (...a: unknown[]) => void, ...a: unknown[]) => queueMicrotask(() => f(...a)),
  exit: (code?: number) => {
    throw new Error(`process.exit(${code ?? 0}) called in the page`);
  },
  kill: () => {
    throw new Error("process.kill: the page starts no processes");
  },
};
export default process;
