/** The page: the tiny preset's pipeline (web/pipeline.ts) with its controls, progress, live charts
 *  (src/report/charts.ts), the latest rollouts as report.html draws them (src/report/transcript.ts),
 *  the evaluation table (src/run/eval-table.ts), a chat box, and downloads of the RL adapter (PEFT) and
 *  the SFT model, which load back from disk. The model and the training run in a Web Worker
 *  (web/worker.ts): the tab stays responsive, and wasm may run threaded.
 *
 *  ?autorun=1 runs everything without clicks (the demo link, and what test/web/ drives): optional
 *  sft_steps, grpo_steps, grpo_questions, grpo_samples, eval_samples, backend (wasm | webgpu; default:
 *  webgpu when the browser offers an adapter, else wasm), threads (wasm; default: the cores, at most
 *  8, when the page is cross-origin isolated), chat (the question asked at the end).
 *  document.body.dataset.state says where it is: loading, ready, sft, grpo, eval, chat, done, stopped,
 *  or "error: <one line>"; <script type="application/json" id="results"> holds the outcome. */
import { lineChartSvg } from "../src/report/charts.ts";
import { CSS } from "../src/report/html.ts";
import { renderTurns, TRANSCRIPT_LEGEND } from "../src/report/transcript.ts";
import type { Trajectory } from "../src/rollout/types.ts";
import type { Settings } from "./pipeline.ts";
import type { Reply, RequestBody, WorkerEvent } from "./protocol.ts";

const PAGE_CSS = `
body{max-width:1100px}.bar{display:flex;gap:8px;flex-wrap:wrap;align-items:center;margin:8px 0}
button{font:inherit;padding:4px 12px;border:1px solid #94a3b8;border-radius:6px;background:#f8fafc;cursor:pointer}
button:disabled{opacity:.45;cursor:default}button.primary{background:#2563eb;color:#fff;border-color:#2563eb}
#status{font-weight:600}#progress{width:320px}.charts{display:flex;flex-wrap:wrap;gap:8px}
pre.table{background:#f8fafc;border:1px solid #e2e8f0;padding:8px;overflow:auto}
#log{max-height:160px;overflow:auto;font:12px/1.35 ui-monospace,monospace;background:#0f172a;color:#e2e8f0;padding:6px;white-space:pre-wrap}
#chatout{min-height:3em}.times td,.times th{padding:2px 10px}`;

const q = new URLSearchParams(location.search);
const intParam = (name: string, def: number) => {
  const v = q.get(name);
  if (v === null) return def;
  if (!/^\d+$/.test(v) || Number(v) < 1) throw new Error(`?${name}=${v}: expected a whole number from 1`);
  return Number(v);
};

const el = <K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Record<string, string> = {}, html = ""): HTMLElementTagNameMap[K] => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  e.innerHTML = html;
  return e;
};
const $ = (id: string) => document.getElementById(id)!;

function setState(s: string): void {
  document.body.dataset.state = s;
  $("status").textContent = s.startsWith("error") ? s : s === "done" ? "done" : s;
}

function layout(): void {
  document.head.append(el("style", {}, CSS + PAGE_CSS));
  document.body.innerHTML = `
<h1>mini-agentic-rl — an agent learns to use its calculator, in this tab</h1>
<p class="sub">The tiny preset's pipeline on TensorFlow.js: SFT warmup → GRPO with the calculator → evaluation with Wilson
intervals → chat. The same src/ modules as the Node scripts (<code>npx tsx scripts/train-sft.ts --preset tiny</code> …).</p>
<div class="bar">backend: <b id="backend">–</b>
<select id="backendSel"><option value="">auto</option><option>wasm</option><option>webgpu</option></select>
<span>status: <span id="status">loading</span></span></div>
<div class="bar"><button id="runAll" class="primary">Run all</button><button id="bSft">1. SFT</button><button id="bGrpo">2. GRPO</button>
<button id="bEval">3. Eval</button><button id="stop" disabled>Stop</button>
SFT steps <input id="sftSteps" type="number" min="1" max="40" style="width:4em">
GRPO steps <input id="grpoSteps" type="number" min="1" max="200" style="width:4em">
eval questions <input id="evalSamples" type="number" min="1" max="500" style="width:5em"></div>
<div class="bar"><progress id="progress" max="1" value="0"></progress> <span id="progressText"></span></div>
<h2>Training</h2><div class="charts" id="charts"></div>
<table class="times" id="times"></table>
<h2>Evaluation</h2><pre class="table" id="evalTable">not run yet</pre>
<h2>Chat</h2><div class="bar">
<input id="chatIn" size="80" value="Ava has 123 pencils and buys 456 more. How many pencils does Ava have now?">
<button id="chatGo">Send</button></div><pre class="table tx" id="chatout"></pre>
<h2>Checkpoints</h2><div class="bar"><button id="download" disabled>Download the RL adapter (PEFT)</button>
<button id="downloadSft" disabled>Download the SFT model</button>
<label>Load a folder's files (an adapter, or the SFT model it was trained on): <input id="upload" type="file" multiple></label></div>
<h2>Latest rollouts</h2>${TRANSCRIPT_LEGEND}<div id="rollouts" class="tx"></div>
<h2>Log</h2><div id="log"></div>
<script type="application/json" id="results">{}</script>`;
}

