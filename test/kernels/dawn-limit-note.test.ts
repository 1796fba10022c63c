/** Dawn's "artificially reduced" limit warnings come from its native code on every webgpu start where
 *  the driver allows more than 16 dynamic buffers per pipeline layout (lavapipe, RADV); the process
 *  cannot silence them, so one line explains them where the adapter's limits sit at Dawn's cap. */
import { describe, expect, it } from "vitest";
import { dawnLimitNote } from "../../src/kernels/webgpu/device.ts";

const limits = (uniform: number, storage: number) => ({
  maxDynamicUniformBuffersPerPipelineLayout: uniform,
  maxDynamicStorageBuffersPerPipelineLayout: storage,
});

describe("dawnLimitNote", () => {
  it("explains the warnings in one line where the adapter's limits sit at Dawn's cap of 16", () => {
    const note = dawnLimitNote(limits(16, 16));
    expect(note).toBe(
      `note: Dawn's "artificially reduced … to fit dynamic offset allocation limit" warnings, where printed above, are expected: it caps dynamic buffers per pipeline layout at 16, and no kernel here uses them`,
    );
    expect(note).not.toContain("\n");
    expect(dawnLimitNote(limits(15, 16))).toBe(note); // NVIDIA's Vulkan driver: storage at the cap
  });
  it("says nothing where no limit was capped", () => {
    expect(dawnLimitNote(limits(8, 8))).toBeNull();
    expect(dawnLimitNote(limits(12, 4))).toBeNull();
  });
});
