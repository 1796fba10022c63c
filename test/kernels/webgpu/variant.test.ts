/** The Qwen2 variant suite (test/model/variant-suite.ts) on the webgpu backend. */
import { describe } from "vitest";
import { variantSuite } from "../../model/helpers/variant-suite.ts";
import { webgpuForTests } from "./helpers/adapter.ts";

if (await webgpuForTests()) variantSuite("webgpu");
else describe.skip("qwen2 variant (webgpu)", () => {});