// ---------------------------------------------------------------- state shown on the page

const series: Record<string, { x: number[]; y: number[] }> = {};
const CHARTS: Array<[string, string]> = [
  ["sft_loss", "SFT loss"],
  ["reward", "GRPO reward"],
  ["accuracy", "GRPO accuracy"],
  ["tool_calls", "calculator calls per rollout"],
];
function point(key: string, x: number, y: number): void {
  (series[key] ??= { x: [], y: [] }).x.push(x);
  series[key].y.push(y);
  $("charts").innerHTML = CHARTS.filter(([k]) => series[k])
    .map(([k, title]) => lineChartSvg(series[k], title))
    .join("");
}

const results: Record<string, unknown> = {};
function publish(): void {
  $("results").textContent = JSON.stringify(results);
  const t = results.seconds as Record<string, number> | undefined;
  if (t)
    $("times").innerHTML = `<tr>${Object.keys(t)
      .map((k) => `<th>${k}</th>`)
      .join("")}</tr><tr>${Object.values(t)
      .map((v) => `<td>${v.toFixed(1)} s</td>`)
      .join("")}</tr>`;
}

function showRollouts(step: number, trajs: Trajectory[]): void {
  const groups = [0, 1].map((p) => trajs.filter((t) => t.promptIndex === p).slice(0, 4));
  $("rollouts").innerHTML =
    `<p class="sub">step ${step}: the first two questions, four rollouts each</p>` +
    groups
      .map((g) =>
        g
          .map(
            (t) =>
              `<div class="ro"><div class="meta"><span class="tag ${t.reward! >= 1 ? "ok" : "bad"}">reward ${t.reward!.toFixed(2)}</span>` +
              `</div>${renderTurns(t.turns, { maxChars: 1500 })}</div>`,
          )
          .join(""),
      )
      .join("");
}

function log(line: string): void {
  const box = $("log");
  box.textContent += line + "\n";
  box.scrollTop = box.scrollHeight;
}

// ---------------------------------------------------------------- the training thread

const worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module" });
const pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
let nextId = 0;

/** Thrown where the user's Stop ended a phase. */
class Stopped extends Error {}

/** Ask the worker; resolves to its answer, or rejects with its one-line error. */
function call<T>(r: RequestBody, transfer: Transferable[] = []): Promise<T> {
  const id = ++nextId;
  return new Promise<T>((resolve, reject) => {
    pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
    worker.postMessage({ ...r, id }, transfer);
  });
}

worker.onmessage = (e: MessageEvent<Reply | WorkerEvent>) => {
  const m = e.data;
  if (m.kind === "reply") {
    const p = pending.get(m.id)!;
    pending.delete(m.id);
    if (m.error === undefined) p.resolve(m.value);
    else {
      if (!m.stopped && m.stack) log(`error: ${m.stack}`);
      p.reject(m.stopped ? new Stopped(m.error) : new Error(m.error));
    }
  } else if (m.kind === "log") log(m.line);
  else if (m.kind === "progress") {
    const p = $("progress") as HTMLProgressElement;
    p.max = m.total;
    p.value = m.done;
    $("progressText").textContent = `${m.phase} ${m.done} of ${m.total}${m.extra ? " · " + m.extra : ""}`;
  } else if (m.kind === "sft") point("sft_loss", m.step, m.loss);
  else if (m.kind === "grpo") {
    for (const k of ["reward", "accuracy", "tool_calls"]) point(k, m.step, m.metrics[k]);
    showRollouts(m.step, m.trajs);
  } else if (m.kind === "chat") $("chatout").textContent += m.text;
};
worker.onerror = (e) => setState(`error: the training thread failed: ${e.message}`);

