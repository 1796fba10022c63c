/** node-llama-cpp is optional: without it, --rollout_engine llama stops with one line naming the
 *  install command (exit 2), and nothing else needs it. The package is hidden by a module hook
 *  (helpers/hide-node-llama-cpp.mjs), so this runs whether it is installed or not. */
import { describe, expect, it } from "vitest";
import * as path from "node:path";
import { importLlama, LLAMA_INSTALL } from "../../src/rollout/engines/llama-package.ts";
import { UsageError } from "../../src/util/errors.ts";
import { runScript } from "../run/helpers/run-script.ts";

const notInstalled = () => {
  const err = new Error(
    "Cannot find package 'node-llama-cpp' imported from /x/src/rollout/engines/llama-package.ts",
  ) as NodeJS.ErrnoException;
  err.code = "ERR_MODULE_NOT_FOUND";
  return Promise.reject(err);
};

describe("node-llama-cpp, an optional package", () => {
  it("not installed: a usage error naming the install command", async () => {
    const err = await importLlama(notInstalled).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UsageError);
    expect((err as Error).message).not.toContain("\n");
    expect((err as Error).message).toContain("not installed");
    expect((err as Error).message).toContain("install it with: npm install --no-save --save-prod node-llama-cpp@3.21.1");
    expect(LLAMA_INSTALL).toBe("npm install --no-save --save-prod node-llama-cpp@3.21.1");
  });

  it("not installed, as vitest's resolver says it: the same message", async () => {
    const err = await importLlama(() =>
      Promise.reject(new Error('Could not resolve "node-llama-cpp" imported by "mini-agentic-rl".')),
    ).catch((e: unknown) => e);
    expect((err as Error).message).toMatch(
      /which is not installed; install it with: npm install --no-save --save-prod node-llama-cpp@3\.21\.1$/,
    );
  });

  it("installed but failing to load: the reason's first line, and the same command", async () => {
    const err = await importLlama(() => Promise.reject(new Error("bad addon\nstack"))).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UsageError);
    expect((err as Error).message).toBe(
      "--rollout_engine llama: node-llama-cpp did not load (bad addon); reinstall it with: npm install --no-save --save-prod node-llama-cpp@3.21.1",
    );
  });

  it("a script run with --rollout_engine llama without it exits 2 with that one line", async () => {
    const hide = path.join(import.meta.dirname, "helpers", "hide-node-llama-cpp.mjs");
    const r = await runScript("chat.ts", ["--preset", "tiny", "--rollout_engine", "llama"], { NODE_OPTIONS: `--import ${hide}` });
    expect(r.code).toBe(2);
    const errors = r.stderr.split("\n").filter((l) => l.startsWith("error:"));
    expect(errors).toEqual([
      "error: --rollout_engine llama needs the optional package node-llama-cpp, which is not installed; install it with: npm install --no-save --save-prod node-llama-cpp@3.21.1",
    ]);
    expect(r.stderr).not.toMatch(/\n\s+at /); // no stack trace
  });
});
