/** What the page (web/main.ts) and its training thread (web/worker.ts) say to each other. */
import type { Trajectory } from "../src/rollout/types.ts";
import type { Settings } from "./pipeline.ts";

/** Page → worker: each sent with an id and answered by a Reply with the same id. ("stop" has no id
 *  and no answer.) */
export type RequestBody =
  | { type: "start"; backend: "wasm" | "webgpu"; threads: number | "auto"; wasmRoot: string }
  | { type: "sft" | "grpo" | "eval"; settings: Settings }
  | { type: "chat"; settings: Settings; text: string }
  | { type: "files"; which: "sft" | "rl" }
  | { type: "upload"; files: Array<{ name: string; bytes: Uint8Array }> };
export type Request = RequestBody & { id: number };

export type Reply = { kind: "reply"; id: number; value?: unknown; error?: string; stopped?: boolean; stack?: string };

/** Worker → page, as they happen. */
export type WorkerEvent =
  | { kind: "log"; line: string }
  | { kind: "progress"; phase: string; done: number; total: number; extra?: string }
  | { kind: "sft"; step: number; loss: number }
  | { kind: "grpo"; step: number; metrics: Record<string, number>; trajs: Trajectory[] }
  | { kind: "chat"; text: string };
