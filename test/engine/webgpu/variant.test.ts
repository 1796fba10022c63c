/** The Qwen2 variant suite (test/model/variant-suite.ts) on the webgpu backend. */
import { describe } from "vitest";
import { variantSuite } from "../../model/variant-suite.ts";
import { webgpuForTests } from "./adapter.ts";

if (await webgpuForTests()) variantSuite("webgpu");
else describe.skip("qwen2 variant (webgpu)", () => {});
