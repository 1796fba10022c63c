/** A report page as a PNG, drawn by a headless Chromium (Debian: `apt-get install chromium`), for the
 *  README and for checking a page by eye. Nothing else in the project needs a browser: the report
 *  tests read the HTML. Chromium runs with a fresh empty profile and no network features, and is
 *  stopped after `timeoutMs`. */
import { spawn } from "node:child_process";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { pathToFileURL } from "node:url";

export const CHROMIUM_NAMES = ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"];

/** The first browser binary on PATH (or the given one), or an error saying how to get one. */
export async function findChromium(given?: string): Promise<string> {
  if (given) return given;
  for (const dir of (process.env.PATH ?? "").split(path.delimiter)) {
    for (const name of CHROMIUM_NAMES) {
      const p = path.join(dir, name);
      if (
        await fs.access(p, fs.constants?.X_OK ?? 1).then(
          () => true,
          () => false,
        )
      )
        return p;
    }
  }
  throw new Error(
    `no Chromium found on PATH (looked for ${CHROMIUM_NAMES.join(", ")}); on Debian: apt-get install chromium, or pass --chromium <path>`,
  );
}

export interface ScreenshotOptions {
  chromium: string;
  width: number;
  height: number;
  timeoutMs?: number;
}

/** Draw `htmlFile` into `pngFile`, a `width`×`height` window; with `fragment`, from the element
 *  with that id on (below the page title). */
export async function screenshot(htmlFile: string, pngFile: string, o: ScreenshotOptions, fragment = ""): Promise<void> {
  const profile = await fs.mkdtemp(path.join(os.tmpdir(), "marl-chromium-"));
  let page = path.resolve(htmlFile);
  if (fragment) {
    // Headless Chromium draws the top of a page whatever the #fragment; so a copy of the page shows
    // only its title and everything from the element with that id on.
    if (!/^[\w-]+$/.test(fragment)) throw new Error(`#${fragment}: expected an element id (letters, digits, - and _)`);
    const html = await fs.readFile(page, "utf8");
    if (!html.includes(` id="${fragment}"`)) throw new Error(`${htmlFile} has no element with id="${fragment}"`);
    const css = `<style>body>*{display:none!important}body>h1,body>h1+p,#${fragment},#${fragment}~*{display:revert!important}</style>`;
    page = path.join(profile, "page.html");
    await fs.writeFile(page, html.replace("</head>", `${css}</head>`));
  }
  const url = pathToFileURL(page).href;
  const out = path.resolve(pngFile);
  await fs.mkdir(path.dirname(out), { recursive: true });
  await fs.rm(out, { force: true });
  const args = [
    "--headless",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
    `--user-data-dir=${profile}`,
    `--window-size=${o.width},${o.height}`,
    `--screenshot=${out}`,
    url,
  ];
  // Chromium's sandbox refuses to start as root (containers, CI); it is only reading our own file.
  if (process.getuid?.() === 0) args.unshift("--no-sandbox");
  try {
    const log: string[] = [];
    const code = await new Promise<number | null>((resolve, reject) => {
      const child = spawn(o.chromium, args, { stdio: ["ignore", "pipe", "pipe"] });
      const timer = setTimeout(() => child.kill("SIGKILL"), o.timeoutMs ?? 60_000);
      child.stdout.on("data", (d) => log.push(String(d)));
      child.stderr.on("data", (d) => log.push(String(d)));
      child.on("error", (err) => (clearTimeout(timer), reject(new Error(`${o.chromium}: ${err.message}`))));
      child.on("close", (c) => (clearTimeout(timer), resolve(c)));
    });
    const made = await fs.stat(out).then(
      (s) => s.size > 0,
      () => false,
    );
    if (code !== 0 || !made)
      throw new Error(`${o.chromium} exited ${code} without writing ${out}: ${log.join("").trim().split("\n").slice(-3).join(" | ")}`);
  } finally {
    await fs.rm(profile, { recursive: true, force: true });
  }
}
