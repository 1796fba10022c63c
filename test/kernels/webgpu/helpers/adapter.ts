/** Whether the webgpu tests can run here. Under CI=true a missing adapter is a failure (thrown while
 *  the test file loads); elsewhere the file's suites are skipped with one line saying how to enable
 *  them. Import first in every test/kernels/webgpu file: `const gpu = await webgpuForTests();`. */
import { registerWebgpu } from "../../../../src/kernels/webgpu/device.ts";

const ENABLE = "sh scripts/setup-webgpu-adapter.sh DEST, then `. DEST/env.sh` before npm test";

export async function webgpuForTests(): Promise<boolean> {
  const probe = await registerWebgpu(false);
  if (probe.ok) return true;
  if (process.env.CI === "true" || process.env.CI === "1")
    throw new Error(`webgpu tests: CI=true but ${probe.reason} (CI installs one: ${ENABLE})`);
  console.warn(`webgpu tests skipped: ${probe.reason.split(";")[0]}; to run them: ${ENABLE}`);
  return false;
}
