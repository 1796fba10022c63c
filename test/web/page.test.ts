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
import { execFile } from "node:child_process";
import { chromium, type Browser, type Download, type Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { adaptersPlugin, buildWeb, serveWeb } from "../../scripts/web.ts";
import { findChromium } from "../../src/report/screenshot.ts";

const CI = process.env.CI === "true" || process.env.CI === "1";
const ROOT = path.resolve(import.meta.dirname, "../..");
const README_QUESTION = "Ava has 123 pencils and buys 456 more. How many pencils does Ava have now?";

/** A command in the project's folder with `input` on stdin. */
function run(cmd: string, args: string[], input: string): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = execFile(cmd, args, { cwd: ROOT, timeout: 180_000 }, (err, stdout, stderr) =>
      resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
    child.stdin!.end(input);
  });
}

async function chromiumPath(): Promise<string | null> {
  try {
    return await findChromium(process.env.CHROMIUM);
  } catch (err) {
    const why = `${(err as Error).message} (here: CHROMIUM=<path>)`;
    if (CI) throw new Error(`the page's tests: CI=true but ${why}`);
    console.warn(`the page's Chromium tests skipped: ${why}`);
    return null;
  }
}
const browserPath = await chromiumPath();

/** Browser-side code, as text (this file is type-checked without the DOM's types). The page has
 *  ended a run: */
const ENDED = `/^(done|stopped|error)/.test(document.body.dataset.state ?? "")`;
/** Every state the page goes through, in window.__states. Changes made in one task arrive together:
 *  each record's old value is the previous one's new value. */
