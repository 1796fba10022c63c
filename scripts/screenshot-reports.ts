/** Each report page as a PNG, drawn by headless Chromium (Debian: apt-get install chromium):
 *    npx tsx scripts/screenshot-reports.ts outputs/tiny/sft outputs/tiny/grpo outputs/tiny/eval --out_dir docs/images
 *  A run folder means its report.html; `page.html#id` starts the picture at that part of the page
 *  (e.g. report.html#rollouts). The PNG is named after the folder (sft.png, grpo.png, ...). */
import * as path from "node:path";
import { Command } from "commander";
import { parseIntArg, runMain } from "../src/run/cli.ts";
import { parseWithPreset } from "../src/run/options.ts";
import { findChromium, screenshot } from "../src/report/screenshot.ts";

const program = new Command()
  .name("screenshot-reports")
  .description("Draw report pages to PNG files with headless Chromium")
  .argument("<page...>", "run folders (their report.html) or .html files, each optionally with #fragment")
  .option("--out_dir <dir>", "where the PNGs go", "outputs/screenshots")
  .option("--width <px>", "window width", parseIntArg("width", 320), 1280)
  .option("--height <px>", "window height (the picture's height)", parseIntArg("height", 200), 1600)
  .option("--chromium <path>", "browser binary (default: chromium, chromium-browser or google-chrome on PATH)")
  .exitOverride()
  .configureOutput({ outputError: () => {} });

await runMain(async () => {
  parseWithPreset(program, process.argv, {}); // commander errors → one-line usage error, --help exits 0
  const o = program.opts<{ out_dir: string; width: number; height: number; chromium?: string }>();
  const chromium = await findChromium(o.chromium);
  for (const arg of program.args) {
    const [target, fragment = ""] = arg.split("#");
    const html = target.endsWith(".html") ? target : path.join(target, "report.html");
    const name = target.endsWith(".html") ? path.basename(target, ".html") : path.basename(path.resolve(target));
    const png = path.join(o.out_dir, `${name}${fragment ? "-" + fragment : ""}.png`);
    await screenshot(html, png, { chromium, width: o.width, height: o.height }, fragment);
    process.stdout.write(`${png}\n`);
  }
});
