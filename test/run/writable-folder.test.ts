/** A folder a script writes into, refused before the work when the system will not take a file there
 *  (a read-only folder, a file where a folder must be): one usage line naming the folder, exit 2,
 *  nothing left behind. Root writes through permission bits, so the chmod case runs only for other
 *  users; a file in the path refuses root too, and the mapping of the system's errors is checked on
 *  its own. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { checkWritableFolder, folderWriteError } from "../../src/util/fs.ts";
import { TINY_BASE_DIR } from "../../src/presets/tiny.ts";
import { UsageError } from "../../src/util/errors.ts";
import { runScript } from "./helpers/run-script.ts";

const root = process.getuid?.() === 0;
let tmp: string;
beforeAll(async () => {
  tmp = await fs.mkdtemp(path.join(os.tmpdir(), "writable-"));
});
afterAll(async () => {
  await fs.chmod(path.join(tmp, "ro"), 0o755).catch(() => {});
  await fs.rm(tmp, { recursive: true, force: true });
});

const sysError = (code: string) => Object.assign(new Error(`${code}: refused, open '/x/model-f16.gguf.1.2.tmp'`), { code });

describe("folderWriteError", () => {
  it.each(["EACCES", "EPERM", "EROFS", "ENOTDIR"])("%s: a usage line naming the folder, not the temp file", (code) => {
    const err = folderWriteError(sysError(code), "out/gguf", "--output_dir");
    expect(err).toBeInstanceOf(UsageError);
    expect((err as Error).message).toBe(`--output_dir out/gguf: cannot write in this folder (${code}); pick a writable folder path`);
  });
  it("passes other errors through", () => {
    const full = sysError("ENOSPC");
    expect(folderWriteError(full, "out", "--output_dir")).toBe(full);
  });
});

describe("checkWritableFolder", () => {
  it("takes a writable folder, or a new one under it, and leaves nothing there", async () => {
    await checkWritableFolder(tmp, "--output_dir");
    await checkWritableFolder(path.join(tmp, "new", "deeper"), "--output_dir");
    expect(await fs.readdir(tmp)).toEqual([]);
  });

  it("refuses a path through a file, naming the file", async () => {
    const file = path.join(tmp, "a-file");
    await fs.writeFile(file, "x");
    await expect(checkWritableFolder(path.join(file, "gguf"), "--output_dir")).rejects.toThrow(
      new UsageError(`--output_dir ${path.join(file, "gguf")}: ${file} is a file, so no folder can be made in it; expected a folder path`),
    );
    await expect(checkWritableFolder(file, "--output_dir")).rejects.toThrow(`--output_dir ${file} is a file: expected a folder path`);
    await fs.rm(file);
  });

  it.skipIf(root)("refuses a read-only folder", async () => {
    const ro = path.join(tmp, "ro");
    await fs.mkdir(ro, { mode: 0o555 });
    await expect(checkWritableFolder(path.join(ro, "gguf"), "--output_dir")).rejects.toThrow(
      `--output_dir ${path.join(ro, "gguf")}: cannot write in this folder (EACCES); pick a writable folder path`,
    );
    expect(await fs.readdir(ro)).toEqual([]);
  });
});

describe("scripts/export-gguf.ts into a folder it cannot write", () => {
  it("exits 2 with one line naming the folder, before loading the model, and writes nothing", async () => {
    const file = path.join(tmp, "not-a-folder");
    await fs.writeFile(file, "x");
    const out = path.join(file, "gguf");
    const r = await runScript("export-gguf.ts", ["--model_path", TINY_BASE_DIR, "--output_dir", out, "--backend", "wasm"]);
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr.trim().split("\n")).toEqual([
      `error: --output_dir ${out}: ${file} is a file, so no folder can be made in it; expected a folder path`,
    ]);
    expect(await fs.readdir(tmp)).toEqual(["not-a-folder"]);
    await fs.rm(file);
  });

  it.skipIf(root)("a read-only folder: the same, naming it", async () => {
    const ro = path.join(tmp, "ro-export");
    await fs.mkdir(ro, { mode: 0o555 });
    const r = await runScript("export-gguf.ts", ["--model_path", TINY_BASE_DIR, "--output_dir", ro, "--backend", "wasm"]);
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr.trim().split("\n")).toEqual([
      `error: --output_dir ${ro}: cannot write in this folder (EACCES); pick a writable folder path`,
    ]);
    expect(await fs.readdir(ro)).toEqual([]);
    await fs.chmod(ro, 0o755);
  });
});
