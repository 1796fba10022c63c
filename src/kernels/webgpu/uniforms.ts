/** A dispatch's uniforms (shapes, strides and the program's own values) written into one buffer per
 *  submit instead of a pooled buffer and a queue write per dispatch: tfjs 4.22's makeUniforms acquires
 *  a uniform buffer and calls queue.writeBuffer for every dispatch (~80 µs of a ~250 µs dispatch on
 *  the software adapter). Here each dispatch's uniforms take the next 256-byte-aligned slot of a host
 *  arena, bound at that offset, and the arena is written with one queue.writeBuffer just before the
 *  backend submits (every submit goes through submitQueue). The queue runs its writes and submits in
 *  order, so the next batch may rewrite the same buffer. The struct layout is tfjs' own (WGSL's
 *  alignment of scalars and vectors up to 6, as makeUniforms computes it). */
import type { Backend } from "../kernels.ts";

type Uniform = { type: string; data: number[] };

/** Byte offsets of each uniform in tfjs' struct and the struct's size. */
export function uniformLayout(uniforms: Uniform[]): { offsets: number[]; size: number } {
  let offset = 0,
    prev = 0,
    maxAlign = 1;
  const offsets: number[] = [];
  for (const u of uniforms) {
    const n = u.data.length || 1;
    if (n > 6) throw new Error(`a uniform of ${n} values; tfjs lays out at most 6`);
    let align = n === 1 ? 4 : n === 2 ? 8 : 16;
    if (prev === 5 || prev === 6) align = 16;
    maxAlign = Math.max(maxAlign, align);
    offset = Math.ceil(offset / align) * align;
    prev = n;
    offsets.push(offset);
    offset += n * 4;
  }
  return { offsets, size: Math.ceil(offset / maxAlign) * maxAlign };
}

/** Replace the backend's per-dispatch uniform buffers with one arena written per submit. */
export function batchUniforms<B extends object>(backend: B): B {
  const b = backend as Backend;
  const device = b.device as GPUDevice,
    align = device.limits.minUniformBufferOffsetAlignment;
  const host = new ArrayBuffer(64 * 1024);
  let used = 0,
    buffer: GPUBuffer | null = null;
  const arena = () => (buffer ??= device.createBuffer({ size: host.byteLength, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST }));
  b.makeUniforms = (uniforms: Uniform[]) => {
    for (const u of uniforms) if (u.data.length === 0) u.data = [1]; // as tfjs
    const { offsets, size } = uniformLayout(uniforms);
    const at = Math.ceil(used / align) * align;
    if (at + size > host.byteLength) {
      // the arena is full (256 dispatches since the last submit): submit them, then start it again
      b.endComputePassEncoder();
      b.submitQueue();
      return b.makeUniforms(uniforms);
    }
    uniforms.forEach((u, i) => {
      const View = u.type === "int32" ? Int32Array : u.type === "uint32" ? Uint32Array : Float32Array;
      new View(host, at + offsets[i], u.data.length).set(u.data);
    });
    used = at + size;
    return { offset: at, size, buffer: arena() };
  };
  const submit = b.submitQueue.bind(b);
  b.submitQueue = () => {
    if (used > 0) device.queue.writeBuffer(arena(), 0, host, 0, Math.ceil(used / 4) * 4);
    used = 0;
    submit();
  };
  return backend;
}
