/** npm run web: build the page (web/) with esbuild for the browser and serve it on 127.0.0.1 with the
 *  headers a cross-origin-isolated page needs (COOP same-origin, COEP require-corp: SharedArrayBuffer,
 *  wasm threads). The page imports src/ as the scripts do; what only Node has is mapped here, at the
 *  edge, to the page's adapters (web/node/ for Node's built-ins, web/adapters/ for src/ modules and
 *  packages that reach Node or the network): every `node:` import the bundle meets must have one, or
 *  the build fails naming the importer. The built page is outputs/web/ (index.html, app.js, the
 *  calculator's worker, tfjs' .wasm files and the tiny preset's base as static files).
 *
 *    npx tsx scripts/web.ts [--port 8080] [--host 127.0.0.1] [--build_only] [--out outputs/web]
 */
import { promises as fs } from "node:fs";
import * as http from "node:http";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { Command } from "commander";
import * as esbuild from "esbuild";
import { parseIntArg, runMain } from "../src/run/cli.ts";
import { parseWithPreset } from "../src/run/options.ts";
import { closeOnSignal } from "../src/run/shutdown.ts";
import { UsageError } from "../src/util/errors.ts";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const at = (...p: string[]) => path.join(ROOT, ...p);

/** Node's built-ins that src/ modules the page reaches import, and the page's adapter for each. */
export const NODE_ADAPTERS: Record<string, string> = {
  fs: "web/node/fs.ts",
  path: "web/node/path.ts",
  url: "web/node/url.ts",
  os: "web/node/os.ts",
  module: "web/node/module.ts",
  v8: "web/node/v8.ts",
  vm: "web/node/vm.ts",
  worker_threads: "web/node/worker_threads.ts",
  child_process: "web/node/child_process.ts",
  readline: "web/node/readline.ts",
  http: "web/node/http.ts",
  https: "web/node/http.ts",
  crypto: "web/node/crypto.ts",
};

/** src/ modules and packages replaced in the page (Node-only at their core), and by what. */
export const MODULE_ADAPTERS: Record<string, string> = {
  "src/kernels/wasm/threads.ts": "web/adapters/threads.ts",
  "src/agents/sandbox.ts": "web/adapters/sandbox.ts",
  "@huggingface/hub": "web/adapters/hf-hub.ts",
  commander: "web/adapters/commander.ts",
  "cli-progress": "web/adapters/cli-progress.ts",
  "node-llama-cpp": "web/adapters/node-llama-cpp.ts",
  webgpu: "web/adapters/dawn.ts",
  hyparquet: "web/adapters/hyparquet.ts",
};

/** Node's globals that src/ uses, given to src/ modules only (web/node/globals.ts). */
const GLOBALS = "web/node/globals.ts";
const NODE_GLOBALS = ["process", "Buffer", "setImmediate"];

/** Bare built-in names that packages import behind their own Node checks (Emscripten's glue in
 *  tfjs-backend-wasm, seedrandom): an empty module in the page, as their package.json "browser" maps say. */
const PACKAGE_BUILTINS = new Set(["fs", "path", "os", "crypto", "worker_threads", "perf_hooks", "url", "module", "util"]);

