/** node-llama-cpp, an optional peer dependency: `npm install` leaves it out (llama.cpp's prebuilt
 *  CPU, CUDA and Vulkan builds weigh about 700 MB) and only --rollout_engine llama loads it, here, on
 *  first use. Nothing else in the project needs it. Where it is installed its types are checked (CI
 *  installs it before type-checking); where it is not, the type import below finds nothing and its
 *  names are `any`. */
// @ts-ignore -- absent unless installed (see above)
import type * as NodeLlamaCpp from "node-llama-cpp";
import { UsageError } from "../../util/errors.ts";

export type { NodeLlamaCpp };
type Module = typeof NodeLlamaCpp;

/** The version this project is written against: LlamaBatch uses its internals. */
export const LLAMA_PACKAGE = "node-llama-cpp@3.21.1";
/** How to add it in this project's folder. npm 11 treats a plain `npm install node-llama-cpp@3.21.1`
 *  there as already satisfied by the optional peer entry and installs nothing; `--save-prod` makes it
 *  a dependency for this install only, and `--no-save` leaves package.json and the lock as they are.
 *  A later `npm install` or `npm ci` removes it again. */
export const LLAMA_INSTALL = `npm install --no-save --save-prod ${LLAMA_PACKAGE}`;

/** The module, or a one-line UsageError naming the command that installs it. `load` stands in for the
 *  import in tests. */
export async function importLlama(load: () => Promise<Module> = () => import("node-llama-cpp" as string)): Promise<Module> {
  try {
    return await load();
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    const missing =
      e?.code === "ERR_MODULE_NOT_FOUND" || /(Cannot find (package|module)|Could not resolve) .?node-llama-cpp/.test(String(e?.message));
    throw new UsageError(
      missing
        ? `--rollout_engine llama needs the optional package node-llama-cpp, which is not installed; install it with: ${LLAMA_INSTALL}`
        : `--rollout_engine llama: node-llama-cpp did not load (${String(e?.message).split("\n")[0]}); reinstall it with: ${LLAMA_INSTALL}`,
    );
  }
}
