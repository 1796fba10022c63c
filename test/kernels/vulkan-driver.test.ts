/** Whether `auto` should try webgpu on Linux: the Vulkan loader's own search for a driver manifest
 *  (webgpu/device.ts vulkanDriverFound), on folders and variables made here. Without one, Dawn can only fail,
 *  after three lines of warnings on stderr. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { vulkanDriverFound } from "../../src/kernels/webgpu/device.ts";

let root: string;
const at = (...p: string[]) => path.join(root, ...p);
beforeAll(async () => {
  root = await fs.mkdtemp(path.join(os.tmpdir(), "vk-icd-"));
  for (const d of [
    "home",
    "etc",
    "data-empty/vulkan/icd.d",
    "data-txt/vulkan/icd.d",
    "data-json/vulkan/icd.d",
    "home/.local/share/vulkan/icd.d",
  ])
    await fs.mkdir(at(d), { recursive: true });
  await fs.writeFile(at("data-txt/vulkan/icd.d/readme.txt"), "not a manifest");
  await fs.writeFile(at("data-json/vulkan/icd.d/lvp_icd.json"), "{}");
  await fs.writeFile(at("home/.local/share/vulkan/icd.d/nvidia_icd.json"), "{}");
  await fs.writeFile(at("lvp.json"), "{}");
});
afterAll(() => fs.rm(root, { recursive: true, force: true }));

// a search with nothing in it: every folder the loader reads is one made here
const bare = () => ({ HOME: at("nohome"), XDG_CONFIG_DIRS: at("none"), XDG_DATA_DIRS: at("data-empty") });

describe("vulkanDriverFound", () => {
  it("finds no driver where no icd.d folder holds a .json manifest", () => {
    expect(vulkanDriverFound(bare(), "linux", at("etc"))).toBe(false);
    expect(vulkanDriverFound({ ...bare(), XDG_DATA_DIRS: `${at("data-empty")}:${at("data-txt")}` }, "linux", at("etc"))).toBe(false);
  });

  it("finds a manifest in XDG_DATA_DIRS, in ~/.local/share or in the system config folder", async () => {
    expect(vulkanDriverFound({ ...bare(), XDG_DATA_DIRS: `${at("data-txt")}:${at("data-json")}` }, "linux", at("etc"))).toBe(true);
    expect(vulkanDriverFound({ ...bare(), HOME: at("home") }, "linux", at("etc"))).toBe(true);
    expect(vulkanDriverFound(bare(), "linux", at("data-json"))).toBe(true);
  });

  it("takes VK_DRIVER_FILES / VK_ICD_FILENAMES (files or folders) in place of the search; VK_ADD_DRIVER_FILES adds to it", () => {
    expect(vulkanDriverFound({ ...bare(), VK_ICD_FILENAMES: at("lvp.json") }, "linux", at("etc"))).toBe(true);
    expect(vulkanDriverFound({ ...bare(), VK_DRIVER_FILES: at("data-json/vulkan/icd.d") }, "linux", at("etc"))).toBe(true);
    // named but missing: the loader searches nowhere else, so a manifest elsewhere does not count
    expect(vulkanDriverFound({ ...bare(), HOME: at("home"), VK_DRIVER_FILES: at("missing.json") }, "linux", at("etc"))).toBe(false);
    expect(vulkanDriverFound({ ...bare(), VK_ADD_DRIVER_FILES: at("lvp.json") }, "linux", at("etc"))).toBe(true);
  });

  it("does not look on other platforms (Metal, D3D12)", () => {
    expect(vulkanDriverFound(bare(), "darwin", at("etc"))).toBe(true);
    expect(vulkanDriverFound(bare(), "win32", at("etc"))).toBe(true);
  });
});
