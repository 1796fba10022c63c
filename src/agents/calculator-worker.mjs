// Plain-JS entry for the calculator worker thread. A worker does not inherit the TypeScript loader of
// the process that started it (tsx's flags, or vitest's in-process transform), so it loads tsx itself
// and imports the TypeScript worker through it. Works under `npx tsx` and `npx vitest` alike.
import { tsImport } from "tsx/esm/api";

await tsImport("./calculator-worker.ts", import.meta.url);