// ---------------------------------------------------------------- phases

let settings: Settings;
let busy = false;
let held = { sft: false, rl: false }; // what the worker's file store holds
const phaseButtons = ["runAll", "bSft", "bGrpo", "bEval", "chatGo"];

function refreshButtons(): void {
  for (const id of phaseButtons) ($(id) as HTMLButtonElement).disabled = busy;
  ($("bGrpo") as HTMLButtonElement).disabled ||= !held.sft;
  ($("bEval") as HTMLButtonElement).disabled ||= !held.rl;
  ($("chatGo") as HTMLButtonElement).disabled ||= !held.rl;
  ($("download") as HTMLButtonElement).disabled = busy || !held.rl;
  ($("downloadSft") as HTMLButtonElement).disabled = busy || !held.sft;
  ($("stop") as HTMLButtonElement).disabled = !busy;
}

/** The step counts typed in the boxes (a box that does not hold a whole number from 1 keeps its value). */
function readSettings(): void {
  const read = (id: string, old: number) => {
    const n = Number(($(id) as HTMLInputElement).value);
    return Number.isInteger(n) && n >= 1 ? n : old;
  };
  settings.sftSteps = read("sftSteps", settings.sftSteps);
  settings.grpoSteps = read("grpoSteps", settings.grpoSteps);
  settings.evalSamples = read("evalSamples", settings.evalSamples);
}

/** Run phases one after another in the worker; the page's state says which runs, and a failure is
 *  one line. */
async function run(phases: Array<"sft" | "grpo" | "eval" | "chat">): Promise<void> {
  busy = true;
  refreshButtons();
  const seconds = ((results.seconds as Record<string, number>) ??= {});
  const sha256 = ((results.sha256 as Record<string, string>) ??= {}); // to compare with the Node scripts' files
  try {
    for (const phase of phases) {
      setState(phase);
      if (phase === "sft" || phase === "grpo") {
        const r = await call<{ seconds: number; sha256: string; held: typeof held }>({ type: phase, settings });
        seconds[phase] = r.seconds;
        sha256[phase === "sft" ? "sft_model" : "rl_adapter"] = r.sha256;
        held = r.held;
      }
      if (phase === "eval") {
        const r = await call<{ seconds: number; table: string; summary: Array<{ name: string } & Record<string, number>> }>({
          type: "eval",
          settings,
        });
        seconds.eval = r.seconds;
        $("evalTable").textContent = r.table;
        results.eval = Object.fromEntries(r.summary.map(({ name, ...rest }) => [name, rest]));
        results.table = r.table;
      }
      if (phase === "chat") {
        const text = ($("chatIn") as HTMLInputElement).value;
        $("chatout").textContent = `> ${text}\n`;
        const { seconds: s, ...chat } = await call<{ seconds: number; question: string; answer: string; toolCalls: number }>({
          type: "chat",
          settings,
          text,
        });
        results.chat = chat;
        seconds.chat = s;
      }
      publish();
    }
    setState("done");
  } catch (err) {
    setState(err instanceof Stopped ? "stopped" : `error: ${(err as Error).message}`);
  } finally {
    busy = false;
    refreshButtons();
    publish();
  }
}

/** A folder of the worker's file store as downloads, one file each (`only`: the names to offer). */
async function downloadFolder(which: "sft" | "rl", only?: (name: string) => boolean): Promise<void> {
  const files = await call<Record<string, Uint8Array<ArrayBuffer>>>({ type: "files", which });
  for (const [name, bytes] of Object.entries(files)) {
    if (name.includes("/") || (only && !only(name))) continue;
    const a = el("a", { href: URL.createObjectURL(new Blob([bytes])), download: name });
    document.body.append(a);
    a.click();
    a.remove();
  }
}

/** A folder's files, picked from disk: a PEFT adapter (adapter_config.json + adapter_model.safetensors)
 *  becomes the page's RL model, a model folder (config.json + model.safetensors + tokenizer files) its
 *  SFT model. An adapter's base is the path its adapter_config.json names, relative to it: for the
 *  page's own downloads, the page's SFT model. */
