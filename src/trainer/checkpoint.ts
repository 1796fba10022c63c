/** Training checkpoints and resume. A checkpoint is a folder `checkpoint-<step>/` holding
 *    - the model part, written by the caller's `saveModel(dir)` (a PEFT adapter or a full HF folder),
 *    - `optimizer.safetensors`: the optimizer's state as named F32 tensors,
 *    - `trainer_state.json`: step, epoch, RNG states, data position, config hash, best metric,
 *      the tail of the log history (Hugging Face Trainer names where they exist).
 *  The folder is filled under a temp name and renamed into place, then the `latest` pointer file is
 *  replaced atomically, so a crash at any moment leaves the previous checkpoint usable.
 *  Loading the model part is left to the caller; this file finds and checks the folder. */
import { createHash } from "node:crypto";
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { BadFileError, UsageError } from "../util/errors.ts";
import { readSafetensorsAll, SafetensorsFile, writeSafetensors } from "../model/safetensors.ts";
import { exists, isDir, writeDirAtomic, writeFileAtomic } from "../util/fs.ts";

/** Named F32 tensors as exported by the optimizer (e.g. `m/<var>`, `v/<var>`). */
export type OptimizerState = Record<string, { shape: number[]; data: Float32Array }>;

export interface TrainerState {
  /** Optimizer steps completed. */
  global_step: number;
  epoch: number;
  /** Position in the data order (examples consumed in the current epoch). */
  data_position: number;
  config_hash: string;
  /** A summary of the resolved config, for humans and for `configDiff` on resume. */
  config?: Record<string, unknown>;
  /** Last entries of metrics.jsonl (kept short: the full history is in the run folder). */
  log_history: Record<string, unknown>[];
  /** Anything else a trainer needs back on resume. */
  extra?: Record<string, unknown>;
}

/** How safetensors files are written and read; swappable so tests can fail a write on purpose. */
export interface SafetensorsIo {
  write(file: string, tensors: OptimizerState): Promise<void>;
  read(file: string): Promise<OptimizerState>;
}
const defaultIo: SafetensorsIo = { write: (f, t) => writeSafetensors(f, t), read: (f) => readSafetensorsAll(f) };

export const TRAINER_STATE_FILE = "trainer_state.json";
export const OPTIMIZER_FILE = "optimizer.safetensors";
export const LATEST_FILE = "latest";
const LOG_HISTORY_TAIL = 100;
const CHECKPOINT_RE = /^checkpoint-(\d+)$/;

export interface SaveOptions {
  /** Writes the model part into the given (temporary) folder. */
  saveModel: (dir: string) => Promise<void>;
  state: TrainerState;
  optimizerState?: OptimizerState;
  /** Keep only the newest K checkpoints (undefined or 0: keep all). */
  saveTotalLimit?: number;
  io?: SafetensorsIo;
}

/** Write `runDir/checkpoint-<global_step>/`, point `latest` at it, prune to the limit. Returns its path. */
export async function saveCheckpoint(runDir: string, opts: SaveOptions): Promise<string> {
  const { state } = opts;
  validateState(state, "trainer state to save");
  const io = opts.io ?? defaultIo;
  const name = `checkpoint-${state.global_step}`;
  const dir = path.join(runDir, name);
  const saved: TrainerState = { ...state, log_history: state.log_history.slice(-LOG_HISTORY_TAIL) };
  await writeDirAtomic(dir, async (tmp) => {
    await opts.saveModel(tmp);
    if (opts.optimizerState) await io.write(path.join(tmp, OPTIMIZER_FILE), opts.optimizerState);
    await fs.writeFile(path.join(tmp, TRAINER_STATE_FILE), JSON.stringify(saved, null, 2) + "\n");
  });
  await writeFileAtomic(path.join(runDir, LATEST_FILE), name + "\n");
  if (opts.saveTotalLimit) await pruneCheckpoints(runDir, opts.saveTotalLimit, name);
  return dir;
}

/** Checkpoint folders of a run, oldest first. Temp folders of unfinished writes are not listed. */
export async function listCheckpoints(runDir: string): Promise<Array<{ step: number; dir: string }>> {
  const names = await fs.readdir(runDir).catch(() => [] as string[]);
  const out: Array<{ step: number; dir: string }> = [];
  for (const n of names) {
    const m = CHECKPOINT_RE.exec(n);
    if (m && (await isDir(path.join(runDir, n)))) out.push({ step: Number(m[1]), dir: path.join(runDir, n) });
  }
  return out.sort((a, b) => a.step - b.step);
}

/** Remove all but the newest `keep` checkpoints (never `protect`), and temp folders that a crashed
 *  write left behind. */