export function adaptersPlugin(): esbuild.Plugin {
  return {
    name: "web-adapters",
    setup(b) {
      b.onResolve({ filter: /^node:/ }, (a) => {
        const name = a.path.slice("node:".length);
        const to = NODE_ADAPTERS[name];
        if (!to)
          return {
            errors: [{ text: `${a.path} imported by ${path.relative(ROOT, a.importer)}: the page has no adapter for it (scripts/web.ts)` }],
          };
        return { path: at(to) };
      });
      b.onResolve({ filter: /.*/ }, (a) => {
        if (a.importer.includes(`${path.sep}node_modules${path.sep}`) && PACKAGE_BUILTINS.has(a.path))
          return { path: a.path, namespace: "empty" };
        // An adapter that wraps its package (hyparquet) imports the package itself.
        if (MODULE_ADAPTERS[a.path] && a.importer !== at(MODULE_ADAPTERS[a.path])) return { path: at(MODULE_ADAPTERS[a.path]) };
        if (
          a.path.startsWith(".") &&
          a.importer.startsWith(ROOT + path.sep) &&
          !a.importer.includes(`${path.sep}node_modules${path.sep}`)
        ) {
          const rel = path.relative(ROOT, path.resolve(path.dirname(a.importer), a.path));
          if (MODULE_ADAPTERS[rel]) return { path: at(MODULE_ADAPTERS[rel]) };
        }
        return undefined;
      });
      b.onLoad({ filter: /.*/, namespace: "empty" }, () => ({ contents: "export default {};", loader: "js" }));
      // Node's globals, for src/ only: a package that sees a global `process` takes the page for Node.
      b.onLoad({ filter: /\.ts$/ }, async (a) => {
        if (!a.path.startsWith(at("src") + path.sep)) return undefined;
        const text = await fs.readFile(a.path, "utf8");
        const used = NODE_GLOBALS.filter((g) => new RegExp(`\\b${g}\\b`).test(text));
        if (used.length === 0) return undefined;
        return { contents: `import { ${used.join(", ")} } from ${JSON.stringify(at(GLOBALS))};\n${text}`, loader: "ts" };
      });
    },
  };
}

export interface BuildResult {
  outDir: string;
  bytes: Record<string, number>;
}

/** Build the page into outDir: the two bundles, index.html, tfjs' .wasm files, the tiny base. */
export async function buildWeb(outDir = at("outputs", "web"), opts: { minify?: boolean } = {}): Promise<BuildResult> {
  // Only an earlier build (or nothing) is replaced: --out never empties a folder of other files.
  const held = await fs.readdir(outDir).catch(() => [] as string[]);
  if (held.length > 0 && !(held.includes("index.html") && held.includes("app.js")))
    throw new UsageError(`--out ${outDir} holds other files (${held.slice(0, 3).join(", ")}…); pick an empty folder or a build`);
  await fs.rm(outDir, { recursive: true, force: true });
  await fs.mkdir(outDir, { recursive: true });
  const common: esbuild.BuildOptions = {
    bundle: true,
    platform: "browser",
    format: "esm",
    target: "es2022",
    minify: opts.minify ?? true,
    sourcemap: false,
    legalComments: "none",
    logLevel: "silent",
    plugins: [adaptersPlugin()],
    define: { global: "globalThis" },
    metafile: true,
  };
  const builds = [
    { in: "web/main.ts", out: "app.js" },
    // The wasm heap module sends its job functions' source text to its helper threads
    // (Function.toString, src/kernels/wasm/heap.ts): their names must survive as written.
    { in: "web/worker.ts", out: "worker.js", minifyIdentifiers: false },
    { in: "web/calculator-worker.ts", out: "calculator-worker.mjs" },
  ];
  for (const e of builds) {
    const r = await esbuild.build({
      ...common,
      ...(e.minifyIdentifiers === false ? { minifyIdentifiers: false, minifySyntax: true, minifyWhitespace: true, minify: false } : {}),
      entryPoints: [at(e.in)],
      outfile: path.join(outDir, e.out),
    });
    const leaked = Object.values(r.metafile!.outputs)
      .flatMap((o) => o.imports)
      .filter((i) => i.path.startsWith("node:"));
    if (leaked.length) throw new Error(`web build: ${e.out} still imports ${leaked.map((i) => i.path).join(", ")}`);
  }
  await fs.copyFile(at("web/index.html"), path.join(outDir, "index.html"));
  const wasmDir = at("node_modules/@tensorflow/tfjs-backend-wasm/dist");
  for (const f of await fs.readdir(wasmDir)) if (f.endsWith(".wasm")) await fs.copyFile(path.join(wasmDir, f), path.join(outDir, f));
  await fs.cp(at("src/presets/tiny"), path.join(outDir, "tiny"), { recursive: true });
  const bytes: Record<string, number> = {};
  for (const f of await fs.readdir(outDir)) {
    const s = await fs.stat(path.join(outDir, f));
    if (s.isFile()) bytes[f] = s.size;
  }
  return { outDir, bytes };
}

const TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".mjs": "text/javascript; charset=utf-8",
  ".wasm": "application/wasm",
  ".json": "application/json",
  ".safetensors": "application/octet-stream",
  ".md": "text/plain; charset=utf-8",
  ".png": "image/png",
};

/** A static server for outDir on host:port, cross-origin isolated. Resolves once listening. */
export function serveWeb(outDir: string, port: number, host = "127.0.0.1"): Promise<http.Server> {
  const server = http.createServer(async (req, res) => {
    const headers = {
      "Cross-Origin-Opener-Policy": "same-origin",
      "Cross-Origin-Embedder-Policy": "require-corp",
      "Cross-Origin-Resource-Policy": "same-origin",
      "Cache-Control": "no-cache",
    };
    const urlPath = decodeURIComponent(new URL(req.url ?? "/", "http://x").pathname);
    const file = path.join(outDir, path.normalize(urlPath === "/" ? "/index.html" : urlPath));
    if (!file.startsWith(outDir + path.sep) || (req.method !== "GET" && req.method !== "HEAD")) {
      res.writeHead(404, headers).end("not found");
      return;
    }
    try {
      const body = await fs.readFile(file);
      res.writeHead(200, {
        ...headers,
        "Content-Type": TYPES[path.extname(file)] ?? "application/octet-stream",
        "Content-Length": body.length,
      });
      res.end(req.method === "HEAD" ? undefined : body);
    } catch {
      res.writeHead(404, headers).end("not found");
    }
  });
  return new Promise((resolve, reject) => {
    server.once("error", (err: NodeJS.ErrnoException) =>
      reject(err.code === "EADDRINUSE" ? new UsageError(`--port ${port}: ${host}:${port} is in use; pick another --port`) : err),
    );
    server.listen(port, host, () => resolve(server));
  });
}

async function main(): Promise<void> {
  const program = new Command()
    .name("web")
    .description("Build the page (web/) and serve it: the tiny pipeline (SFT, GRPO, eval, chat) in a browser tab")
    .option("--port <n>", "port to serve on (0: any free port)", parseIntArg("port", 0, 65535), 8080)
    .option("--host <host>", "address to listen on", "127.0.0.1")
    .option("--out <dir>", "where the built page goes (an empty folder or an earlier build)", at("outputs", "web"))
    .option("--build_only", "build the page and exit", false)
    .exitOverride()
    .configureOutput({ outputError: () => {} });
  const { o } = parseWithPreset(program, process.argv, {}); // commander errors → one-line usage error, --help exits 0
  const t0 = Date.now();
  const built = await buildWeb(path.resolve(o.out));
  const mb = (n: number) => (n / 2 ** 20).toFixed(2);
  const log = (line: string) => process.stderr.write(line + "\n");
  log(
    `built ${path.relative(process.cwd(), built.outDir) || "."} in ${((Date.now() - t0) / 1000).toFixed(1)} s ` +
      `(app.js ${mb(built.bytes["app.js"])} MB, worker.js ${mb(built.bytes["worker.js"])} MB, ` +
      `calculator-worker.mjs ${mb(built.bytes["calculator-worker.mjs"])} MB)`,
  );
  if (o.build_only) return;
  const server = await serveWeb(built.outDir, o.port, o.host);
  process.stdout.write(`http://${o.host}:${(server.address() as { port: number }).port}/\n`);
  log("serving; Ctrl-C stops");
  closeOnSignal({ close: () => new Promise<void>((resolve) => (server.closeAllConnections(), server.close(() => resolve()))) }, log);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) await runMain(main);
