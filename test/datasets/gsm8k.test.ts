import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { loadGsm8k, loadGsm8kWithReport } from "../../src/datasets/gsm8k.ts";
import { resolveGsm8kSplit } from "../../src/datasets/gsm8k-hub.ts";
import { hubCacheDirs } from "../../src/util/hub.ts";
import { cacheAsHubWrites, startFakeHub } from "../fixtures/hub/fake-hub.ts";

const FIX = path.resolve(__dirname, "../fixtures/gsm8k");
const PARQUET = path.join(FIX, "main/train-00000-of-00001.parquet");

let tmp: string;
beforeEach(async () => {
  tmp = await fs.mkdtemp(path.join(os.tmpdir(), "gsm8k-test-"));
});
afterEach(async () => {
  await fs.rm(tmp, { recursive: true, force: true });
});

async function jsonl(lines: string[]): Promise<string> {
  const file = path.join(tmp, "rows.jsonl");
  await fs.writeFile(file, lines.join("\n") + "\n");
  return file;
}
const good = (q: string, n: string) => JSON.stringify({ question: q, answer: `work <<1+1=2>>2\n#### ${n}` });

describe("loadGsm8k: JSONL", () => {
  it("reads the fixture with ids, full answers and normalised gold", async () => {
    const ex = await loadGsm8k(path.join(FIX, "tiny.jsonl"));
    expect(ex.map((e) => e.gold)).toEqual(["51", "5000", "2.25", "0"]);
    expect(ex.map((e) => e.id)).toEqual(["tiny-0", "tiny-1", "tiny-2", "tiny-3"]);
    expect(ex[0].question).toMatch(/^Sara has 15 marbles/);
    expect(ex[0].answer).toContain("<<3*12=36>>36 marbles.\n");
    expect(ex[0].answer.endsWith("#### 51")).toBe(true);
  });

  it("maxSamples stops early; split names the ids", async () => {
    const ex = await loadGsm8k(path.join(FIX, "tiny.jsonl"), { maxSamples: 2, split: "test" });
    expect(ex.map((e) => e.id)).toEqual(["test-0", "test-1"]);
    await expect(loadGsm8k(path.join(FIX, "tiny.jsonl"), { maxSamples: -1 })).rejects.toThrow(
      /maxSamples -1 must be a non-negative integer/,
    );
    await expect(loadGsm8k(path.join(FIX, "tiny.jsonl"), { split: "dev" as never })).rejects.toThrow(
      /split "dev" is not one of train, test/,
    );
  });

  it("malformed rows: error names file and 1-based line (blank lines counted)", async () => {
    const file = await jsonl([good("a", "1"), "", '{"question": "b", "answer": "no marker"}', good("c", "3")]);
    await expect(loadGsm8k(file)).rejects.toThrow(`${file}: line 3: GSM8K answer has no "#### N" line`);
    const bad = await jsonl([good("a", "1"), "{not json"]);
    await expect(loadGsm8k(bad)).rejects.toThrow(/rows\.jsonl: line 2: not valid JSON/);
    const missing = await jsonl(['{"question": "q"}']);
    await expect(loadGsm8k(missing)).rejects.toThrow(/line 1: "answer" is missing, expected non-empty text/);
    const arr = await jsonl(["[1, 2]"]);
    await expect(loadGsm8k(arr)).rejects.toThrow(/line 1: row is an array, expected an object/);
  });

  it("skipMalformed skips, counts and says so", async () => {
    const file = await jsonl([good("a", "1"), "{oops", good("c", "3"), '{"question": "d", "answer": "#### x"}']);
    const report = await loadGsm8kWithReport(file, { skipMalformed: true });
    expect(report.examples.map((e) => e.gold)).toEqual(["1", "3"]);
    expect(report.skipped.map((s) => s.row)).toEqual(["line 2", "line 4"]);
    const logs: string[] = [];
    const ex = await loadGsm8k(file, { skipMalformed: true, log: (l) => logs.push(l) });
    expect(ex).toHaveLength(2);
    expect(logs).toHaveLength(1);
    expect(logs[0]).toMatch(/skipped 2 malformed row\(s\) in .*rows\.jsonl \(first: line 2: not valid JSON/);
  });
});

describe("loadGsm8k: parquet", () => {
  it("reads Hugging Face's layout (snappy string columns)", async () => {
    const ex = await loadGsm8k(PARQUET);
    expect(ex.map((e) => e.gold)).toEqual(["42", "1000", "12.5"]);
    expect(ex.map((e) => e.id)).toEqual(["train-0", "train-1", "train-2"]);
    expect(ex[2].answer).toBe("Leo has 20 - 7.50 = $<<20-7.50=12.50>>12.50 left.\n#### 12.5");
  });

  it("malformed parquet row: error with 0-based row; skipMalformed counts it", async () => {
    const bad = path.join(FIX, "malformed/train-00000-of-00001.parquet");
    await expect(loadGsm8k(bad)).rejects.toThrow(/malformed\/train-00000-of-00001\.parquet: row 1: GSM8K answer has no "#### N" line/);
    const r = await loadGsm8kWithReport(bad, { skipMalformed: true });
    expect(r.examples).toHaveLength(2);
    expect(r.skipped).toEqual([{ row: "row 1", reason: expect.stringMatching(/no "#### N" line/) }]);
  });

  it("a folder: the hub layout inside a downloaded repo, or <split>.jsonl", async () => {
    expect((await loadGsm8k(FIX)).map((e) => e.gold)).toEqual(["42", "1000", "12.5"]);
    await expect(loadGsm8k(FIX, { split: "test" })).rejects.toThrow(
      /holds no GSM8K test split: expected test\.jsonl, main\/test-\*\.parquet/,
    );
    await fs.writeFile(path.join(tmp, "test.jsonl"), good("q", "7") + "\n");
    expect((await loadGsm8k(tmp, { split: "test" })).map((e) => [e.id, e.gold])).toEqual([["test-0", "7"]]);
  });

  it("a file that is not parquet gives one clear error", async () => {
    const fake = path.join(tmp, "x.parquet");
    await fs.writeFile(fake, "not parquet at all");
    await expect(loadGsm8k(fake)).rejects.toThrow(/x\.parquet: cannot read as parquet/);
  });
});

describe("dataset names through the Hugging Face cache", () => {
  async function cacheWith(folder: string, rev: string): Promise<string> {
    const hub = path.join(tmp, "hub");
    await cacheAsHubWrites(hub, folder, rev, { "main/train-00000-of-00001.parquet": await fs.readFile(PARQUET) });
    return hub;
  }

  it("cache roots follow HF_HUB_CACHE, HF_HOME/hub, then ~/.cache", () => {
    const dirs = hubCacheDirs({ HF_HUB_CACHE: "/a", HF_HOME: "/b" });
    expect(dirs.slice(0, 2)).toEqual(["/a", path.join("/b", "hub")]);
    expect(dirs[2]).toMatch(/huggingface[\\/]hub$/);
  });

  it("finds openai/gsm8k (and the old gsm8k folder) in the cache", async () => {
    const hub = await cacheWith("datasets--openai--gsm8k", "abc123");
    const env = { HF_HUB_CACHE: hub, HF_HUB_OFFLINE: "1" };
    expect(await resolveGsm8kSplit("openai/gsm8k", "train", env)).toBe(
      path.join(hub, "datasets--openai--gsm8k/snapshots/abc123/main/train-00000-of-00001.parquet"),
    );
    await fs.rm(path.join(hub, "datasets--openai--gsm8k"), { recursive: true });
    const old = await cacheWith("datasets--gsm8k", "def456");
    expect(await resolveGsm8kSplit("gsm8k", "train", { HF_HUB_CACHE: old, HF_HUB_OFFLINE: "1" })).toMatch(/def456/);
  });

  it("loadGsm8k by name reads the cached split", async () => {
    const hub = await cacheWith("datasets--openai--gsm8k", "abc123");
    const saved = { c: process.env.HF_HUB_CACHE, o: process.env.HF_HUB_OFFLINE };
    process.env.HF_HUB_CACHE = hub;
    process.env.HF_HUB_OFFLINE = "1";
    try {
      const ex = await loadGsm8k("gsm8k", { split: "train" });
      expect(ex.map((e) => e.gold)).toEqual(["42", "1000", "12.5"]);
      await expect(loadGsm8k("gsm8k", { split: "test" })).rejects.toThrow(/GSM8K test split not found/);
    } finally {
      for (const [k, v] of [
        ["HF_HUB_CACHE", saved.c],
        ["HF_HUB_OFFLINE", saved.o],
      ] as const)
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
    }
  });

  it("offline and missing: says where it looked and how to get it", async () => {
    const env = { HF_HUB_CACHE: path.join(tmp, "empty"), HF_HUB_OFFLINE: "1" };
    const err = await resolveGsm8kSplit("openai/gsm8k", "test", env).catch((e: Error) => e.message);
    expect(err).toContain(path.join(tmp, "empty", "datasets--openai--gsm8k", "snapshots", "*", "main", "test-*.parquet"));
    expect(err).toContain("HF_HUB_OFFLINE is set");
    expect(err).toContain("huggingface-cli download openai/gsm8k --repo-type dataset");
    expect(err).toContain("pass a JSONL path");
  });

  it("an unknown name or missing file is not mistaken for a dataset", async () => {
    await expect(loadGsm8k(path.join(tmp, "nope.jsonl"))).rejects.toThrow(/"\S*nope\.jsonl" is neither a file nor a dataset name/);
  });

  it("downloads into the cache layout when online (local server standing in for the hub)", async () => {
    const bytes = await fs.readFile(PARQUET);
    const hub = await startFakeHub({
      type: "dataset",
      name: "openai/gsm8k",
      commit: "feed42",
      files: { "main/train-00000-of-00001.parquet": bytes },
    });
    try {
      const dl = path.join(tmp, "dl");
      const env = { HF_HUB_CACHE: dl, HF_ENDPOINT: hub.url };
      const file = await resolveGsm8kSplit("openai/gsm8k", "train", env);
      expect(file).toBe(path.join(dl, "datasets--openai--gsm8k/snapshots/feed42/main/train-00000-of-00001.parquet"));
      expect(await fs.readFile(path.join(dl, "datasets--openai--gsm8k/refs/main"), "utf8")).toBe("feed42");
      expect(Buffer.compare(await fs.readFile(file), bytes)).toBe(0);
      expect((await fs.lstat(file)).isSymbolicLink()).toBe(true); // a link into blobs/, as the hub writes
      // Second time it comes from the cache: no new request.
      const before = hub.seen.length;
      expect(await resolveGsm8kSplit("openai/gsm8k", "train", env)).toBe(file);
      expect(hub.seen).toHaveLength(before);
      // A failed download is reported with the URL and status.
      const err = await resolveGsm8kSplit("openai/gsm8k", "test", env).catch((e: Error) => e.message);
      expect(err).toMatch(/download failed: GET .*test-00000-of-00001\.parquet -> HTTP 404/);
    } finally {
      await hub.close();
    }
  });
});