export async function pruneCheckpoints(runDir: string, keep: number, protect?: string): Promise<string[]> {
  if (!Number.isInteger(keep) || keep < 1) throw new RangeError(`save_total_limit ${keep}: expected a whole number >= 1`);
  const all = await listCheckpoints(runDir);
  const removed: string[] = [];
  for (const c of all.slice(0, Math.max(0, all.length - keep))) {
    if (path.basename(c.dir) === protect) continue;
    await fs.rm(c.dir, { recursive: true, force: true });
    removed.push(c.dir);
  }
  for (const n of await fs.readdir(runDir)) {
    const m = /^\.(checkpoint-\d+)\.[\d.]+\.(tmp|old)$/.exec(n);
    // An .old folder is the only copy if the crash came between its two renames: keep it then.
    if (m && (m[2] === "tmp" || (await isDir(path.join(runDir, m[1])))))
      await fs.rm(path.join(runDir, n), { recursive: true, force: true });
  }
  return removed;
}

/** Whether a run folder holds a checkpoint to resume from (a `latest` pointer, a checkpoint-<step>
 *  folder, or it is one). False for a run killed before its first save: it left run.json and logs, nothing to load. */
export async function holdsCheckpoint(runDir: string): Promise<boolean> {
  if ((await exists(path.join(runDir, LATEST_FILE))) || (await exists(path.join(runDir, TRAINER_STATE_FILE)))) return true;
  return (await listCheckpoints(runDir)).length > 0;
}

/** A checkpoint folder, or a run folder (then its `latest`, else its newest checkpoint). */
export async function resolveCheckpoint(p: string): Promise<string> {
  if (!(await isDir(p))) throw new Error(`checkpoint ${p} not found: expected a run folder or a checkpoint-<step> folder`);
  if (await exists(path.join(p, TRAINER_STATE_FILE))) return p;
  const latest = await fs.readFile(path.join(p, LATEST_FILE), "utf8").catch(() => undefined);
  if (latest !== undefined) {
    const name = latest.trim();
    if (!CHECKPOINT_RE.test(name))
      throw new Error(`${path.join(p, LATEST_FILE)} holds ${JSON.stringify(name.slice(0, 40))}: expected a checkpoint-<step> folder name`);
    const dir = path.join(p, name);
    if (!(await isDir(dir))) throw new Error(`${path.join(p, LATEST_FILE)} points to ${name}, which is missing from ${p}`);
    return dir;
  }
  const all = await listCheckpoints(p);
  if (all.length === 0)
    throw new Error(`${p} holds no checkpoint (no ${LATEST_FILE} file, no checkpoint-<step> folder, no ${TRAINER_STATE_FILE})`);
  return all[all.length - 1].dir;
}

export interface LoadedCheckpoint {
  dir: string;
  state: TrainerState;
  /** Undefined when the checkpoint was saved without optimizer state. */
  optimizerState?: OptimizerState;
  /** What the model part looks like: a PEFT adapter, a full HF model folder, or neither. */
  modelKind: "adapter" | "full" | "unknown";
}

export interface LoadOptions {
  io?: SafetensorsIo;
  /** Also check the model part's files (JSON configs parse, safetensors headers fit their files). */
  checkModel?: boolean;
  /** Where the fallback below is said (default stderr). */
  note?: (line: string) => void;
}

/** Find and read a checkpoint (see resolveCheckpoint). Errors name the folder and the bad piece.
 *  Given a run folder whose newest checkpoint is corrupt or incomplete (a disk that filled up, a file
 *  cut short by a copy), the newest intact earlier one is read instead, and `note` says so. */
export async function loadCheckpoint(p: string, opts: LoadOptions = {}): Promise<LoadedCheckpoint> {
  const dir = await resolveCheckpoint(p);
  try {
    return await readCheckpoint(dir, opts);
  } catch (err) {
    if (dir === p || !(err instanceof BadFileError)) throw err;
    const step = Number(CHECKPOINT_RE.exec(path.basename(dir))?.[1] ?? Infinity);
    for (const c of (await listCheckpoints(p)).filter((c) => c.step < step).reverse()) {
      const ckpt = await readCheckpoint(c.dir, opts).catch((e) => {
        if (e instanceof BadFileError) return null;
        throw e;
      });
      if (ckpt === null) continue;
      (opts.note ?? ((l) => process.stderr.write(l + "\n")))(
        `warning: ${err.message}; continuing from ${path.basename(c.dir)}, the newest intact checkpoint`,
      );
      return ckpt;
    }
    throw err;
  }
}

