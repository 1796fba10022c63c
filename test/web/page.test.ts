/** The page (web/, npm run web) in a real Chromium: the build's guard against Node imports, the
 *  server's headers, and the hands-free pipeline on wasm and on WebGPU (SwiftShader), short: 3 SFT
 *  steps, 3 GRPO steps, 20 evaluation questions, one chat turn with a calculator call.
 *  Needs a Chromium (Debian: apt-get install chromium; or CHROMIUM=/path): skipped with a line saying
 *  so without one, except under CI=true, where the suite fails. */
import * as esbuild from "esbuild";
import { promises as fs } from "node:fs";
import type { Server } from "node:http";
import * as os from "node:os";
import * as path from "node:path";
import { chromium, type Browser, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { adaptersPlugin, buildWeb, serveWeb } from "../../scripts/web.ts";
import { findChromium } from "../../src/report/screenshot.ts";

const CI = process.env.CI === "true" || process.env.CI === "1";

async function chromiumPath(): Promise<string | null> {
  try {
    return await findChromium(process.env.CHROMIUM);
  } catch (err) {
    if (CI) throw new Error(`the page's tests: CI=true but ${(err as Error).message}`);
    console.warn(`the page's Chromium tests skipped: ${(err as Error).message}`);
    return null;
  }
}
const browserPath = await chromiumPath();

/** Chromium flags: root needs --no-sandbox; SwiftShader gives headless Chromium a WebGPU adapter. */
export const CHROMIUM_ARGS = ["--no-sandbox", "--enable-unsafe-webgpu", "--enable-unsafe-swiftshader"];

describe("the page's build", () => {
  it("fails on a node: import that has no adapter, naming the importer", async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), "web-build-"));
    try {
      await fs.writeFile(path.join(dir, "entry.ts"), `import * as net from "node:net";\nconsole.log(net);\n`);
      const build = esbuild.build({
        entryPoints: [path.join(dir, "entry.ts")],
        bundle: true,
        write: false,
        logLevel: "silent",
        plugins: [adaptersPlugin()],
      });
      await expect(build).rejects.toThrow(/node:net imported by .*entry\.ts: the page has no adapter for it/);
    } finally {
      await fs.rm(dir, { recursive: true, force: true });
    }
  });
});

describe.skipIf(browserPath === null)("the page in Chromium", () => {
  let dir: string;
  let server: Server;
  let url: string;
  let browser: Browser;
  let bundleBytes: Record<string, number>;

  beforeAll(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), "web-page-"));
    bundleBytes = (await buildWeb(dir)).bytes;
    server = await serveWeb(dir, 0);
    url = `http://127.0.0.1:${(server.address() as { port: number }).port}/`;
    browser = await chromium.launch({ executablePath: browserPath!, args: CHROMIUM_ARGS });
  });
  afterAll(async () => {
    await browser?.close();
    server?.close();
    if (dir) await fs.rm(dir, { recursive: true, force: true });
  });

  it("is served cross-origin isolated, with nothing outside its folder", async () => {
    const res = await fetch(url);
    expect(res.status).toBe(200);
    expect(res.headers.get("cross-origin-opener-policy")).toBe("same-origin");
    expect(res.headers.get("cross-origin-embedder-policy")).toBe("require-corp");
    expect((await fetch(url + "tiny/config.json")).status).toBe(200);
    expect((await fetch(url + "..%2fpackage.json")).status).toBe(404);
    expect(Object.keys(bundleBytes)).toEqual(expect.arrayContaining(["app.js", "calculator-worker.mjs", "index.html"]));
  });

  /** Open the page hands-free and wait for it to end; every state it went through, its console
   *  errors and its results element. */
  async function autorun(params: string, timeoutMs: number) {
    const page: Page = await browser.newPage();
    const errors: string[] = [];
    page.on("console", (m) => void (m.type() === "error" && errors.push(m.text())));
    page.on("pageerror", (e) => errors.push(e.message));
    await page.addInitScript(() => {
      const seen: string[] = [];
      (window as unknown as { __states: string[] }).__states = seen;
      new MutationObserver(() => {
        const s = document.body?.dataset.state;
        if (s && seen.at(-1) !== s) seen.push(s);
      }).observe(document, { attributes: true, subtree: true, attributeFilter: ["data-state"] });
    });
    try {
      await page.goto(`${url}?autorun=1&${params}`);
      await page.waitForFunction(() => /^(done|stopped|error)/.test(document.body.dataset.state ?? ""), null, {
        timeout: timeoutMs,
        polling: 250,
      });
      const states = await page.evaluate(() => (window as unknown as { __states: string[] }).__states);
      const results = JSON.parse((await page.textContent("#results")) ?? "{}");
      const table = await page.textContent("#evalTable");
      const crossOriginIsolated = await page.evaluate(() => crossOriginIsolated);
      return { states, results, table, errors, crossOriginIsolated };
    } finally {
      await page.close();
    }
  }

  const SHORT = "sft_steps=3&grpo_steps=3&eval_samples=20&chat=" + encodeURIComponent("What is 123 * 456?");

  function checkShortRun(r: Awaited<ReturnType<typeof autorun>>, backend: string): void {
    expect(r.states.at(-1), r.states.join(" → ")).toBe("done");
    expect(r.states).toEqual(["ready", "sft", "grpo", "eval", "chat", "done"]);
    expect(r.errors).toEqual([]);
    expect(r.crossOriginIsolated).toBe(true);
    expect(r.results.backend).toBe(backend);
    expect(Object.keys(r.results.eval)).toEqual(["base", "sft", "sft-nf4", "rl"]);
    for (const m of Object.values(r.results.eval) as Array<{ strict: number; lo: number; hi: number; n: number }>) {
      expect(m.n).toBe(20);
      expect(m.lo).toBeLessThanOrEqual(m.strict);
      expect(m.hi).toBeGreaterThanOrEqual(m.strict);
    }
    expect(r.table).toMatch(/^model\s+\| strict acc \[95% CI\]/);
    expect(r.table).toContain("improvement rl vs sft: strict");
    expect(r.results.chat.toolCalls).toBeGreaterThanOrEqual(1);
    expect(r.results.chat.answer).toMatch(/\[calculator\] .* → /);
    expect(r.results.sha256.rl_adapter).toMatch(/^[0-9a-f]{64}$/);
  }

  it("runs the pipeline hands-free on wasm", async () => {
    checkShortRun(await autorun(`${SHORT}&backend=wasm`, 240_000), "wasm");
  }, 300_000);

  it("runs the pipeline hands-free on WebGPU (SwiftShader)", async () => {
    checkShortRun(await autorun(`${SHORT}&backend=webgpu`, 400_000), "webgpu");
  }, 450_000);

  it("says what failed in one line", async () => {
    const r = await autorun("backend=metal", 60_000);
    expect(r.states.at(-1)).toBe("error: ?backend=metal: expected wasm or webgpu");
  }, 90_000);
});
