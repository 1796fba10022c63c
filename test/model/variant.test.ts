/** The Qwen2 variant suite (variant-suite.ts) on the wasm backend. */
import { variantSuite } from "./variant-suite.ts";

variantSuite("wasm");