async function upload(picked: File[]): Promise<void> {
  const files = await Promise.all(picked.map(async (f) => ({ name: f.name, bytes: new Uint8Array(await f.arrayBuffer()) })));
  try {
    held = (await call<{ held: typeof held }>({ type: "upload", files })).held;
    setState("ready");
  } catch (err) {
    setState(`error: ${(err as Error).message}`);
  }
  refreshButtons();
}

// ---------------------------------------------------------------- start

async function chooseBackend(): Promise<"wasm" | "webgpu"> {
  const asked = q.get("backend");
  if (asked && asked !== "wasm" && asked !== "webgpu") throw new Error(`?backend=${asked}: expected wasm or webgpu`);
  if (asked) return asked as "wasm" | "webgpu";
  const gpu = (navigator as unknown as { gpu?: { requestAdapter(): Promise<unknown> } }).gpu;
  const adapter = gpu ? await gpu.requestAdapter().catch(() => null) : null;
  return adapter ? "webgpu" : "wasm";
}

async function start(): Promise<void> {
  layout();
  settings = {
    backend: await chooseBackend(),
    sftSteps: intParam("sft_steps", 40),
    grpoSteps: intParam("grpo_steps", 24),
    evalSamples: intParam("eval_samples", 200),
    grpoQuestions: q.has("grpo_questions") ? intParam("grpo_questions", 8) : undefined,
    grpoSamples: q.has("grpo_samples") ? intParam("grpo_samples", 8) : undefined,
  };
  ($("sftSteps") as HTMLInputElement).value = String(settings.sftSteps);
  ($("grpoSteps") as HTMLInputElement).value = String(settings.grpoSteps);
  ($("evalSamples") as HTMLInputElement).value = String(settings.evalSamples);
  if (q.get("chat")) ($("chatIn") as HTMLInputElement).value = q.get("chat")!;
  ($("backendSel") as HTMLSelectElement).value = q.get("backend") ?? "";
  $("backendSel").addEventListener("change", (e) => {
    const v = (e.target as HTMLSelectElement).value;
    if (v) q.set("backend", v);
    else q.delete("backend");
    q.delete("autorun");
    location.search = q.toString(); // tfjs picks its backend once per page
  });
  const threadsAsked = q.get("threads");
  const threads = threadsAsked === null || threadsAsked === "auto" ? ("auto" as const) : intParam("threads", 1);
  const t0 = performance.now();
  const r = await call<{ backend: string; threads: number; seconds: number }>({
    type: "start",
    backend: settings.backend,
    threads,
    wasmRoot: new URL("./", location.href).href,
  });
  $("backend").textContent =
    r.backend === "wasm"
      ? `wasm (${r.threads} thread${r.threads > 1 ? "s" : ""}${crossOriginIsolated ? ", cross-origin isolated" : ""})`
      : r.backend;
  results.backend = r.backend;
  results.threads = r.threads;
  results.settings = { ...settings };
  results.load_seconds = (performance.now() - t0) / 1000;
  log(`base loaded and backend ${r.backend} ready in ${(results.load_seconds as number).toFixed(2)} s`);
  const wire = (id: string, f: () => void) => $(id).addEventListener("click", f);
  wire("runAll", () => (readSettings(), void run(["sft", "grpo", "eval", "chat"])));
  wire("bSft", () => (readSettings(), void run(["sft"])));
  wire("bGrpo", () => (readSettings(), void run(["grpo"])));
  wire("bEval", () => (readSettings(), void run(["eval"])));
  wire("chatGo", () => void run(["chat"]));
  wire("stop", () => (worker.postMessage({ type: "stop" }), log("stop asked: stopping at the next step")));
  wire("download", () => void downloadFolder("rl", (name) => name.startsWith("adapter_")));
  wire("downloadSft", () => void downloadFolder("sft"));
  $("upload").addEventListener("change", (e) => void upload(Array.from((e.target as HTMLInputElement).files!)));
  setState("ready");
  refreshButtons();
  publish();
  if (q.get("autorun") === "1") await run(["sft", "grpo", "eval", "chat"]);
}

start().catch((err: Error) => {
  const msg = String(err?.message ?? err).split("\n")[0];
  document.body.dataset.state = `error: ${msg}`;
  const s = document.getElementById("status");
  if (s) s.textContent = `error: ${msg}`;
  console.log(err?.stack ?? msg);
});
