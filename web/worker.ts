/** The page's training thread: a dedicated Web Worker that holds the model, the file store and the
 *  backend, and runs web/pipeline.ts's phases when the page (web/main.ts) asks. In a worker the tab
 *  never freezes, and the wasm kernels may block on Atomics.wait, which their helper threads need
 *  (src/kernels/wasm/heap.ts): wasm runs threaded when the page is cross-origin isolated.
 *
 *  Protocol (web/protocol.ts): the page sends requests with an id, the worker answers each with the
 *  same id (a value, or an error line), and posts events (log lines, progress, step metrics, chat
 *  text) as they happen. A "stop" request is read between steps. */
import { setWasmPaths } from "@tensorflow/tfjs-backend-wasm";
import * as tf from "@tensorflow/tfjs";
import { initBackend } from "../src/kernels/backend.ts";
import { wasmThreads } from "../src/kernels/wasm/threads.ts";
import { existsSync, filesUnder, putFile, readFileSync, rmSync } from "./node/fs.ts";
import { setLogSink } from "./node/process.ts";
import { fetchBase, GRPO_DIR, openChat, runEvalPhase, runGrpoPhase, runSftPhase, SFT_DIR, Stopped, type Events } from "./pipeline.ts";
import type { Reply, Request, WorkerEvent } from "./protocol.ts";

const post = (m: Reply | WorkerEvent, transfer: Transferable[] = []) => (self as unknown as Worker).postMessage(m, transfer);
const log = (line: string) => post({ kind: "log", line });

let stopAsked = false;
const events: Events = {
  log,
  progress: (phase, done, total, extra) => post({ kind: "progress", phase, done, total, extra }),
  sftStep: (step, m) => post({ kind: "sft", step, loss: m.loss }),
  grpoStep: (step, m, trajs) => post({ kind: "grpo", step, metrics: m, trajs }),
  stopped: () => stopAsked,
};

/** A file's SHA-256 in hex (what `sha256sum` prints for the Node scripts' output). */
async function fileSha256(file: string): Promise<string> {
  const bytes = readFileSync(file) as Uint8Array<ArrayBuffer>;
  return [...new Uint8Array(await crypto.subtle.digest("SHA-256", bytes))].map((b) => b.toString(16).padStart(2, "0")).join("");
}

const held = () => ({ sft: existsSync(SFT_DIR), rl: existsSync(GRPO_DIR) });

async function handle(r: Request): Promise<unknown> {
  switch (r.type) {
    case "start": {
      setWasmPaths(r.wasmRoot);
      const t0 = performance.now();
      await fetchBase(r.wasmRoot + "tiny/");
      const backend = await initBackend(r.backend, { threads: r.threads });
      return { backend, threads: wasmThreads(), seconds: (performance.now() - t0) / 1000, tensors: tf.memory().numTensors };
    }
    case "sft":
      stopAsked = false;
      return { seconds: await runSftPhase(r.settings, events), sha256: await fileSha256(`${SFT_DIR}/model.safetensors`), held: held() };
    case "grpo":
      stopAsked = false;
      return {
        seconds: await runGrpoPhase(r.settings, events),
        sha256: await fileSha256(`${GRPO_DIR}/adapter_model.safetensors`),
        held: held(),
      };
    case "eval": {
      stopAsked = false;
      const e = await runEvalPhase(r.settings, events);
      const summary = e.results.map(({ name, result }) => ({
        name,
        strict: result.strict.value,
        lo: result.strict.lo,
        hi: result.strict.hi,
        n: result.n,
        tools_per_rollout: result.toolCallsPerRollout,
      }));
      return { seconds: e.seconds, table: e.table, summary };
    }
    case "chat": {
      const t0 = performance.now();
      const c = await openChat(r.settings);
      try {
        let answer = "";
        const traj = await c.session.send(r.text, (s) => {
          answer += s;
          post({ kind: "chat", text: s });
        });
        const toolCalls = traj.turns.reduce((n, t) => n + (t.toolCalls?.length ?? 0), 0);
        return { question: r.text, answer, toolCalls, seconds: (performance.now() - t0) / 1000 };
      } finally {
        await c.close();
      }
    }
    case "files":
      return Object.fromEntries(filesUnder(r.which === "rl" ? GRPO_DIR : SFT_DIR));
    case "upload": {
      const names = r.files.map((f) => f.name);
      const dir = names.includes("adapter_config.json") ? GRPO_DIR : names.includes("config.json") ? SFT_DIR : null;
      if (dir === null)
        throw new Error(
          `${names.join(", ")}: expected an adapter folder's files (adapter_config.json, ...) or a model folder's (config.json, ...)`,
        );
      rmSync(dir, { recursive: true, force: true });
      for (const f of r.files) putFile(`${dir}/${f.name}`, f.bytes);
      log(`loaded ${names.join(", ")} as the ${dir === GRPO_DIR ? "RL adapter" : "SFT model"}`);
      return { held: held() };
    }
  }
}

setLogSink(log);
self.onmessage = (e: MessageEvent<Request | { type: "stop" }>) => {
  const r = e.data;
  if (r.type === "stop") {
    stopAsked = true;
    return;
  }
  handle(r).then(
    (value) => post({ kind: "reply", id: r.id, value }),
    (err: Error) =>
      post({
        kind: "reply",
        id: r.id,
        error: err instanceof Stopped ? "stopped" : String(err?.message ?? err).split("\n")[0],
        stopped: err instanceof Stopped,
        stack: err?.stack,
      }),
  );
};
