/** Step metrics: `metrics.jsonl` (one JSON object per line, `{step, time, ...}`, appended and flushed
 *  per line so a crash loses at most the line being written), the one-line console summary with the
 *  same fields every step, tensor/process memory, and mean ± std. Charts live in report.ts. */
import * as fsSync from "node:fs";
import * as tf from "@tensorflow/tfjs";
import { openStepLog, parseStepLines } from "../util/jsonl.ts";
import { mean } from "./stats.ts";

/** Metric names shared by the trainers, the step line and the report (snake_case, like TRL's logs). */
export const METRIC = {
  reward: "reward",
  rewardStd: "reward_std",
  accuracy: "accuracy",
  kl: "kl",
  clipRatio: "clip_ratio",
  completionLen: "completion_len",
  toolCalls: "tool_calls",
  loss: "loss",
  lr: "lr",
  gradNorm: "grad_norm",
  entropy: "entropy",
  stepTime: "step_time",
  evalAccuracy: "eval_accuracy",
  tensors: "tensors",
} as const;

export type MetricValue = number | string | boolean | null;
export type Metrics = Record<string, MetricValue>;
export interface MetricsRecord extends Metrics {
  step: number;
  /** Seconds since the Unix epoch. */
  time: number;
}

/** Population mean and standard deviation (divide by n). NaN for an empty list, which logs as null. */
export function meanStd(values: readonly number[]): { mean: number; std: number } {
  const n = values.length;
  if (n === 0) return { mean: NaN, std: NaN };
  const m = mean(values);
  const variance = values.reduce((a, v) => a + (v - m) ** 2, 0) / n;
  return { mean: m, std: Math.sqrt(variance) };
}

/** Appends one line per `log` call to a JSONL file. With `resumeStep`, lines for steps after it are
 *  dropped first: those steps will be run again, and their curves must not appear twice. */
export class MetricsLogger {
  constructor(
    readonly file: string,
    opts: { resumeStep?: number } = {},
  ) {
    openStepLog(file, opts);
  }

  /** Write `{step, time, ...metrics}`. Non-finite numbers are written as null (JSON has no NaN). */
  log(step: number, metrics: Metrics): MetricsRecord {
    if (!Number.isInteger(step) || step < 0) throw new RangeError(`metrics step ${step}: expected a whole number >= 0`);
    const record: MetricsRecord = { step, time: Math.round(Date.now()) / 1000, ...metrics };
    record.step = step;
    // appendFileSync opens, writes and closes: the line is in the file before the next step starts.
    fsSync.appendFileSync(this.file, JSON.stringify(record) + "\n");
    return record;
  }
}

function parseLines(text: string, file: string): MetricsRecord[] {
  return parseStepLines(text, file).map((l) => l.record as MetricsRecord);
}

/** All records of a metrics.jsonl file in file order. */
export async function readMetrics(file: string): Promise<MetricsRecord[]> {
  const text = await fsSync.promises.readFile(file, "utf8").catch(() => {
    throw new Error(`${file} not found: expected a metrics.jsonl written by a training run`);
  });
  return parseLines(text, file);
}

// ---------------------------------------------------------------- the step line

export interface FieldSpec {
  /** Metric key to show. */
  key: string;
  /** Text before the value; defaults to the key. */
  label?: string;
  /** Key of a spread shown as value±spread. */
  stdKey?: string;
  /** Significant digits (default 2). */
  digits?: number;
  /** Text after the value, e.g. " s". */
  unit?: string;
}

export const GRPO_LINE: FieldSpec[] = [
  { key: METRIC.reward, label: "reward", stdKey: METRIC.rewardStd },
  { key: METRIC.accuracy, label: "acc" },
  { key: METRIC.kl, label: "kl" },
  { key: METRIC.clipRatio, label: "clip" },
  { key: METRIC.completionLen, label: "len" },
  { key: METRIC.toolCalls, label: "tools" },
  { key: METRIC.stepTime, label: "", unit: " s" },
];