async function readCheckpoint(dir: string, opts: LoadOptions): Promise<LoadedCheckpoint> {
  const io = opts.io ?? defaultIo;
  const stateFile = path.join(dir, TRAINER_STATE_FILE);
  const text = await fs.readFile(stateFile, "utf8").catch(() => {
    throw new BadFileError(`checkpoint ${dir} is incomplete: ${TRAINER_STATE_FILE} is missing`);
  });
  let state: TrainerState;
  try {
    state = JSON.parse(text);
  } catch {
    throw new BadFileError(`checkpoint ${dir} is corrupt: ${TRAINER_STATE_FILE} is not valid JSON`);
  }
  try {
    validateState(state, stateFile);
  } catch (err) {
    throw new BadFileError((err as Error).message);
  }

  let optimizerState: OptimizerState | undefined;
  const optFile = path.join(dir, OPTIMIZER_FILE);
  if (await exists(optFile)) {
    try {
      optimizerState = await io.read(optFile);
    } catch (err) {
      throw new BadFileError(`checkpoint ${dir} is corrupt: ${OPTIMIZER_FILE}: ${err instanceof Error ? err.message : String(err)}`);
    }
    for (const [k, t] of Object.entries(optimizerState)) {
      const numel = t.shape.reduce((a, b) => a * b, 1);
      if (numel !== t.data.length)
        throw new BadFileError(`checkpoint ${dir}: optimizer tensor ${k} has shape ${JSON.stringify(t.shape)} but ${t.data.length} values`);
    }
  }
  const modelKind = (await exists(path.join(dir, "adapter_config.json")))
    ? "adapter"
    : (await exists(path.join(dir, "config.json")))
      ? "full"
      : "unknown";
  if (opts.checkModel) await checkModelFiles(dir);
  return { dir, state, optimizerState, modelKind };
}

/** The model part's files as far as they can be checked without loading: every JSON file parses,
 *  every safetensors header is sound and fits its file (a truncated or garbled file fails here). */
async function checkModelFiles(dir: string): Promise<void> {
  for (const name of (await fs.readdir(dir)).sort()) {
    const file = path.join(dir, name);
    try {
      if (name.endsWith(".json") && name !== TRAINER_STATE_FILE) JSON.parse(await fs.readFile(file, "utf8"));
      else if (name.endsWith(".safetensors") && name !== OPTIMIZER_FILE) await (await SafetensorsFile.open(file)).close();
    } catch (err) {
      throw new BadFileError(`checkpoint ${dir} is corrupt: ${name}: ${(err as Error).message.replace(file + ": ", "")}`);
    }
  }
}

/** Refuse to continue a checkpoint made with other settings (naming the differing keys), or one
 *  without optimizer state (restarting AdamW's moments would silently change the run). */
export function checkResumable(ckpt: LoadedCheckpoint, identity: Record<string, unknown>, runDir: string): void {
  if (ckpt.state.config_hash !== configHash(identity)) {
    const differ = configDiff(ckpt.state.config ?? {}, identity);
    throw new UsageError(
      `--resume: ${runDir} was run with other settings ` +
        `(${differ.length ? differ.join(", ") : "config differs"}); resume with the same flags or start a ` +
        `new --output_dir`,
    );
  }
  if (!ckpt.optimizerState)
    throw new Error(
      `--resume: ${ckpt.dir} has no ${OPTIMIZER_FILE}, so the optimizer cannot continue where it stopped; ` +
        `resume from another checkpoint or start a new run`,
    );
}

function validateState(s: TrainerState, where: string): void {
  const bad = (what: string) => new Error(`${where}: ${what}`);
  if (typeof s !== "object" || s === null) throw bad("expected a JSON object");
  if (!Number.isInteger(s.global_step) || s.global_step < 0)
    throw bad(`global_step ${JSON.stringify(s.global_step)}: expected a whole number >= 0`);
  if (typeof s.epoch !== "number") throw bad(`epoch ${JSON.stringify(s.epoch)}: expected a number`);
  if (!Number.isInteger(s.data_position) || s.data_position < 0)
    throw bad(`data_position ${JSON.stringify(s.data_position)}: expected a whole number >= 0`);
  if (typeof s.config_hash !== "string") throw bad(`config_hash: expected a string`);
  if (!Array.isArray(s.log_history)) throw bad(`log_history: expected an array`);
}

// ---------------------------------------------------------------- schedule and config identity

/** When to save: every `every` steps (0 = never on a schedule) and always at the last step. */
export class CheckpointSchedule {
  constructor(
    readonly every: number,
    readonly totalSteps?: number,
  ) {
    if (!Number.isInteger(every) || every < 0) throw new RangeError(`save_steps ${every}: expected a whole number >= 0`);
  }

  /** `step` = optimizer steps completed so far (1-based). */
  due(step: number): boolean {
    if (step <= 0) return false;
    return (this.every > 0 && step % this.every === 0) || step === this.totalSteps;
  }
}

function canonical(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(canonical);
  if (v && typeof v === "object")
    return Object.fromEntries(
      Object.keys(v)
        .sort()
        .map((k) => [k, canonical((v as Record<string, unknown>)[k])]),
    );
  return v;
}

/** Short stable hash of a config (key order does not matter), stored to notice a changed config on resume. */
export function configHash(config: unknown): string {
  return createHash("sha256")
    .update(JSON.stringify(canonical(config)))
    .digest("hex")
    .slice(0, 16);
}

/** Top-level keys whose values differ between two configs, sorted. */
export function configDiff(a: Record<string, unknown>, b: Record<string, unknown>): string[] {
  const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
  return [...keys].filter((k) => JSON.stringify(canonical(a[k])) !== JSON.stringify(canonical(b[k]))).sort();
}
