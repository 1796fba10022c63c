/** The golden suite (test/model/golden-suite.ts) on the webgpu backend, same thresholds as wasm. */
import { describe } from "vitest";
import { goldenSuite } from "../../model/helpers/golden-suite.ts";
import { webgpuForTests } from "./helpers/adapter.ts";

if (await webgpuForTests()) goldenSuite("webgpu");
else describe.skip("qwen2-tiny golden parity (webgpu)", () => {});
