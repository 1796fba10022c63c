/** The Qwen2 variant suite (variant-suite.ts) on the wasm backend. */
import { variantSuite } from "./helpers/variant-suite.ts";

variantSuite("wasm");
