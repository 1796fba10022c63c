import { describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { Rng } from "../../src/util/rng.ts";
import { writeDirAtomic, writeFileAtomic } from "../../src/util/fs.ts";

describe("Rng", () => {
  it("is reproducible from a seed and from a saved state", () => {
    const a = new Rng(42);
    const first = [a.next(), a.next(), a.next()];
    expect(new Rng(42).next()).toBe(first[0]);
    const b = new Rng(7);
    b.next();
    const saved = b.getState();
    const x = [b.next(), b.int(0, 9), b.normal()];
    b.setState(saved);
    expect([b.next(), b.int(0, 9), b.normal()]).toEqual(x);
  });

  it("draws uniformly in [0,1) and ints in range", () => {
    const r = new Rng(1);
    let sum = 0;
    for (let i = 0; i < 20000; i++) {
      const u = r.next();
      expect(u >= 0 && u < 1).toBe(true);
      sum += u;
    }
    expect(Math.abs(sum / 20000 - 0.5)).toBeLessThan(0.01);
    const seen = new Set<number>();
    for (let i = 0; i < 1000; i++) seen.add(r.int(3, 6));
    expect([...seen].sort()).toEqual([3, 4, 5, 6]);
  });
});

describe("atomic writes", () => {
  it("replaces a file and a folder whole, and leaves the old folder when filling fails", async () => {
    const root = await fs.mkdtemp(path.join(os.tmpdir(), "marl-"));
    const file = path.join(root, "a", "x.json");
    await writeFileAtomic(file, "1");
    await writeFileAtomic(file, "2");
    expect(await fs.readFile(file, "utf8")).toBe("2");

    const dir = path.join(root, "ckpt");
    await writeDirAtomic(dir, async (t) => fs.writeFile(path.join(t, "f"), "old"));
    await expect(
      writeDirAtomic(dir, async (t) => {
        await fs.writeFile(path.join(t, "f"), "half");
        throw new Error("disk full");
      }),
    ).rejects.toThrow("disk full");
    expect(await fs.readFile(path.join(dir, "f"), "utf8")).toBe("old");
    await writeDirAtomic(dir, async (t) => fs.writeFile(path.join(t, "f"), "new"));
    expect(await fs.readFile(path.join(dir, "f"), "utf8")).toBe("new");
    expect((await fs.readdir(root)).sort()).toEqual(["a", "ckpt"]);
  });
});
