/** The golden suite (golden-suite.ts) on the wasm backend. */
import { goldenSuite } from "./helpers/golden-suite.ts";

goldenSuite("wasm");
