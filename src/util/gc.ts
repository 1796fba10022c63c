/** A full garbage collection at a training step's boundary, as TRL and verl call gc.collect() between
 *  steps. Each step leaves a few MB of dead JS objects and host arrays (token and mask arrays, the
 *  attention bias, tape records, read-back logits) that outlive the young generation; V8 collects the
 *  old generation lazily while the main thread computes, so without this RSS climbs several MB per
 *  step in a sawtooth, hiding any real leak. A collection costs tens of milliseconds against steps of
 *  seconds, and the memory logged after it is what the run really holds.
 *  Node exposes gc() only under --expose-gc; without that flag it is exposed here at run time (the flag
 *  set before a fresh context is made, whose global then has gc). Where that is refused, nothing runs. */
import * as v8 from "node:v8";
import * as vm from "node:vm";

let gc: (() => void) | null | undefined;

function findGc(): (() => void) | null {
  const own = (globalThis as { gc?: () => void }).gc;
  if (typeof own === "function") return own;
  try {
    v8.setFlagsFromString("--expose-gc");
    const fn = vm.runInNewContext("gc") as unknown;
    return typeof fn === "function" ? (fn as () => void) : null;
  } catch {
    return null;
  }
}

/** Run a full collection; false where this runtime offers none. */
export function collectGarbage(): boolean {
  if (gc === undefined) gc = findGc();
  gc?.();
  return gc !== null;
}