const RECORD_STATES = `
  const seen = (window.__states = []);
  new MutationObserver((records) => {
    const values = [...records.slice(1).map((r) => r.oldValue), document.body?.dataset.state];
    for (const s of values) if (s && seen.at(-1) !== s) seen.push(s);
  }).observe(document, { attributes: true, attributeOldValue: true, subtree: true, attributeFilter: ["data-state"] });`;

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
    await page.addInitScript({ content: RECORD_STATES });
    try {
      await page.goto(`${url}?autorun=1&${params}`);
      await page.waitForFunction(ENDED, null, {
        timeout: timeoutMs,
        polling: 250,
      });
      const states = await page.evaluate<string[]>("window.__states");
      const results = JSON.parse((await page.textContent("#results")) ?? "{}");
      const table = await page.textContent("#evalTable");
      const crossOriginIsolated = await page.evaluate<boolean>("crossOriginIsolated");
      return { states, results, table, errors, crossOriginIsolated };
    } finally {
      await page.close();
    }
  }

  // A question the model calls its calculator for after these few steps (on wasm the weights are
  // the same every run: the steps are deterministic).
  const QUESTION = "Mia has 84 stickers and gives away 29. How many stickers does Mia have left?";
  const SHORT = "sft_steps=3&grpo_steps=3&eval_samples=20&chat=" + encodeURIComponent(QUESTION);

  /** A hands-free run that went through every phase: `n` questions per model; with `toolCall`, the
   *  chat turn called the calculator. */
  function checkRun(r: Awaited<ReturnType<typeof autorun>>, backend: string, n: number, toolCall: boolean): void {
    expect(r.states.at(-1), r.states.join(" → ")).toBe("done");
    expect(r.states).toEqual(["ready", "sft", "grpo", "eval", "chat", "done"]);
    expect(r.errors).toEqual([]);
    expect(r.crossOriginIsolated).toBe(true);
    expect(r.results.backend).toBe(backend);
    expect(Object.keys(r.results.eval)).toEqual(["base", "sft", "sft-nf4", "rl"]);
    for (const m of Object.values(r.results.eval) as Array<{ strict: number; lo: number; hi: number; n: number }>) {
      expect(m.n).toBe(n);
      expect(m.lo).toBeLessThanOrEqual(m.strict);
      expect(m.hi).toBeGreaterThanOrEqual(m.strict);
    }
    expect(r.table).toMatch(/^model\s+\| strict acc \[95% CI\]/);
    expect(r.table).toContain("improvement rl vs sft: strict");
    expect(r.results.chat.answer.length).toBeGreaterThan(0);
    if (toolCall) {
      expect(r.results.chat.toolCalls).toBeGreaterThanOrEqual(1);
      expect(r.results.chat.answer).toMatch(/\[calculator\] .* → /);
    }
    expect(r.results.sha256.rl_adapter).toMatch(/^[0-9a-f]{64}$/);
  }

  it("runs untrusted input in a Web Worker that a timeout terminates (the calculator's sandbox)", async () => {
    const fixtures = path.join(ROOT, "test/web/fixtures");
    const files = [
      ["sandbox-page.js", "sandbox-page.js"],
      ["sandbox-worker.js", "sandbox-worker.js"],
    ];
    for (const [from, to] of files)
      await esbuild.build({
        entryPoints: [path.join(fixtures, from)],
        bundle: true,
        format: "esm",
        outfile: path.join(dir, to),
        logLevel: "silent",
      });
    await fs.writeFile(path.join(dir, "sandbox.html"), `<!DOCTYPE html><script type="module" src="sandbox-page.js"></script>`);
    const page: Page = await browser.newPage();
    try {
      await page.goto(url + "sandbox.html");
      await page.waitForFunction("typeof window.sandboxCheck === 'function'");
      expect(await page.evaluate("window.sandboxCheck()")).toEqual({
        first: { ok: true, value: "echo hello" },
        spin: { ok: false, reason: "timeout", message: "took longer than 250 ms" },
        after: { ok: true, value: "echo again" }, // a fresh worker: the spinning one was terminated
        started: 2,
        closed: { ok: false, reason: "shutdown", message: "sandbox is shut down" },
      });
    } finally {
      await page.close();
    }
  });

  it("runs the pipeline hands-free on wasm", async () => {
    checkRun(await autorun(`${SHORT}&backend=wasm`, 240_000), "wasm", 20, true);
  }, 300_000);

  /** Wait for a phase started by a click to end (the state leaves "ready"/"done" and comes back). */
  async function clickAndWait(page: Page, selector: string, timeoutMs: number): Promise<void> {
    await page.evaluate('document.body.dataset.state = "clicked"');
    await page.click(selector);
    await page.waitForFunction(ENDED, null, {
      timeout: timeoutMs,
      polling: 250,
    });
    expect(await page.evaluate<string>("document.body.dataset.state")).toBe("done");
  }

  /** Every file one click downloads, saved into `dir`. */
  async function downloads(page: Page, selector: string, dir: string, count: number): Promise<string[]> {
    const got: Promise<string>[] = [];
    const on = (d: Download) => got.push(d.saveAs(path.join(dir, d.suggestedFilename())).then(() => d.suggestedFilename()));
    page.on("download", on);
    await page.click(selector);
    for (let t = Date.now(); got.length < count && Date.now() - t < 30_000;) await new Promise((r) => setTimeout(r, 100));
    page.off("download", on);
    return (await Promise.all(got)).sort();
  }

  it("downloads its adapter and SFT model: Node's chat gives the page's greedy answer, and they load back", async () => {
    const work = await fs.mkdtemp(path.join(os.tmpdir(), "web-adapter-"));
    const page: Page = await browser.newPage();
    try {
      await page.goto(`${url}?autorun=1&${SHORT}&backend=wasm`);
      await page.waitForFunction(ENDED, null, {
        timeout: 240_000,
        polling: 250,
      });
      await page.fill("#chatIn", README_QUESTION);
      await clickAndWait(page, "#chatGo", 60_000);
      const answer: string = JSON.parse((await page.textContent("#results"))!).chat.answer;
      expect(answer.length).toBeGreaterThan(0);
      // Laid out as the quickstart's outputs: the adapter's config names its base ../../sft/final.
      const adapterDir = path.join(work, "grpo", "final"),
        sftDir = path.join(work, "sft", "final");
      await fs.mkdir(adapterDir, { recursive: true });
      await fs.mkdir(sftDir, { recursive: true });
      expect(await downloads(page, "#download", adapterDir, 2)).toEqual(["adapter_config.json", "adapter_model.safetensors"]);
      expect(await downloads(page, "#downloadSft", sftDir, 4)).toEqual([
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
      ]);
      expect(JSON.parse(await fs.readFile(path.join(adapterDir, "adapter_config.json"), "utf8")).base_model_name_or_path).toBe(
        "../../sft/final",
      );

      const node = await run(
        "npx",
        ["tsx", "scripts/chat.ts", "--preset", "tiny", "--model_path", adapterDir, "--quantize", "nf4"],
        README_QUESTION + "\n",
      );
      expect(node.code, node.stderr).toBe(0);
      expect(node.stdout).toContain(answer.trim());

      // And back: a fresh page loads the two folders from disk and answers the same.
      const fresh: Page = await browser.newPage();
      try {
        await fresh.goto(`${url}?backend=wasm`);
        await fresh.waitForFunction('document.body.dataset.state === "ready"', null, { timeout: 60_000 });
        const filesOf = async (d: string) => (await fs.readdir(d)).map((f) => path.join(d, f));
        await fresh.setInputFiles("#upload", await filesOf(sftDir));
        await fresh.setInputFiles("#upload", await filesOf(adapterDir));
        await fresh.fill("#chatIn", README_QUESTION);
        await clickAndWait(fresh, "#chatGo", 60_000);
        expect(JSON.parse((await fresh.textContent("#results"))!).chat.answer).toBe(answer);
      } finally {
        await fresh.close();
      }
    } finally {
      await page.close();
      await fs.rm(work, { recursive: true, force: true });
    }
  }, 400_000);

  // WebGPU in headless Chromium here is SwiftShader's, about 100× slower than wasm (an SFT step takes a
  // minute, a GRPO step of the preset's 64 rollouts over ten): the smallest run through every phase,
  // 1 SFT step, 1 GRPO step of 2 questions × 2 rollouts, 2 questions per model, one chat turn.
  it("runs the pipeline hands-free on WebGPU (SwiftShader)", async () => {
    const run = "sft_steps=1&grpo_steps=1&grpo_questions=2&grpo_samples=2&eval_samples=2&chat=" + encodeURIComponent(README_QUESTION);
    checkRun(await autorun(`${run}&backend=webgpu`, 900_000), "webgpu", 2, true);
  }, 960_000);

  it("stops at the next step when Stop is pressed", async () => {
    const page: Page = await browser.newPage();
    try {
      await page.goto(`${url}?autorun=1&backend=wasm&sft_steps=40`);
      await page.waitForFunction('document.body.dataset.state === "sft"', null, { timeout: 60_000 });
      await page.click("#stop");
      await page.waitForFunction(ENDED, null, { timeout: 60_000, polling: 100 });
      expect(await page.evaluate<string>("document.body.dataset.state")).toBe("stopped");
      expect(await page.textContent("#progressText")).not.toContain("sft 40 of 40");
      expect(await page.isEnabled("#runAll")).toBe(true);
    } finally {
      await page.close();
    }
  }, 120_000);

  it("says what failed in one line", async () => {
    const r = await autorun("backend=metal", 60_000);
    expect(r.states.at(-1)).toBe("error: ?backend=metal: expected wasm or webgpu");
  }, 90_000);
});