export const SFT_LINE: FieldSpec[] = [
  { key: METRIC.loss, label: "loss", digits: 3 },
  { key: METRIC.lr, label: "lr" },
  { key: METRIC.gradNorm, label: "grad" },
  { key: METRIC.stepTime, label: "", unit: " s" },
];

/** Compact number: integers above 100 as integers, tiny values in exponent form, else `digits`
 *  significant digits with trailing zeros dropped. 143.2 → "143", 0.00412 → "0.0041", 3e-5 → "3e-5". */
export function formatNumber(x: number, digits = 2): string {
  if (!Number.isFinite(x)) return Number.isNaN(x) ? "nan" : x > 0 ? "inf" : "-inf";
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 100) return String(Math.round(x));
  if (a < 1e-3) {
    const [m, e] = x.toExponential(digits - 1).split("e");
    return `${m.includes(".") ? m.replace(/\.?0+$/, "") : m}e${Number(e)}`;
  }
  const r = Number(x.toPrecision(digits)); // may round up past 100 (99.96 → 100)
  return Math.abs(r) >= 100 ? String(Math.round(r)) : String(r);
}

function show(v: MetricValue | undefined, digits: number): string {
  if (v === undefined || v === null) return "-";
  return typeof v === "number" ? formatNumber(v, digits) : String(v);
}

/** `step 12/200 | reward 0.41±0.38 | acc 0.38 | ... | 9.8 s`: every field of the spec every time,
 *  "-" when a value is missing, so lines stay aligned and grep-able. */
export function formatStepLine(step: number, total: number, m: Metrics, spec: readonly FieldSpec[] = GRPO_LINE): string {
  const parts = [`step ${step}/${total}`];
  for (const f of spec) {
    const digits = f.digits ?? 2;
    let value = show(m[f.key], digits);
    if (f.stdKey && value !== "-" && typeof m[f.stdKey] === "number") value += `±${show(m[f.stdKey], digits)}`;
    const label = f.label ?? f.key;
    parts.push(`${label ? label + " " : ""}${value}${f.unit ?? ""}`);
  }
  return parts.join(" | ");
}

// ---------------------------------------------------------------- memory

export interface MemoryStats {
  /** Live tfjs tensors: growing across steps means a leak. */
  tensors: number;
  tensorBytes: number;
  rssBytes: number;
  heapBytes: number;
  /** Memory of C++ objects bound to JS (array buffers included), outside the JS heap. */
  externalBytes: number;
  /** Backing stores of ArrayBuffers (typed arrays read back from tensors, file buffers). */
  arrayBufferBytes: number;
  /** Size of the wasm backend's linear memory (it grows, never shrinks; 0 on other backends). */
  wasmBytes: number;
}

export function memoryStats(): MemoryStats {
  const m = tf.memory();
  const p = process.memoryUsage();
  const wasm = (tf.engine().backend as { wasm?: { HEAPU8?: Uint8Array } }).wasm?.HEAPU8?.length ?? 0;
  return {
    tensors: m.numTensors,
    tensorBytes: m.numBytes,
    rssBytes: p.rss,
    heapBytes: p.heapUsed,
    externalBytes: p.external,
    arrayBufferBytes: p.arrayBuffers,
    wasmBytes: wasm,
  };
}

/** memoryStats as step-metric fields: RSS split into the JS heap and the wasm heap, to tell a leak's kind. */
export function memoryFields(): Record<string, number> {
  const m = memoryStats();
  return {
    tensors: m.tensors,
    tensor_bytes: m.tensorBytes,
    rss_bytes: m.rssBytes,
    heap_bytes: m.heapBytes,
    external_bytes: m.externalBytes,
    array_buffer_bytes: m.arrayBufferBytes,
    wasm_bytes: m.wasmBytes,
  };
}
