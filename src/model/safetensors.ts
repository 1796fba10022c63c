/** The safetensors format, read and written without a dependency: 8-byte little-endian header length,
 *  a JSON header {name: {dtype, shape, data_offsets}}, then the raw little-endian bytes.
 *  Reading is lazy (header first, then one tensor at a time with positioned reads) so a 1 GB checkpoint
 *  is never held whole; F32/F16/BF16 come back as Float32Array (BF16 exactly: bits << 16).
 *  Writing is F32 only, keys sorted, `__metadata__ {"format":"pt"}`, atomic. Leaves out integer dtypes
 *  and F64 (Qwen checkpoints do not use them). */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { insideFolder, writeFileAtomic, exists } from "../util/fs.ts";
import { BadFileError } from "../util/errors.ts";

export interface HostTensor {
  shape: number[];
  data: Float32Array;
}
type DType = "F32" | "F16" | "BF16";
const DTYPE_BYTES: Record<DType, number> = { F32: 4, F16: 2, BF16: 2 };
interface Entry {
  dtype: DType;
  shape: number[];
  begin: number; // absolute file offsets
  end: number;
}

/** One .safetensors file opened for lazy reads. Call close() when done. */
export class SafetensorsFile {
  private constructor(
    readonly file: string,
    private readonly handle: fs.FileHandle,
    private readonly entries: Map<string, Entry>,
    readonly metadata: Record<string, string>,
  ) {}

  static async open(file: string): Promise<SafetensorsFile> {
    let handle: fs.FileHandle;
    try {
      handle = await fs.open(file, "r");
    } catch {
      throw new Error(`${file}: cannot open safetensors file (missing or unreadable)`);
    }
    try {
      const { entries, metadata } = await parseHeader(file, handle);
      return new SafetensorsFile(file, handle, entries, metadata);
    } catch (err) {
      await handle.close();
      throw err;
    }
  }

  keys(): string[] {
    return [...this.entries.keys()];
  }
  has(name: string): boolean {
    return this.entries.has(name);
  }
  shape(name: string): number[] {
    return this.entry(name).shape.slice();
  }
  dtype(name: string): string {
    return this.entry(name).dtype;
  }

  async read(name: string): Promise<HostTensor> {
    const e = this.entry(name);
    const bytes = Buffer.alloc(e.end - e.begin);
    const { bytesRead } = await this.handle.read(bytes, 0, bytes.length, e.begin);
    if (bytesRead !== bytes.length) throw new BadFileError(`${this.file}: truncated data for tensor ${name}`);
    return { shape: e.shape.slice(), data: toFloat32(bytes, e.dtype) };
  }

  async close(): Promise<void> {
    await this.handle.close();
  }

  private entry(name: string): Entry {
    const e = this.entries.get(name);
    if (!e) throw new Error(`${this.file}: tensor ${name} not found`);
    return e;
  }
}

async function parseHeader(file: string, handle: fs.FileHandle) {
  const size = (await handle.stat()).size;
  if (size < 8) throw new BadFileError(`${file}: truncated safetensors header (file is ${size} bytes, needs at least 8)`);
  const lenBuf = Buffer.alloc(8);
  await handle.read(lenBuf, 0, 8, 0);
  const n = Number(lenBuf.readBigUInt64LE(0));
  if (n < 2 || 8 + n > size)
    throw new BadFileError(`${file}: truncated or corrupted safetensors header (header length ${n}, file ${size} bytes)`);
  const headBuf = Buffer.alloc(n);
  await handle.read(headBuf, 0, n, 8);
  let header: Record<string, unknown>;
  try {
    header = JSON.parse(headBuf.toString("utf8"));
  } catch {
    throw new BadFileError(`${file}: corrupted safetensors header (not valid JSON)`);
  }
  if (typeof header !== "object" || header === null || Array.isArray(header))
    throw new BadFileError(`${file}: corrupted safetensors header (not a JSON object)`);
  const dataStart = 8 + n;
  const entries = new Map<string, Entry>();
  let metadata: Record<string, string> = {};
  for (const [name, raw] of Object.entries(header)) {
    if (name === "__metadata__") {
      metadata = raw as Record<string, string>;
      continue;
    }
    const r = raw as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    if (!(typeof r.dtype === "string" && r.dtype in DTYPE_BYTES))
      throw new BadFileError(`${file}: tensor ${name} has unsupported dtype ${JSON.stringify(r.dtype)}; accepted: F32, F16, BF16`);
    const shape = r.shape,
      offs = r.data_offsets;
    if (!Array.isArray(shape) || !shape.every((d) => Number.isInteger(d) && d >= 0))
      throw new BadFileError(`${file}: corrupted safetensors header (tensor ${name} has shape ${JSON.stringify(shape)})`);
    if (!Array.isArray(offs) || offs.length !== 2 || !offs.every((o) => Number.isInteger(o) && o >= 0) || offs[1] < offs[0])
      throw new BadFileError(`${file}: corrupted safetensors header (tensor ${name} has data_offsets ${JSON.stringify(offs)})`);
    const dtype = r.dtype as DType;
    const want = shape.reduce((p: number, d: number) => p * d, 1) * DTYPE_BYTES[dtype];
    if (offs[1] - offs[0] !== want)
      throw new BadFileError(
        `${file}: corrupted safetensors header (tensor ${name}: shape ${JSON.stringify(shape)} × ${dtype} is ` +
          `${want} bytes, data_offsets span ${offs[1] - offs[0]})`,
      );
    if (dataStart + offs[1] > size)
      throw new BadFileError(`${file}: truncated safetensors file (tensor ${name} ends at byte ${dataStart + offs[1]}, file has ${size})`);
    entries.set(name, { dtype, shape, begin: dataStart + offs[0], end: dataStart + offs[1] });
  }
  // Each byte belongs to one tensor: overlapping ranges mean a corrupt (or crafted) header.
  const byStart = [...entries].filter(([, e]) => e.end > e.begin).sort((a, b) => a[1].begin - b[1].begin);
  for (let i = 1; i < byStart.length; i++)
    if (byStart[i][1].begin < byStart[i - 1][1].end)
      throw new BadFileError(
        `${file}: corrupted safetensors header (tensors ${byStart[i - 1][0]} and ${byStart[i][0]} overlap in the data)`,
      );
  return { entries, metadata };
}

/** Little-endian bytes of one dtype → Float32Array (copies; BF16 and F16 widened exactly). */
export function toFloat32(bytes: Uint8Array, dtype: string): Float32Array {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (dtype === "F32") {
    const out = new Float32Array(bytes.byteLength / 4);
    for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
    return out;
  }
  const n = bytes.byteLength / 2;
  const out = new Float32Array(n);
  if (dtype === "BF16") {
    const u = new Uint32Array(out.buffer);
    for (let i = 0; i < n; i++) u[i] = view.getUint16(2 * i, true) << 16; // BF16 is the top half of an F32
  } else if (dtype === "F16") {
    for (let i = 0; i < n; i++) out[i] = halfToFloat(view.getUint16(2 * i, true));
  } else throw new Error(`unsupported safetensors dtype ${dtype}; accepted: F32, F16, BF16`);
  return out;
}

function halfToFloat(h: number): number {
  const s = h & 0x8000 ? -1 : 1,
    e = (h >> 10) & 0x1f,
    m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

/** F32 safetensors bytes: `__metadata__` first, then tensors in sorted key order (as the Rust
 *  library writes them), header padded with spaces to 8 bytes. Deterministic for the same input. */
export function encodeSafetensors(tensors: Record<string, HostTensor>, metadata: Record<string, string> = { format: "pt" }): Uint8Array {
  const names = Object.keys(tensors).sort();
  const header: Record<string, unknown> = { __metadata__: metadata };
  let off = 0;
  for (const name of names) {
    const t = tensors[name];
    const numel = t.shape.reduce((p, d) => p * d, 1);
    if (numel !== t.data.length)
      throw new Error(`tensor ${name}: shape ${JSON.stringify(t.shape)} holds ${numel} values, data has ${t.data.length}`);
    header[name] = { dtype: "F32", shape: t.shape, data_offsets: [off, off + 4 * numel] };
    off += 4 * numel;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - (Buffer.byteLength(json) % 8)) % 8);
  const head = Buffer.from(json, "utf8");
  const out = new Uint8Array(8 + head.length + off);
  const view = new DataView(out.buffer);
  view.setBigUint64(0, BigInt(head.length), true);
  out.set(head, 8);
  let p = 8 + head.length;
  for (const name of names) {
    const d = tensors[name].data;
    for (let i = 0; i < d.length; i++, p += 4) view.setFloat32(p, d[i], true);
  }
  return out;
}

export async function writeSafetensors(
  file: string,
  tensors: Record<string, HostTensor>,
  metadata?: Record<string, string>,
): Promise<void> {
  await writeFileAtomic(file, encodeSafetensors(tensors, metadata ?? { format: "pt" }));
}

/** Every tensor of a small file, as F32. */
export async function readSafetensorsAll(file: string): Promise<Record<string, HostTensor>> {
  const f = await SafetensorsFile.open(file);
  try {
    const out: Record<string, HostTensor> = {};
    for (const k of f.keys()) out[k] = await f.read(k);
    return out;
  } finally {
    await f.close();
  }
}

/** A Hugging Face checkpoint folder: model.safetensors or model.safetensors.index.json + shards. */
export class Checkpoint {
  private constructor(
    private readonly where: Map<string, SafetensorsFile>,
    private readonly files: SafetensorsFile[],
  ) {}

  static async open(dir: string): Promise<Checkpoint> {
    const single = path.join(dir, "model.safetensors");
    const index = path.join(dir, "model.safetensors.index.json");
    if (await exists(single)) {
      const f = await SafetensorsFile.open(single);
      return new Checkpoint(new Map(f.keys().map((k) => [k, f])), [f]);
    }
    if (!(await exists(index))) throw new Error(`${dir}: no model.safetensors or model.safetensors.index.json found`);
    let map: Record<string, string>;
    try {
      map = JSON.parse(await fs.readFile(index, "utf8")).weight_map;
      if (typeof map !== "object" || map === null) throw new Error("no weight_map");
    } catch (err) {
      throw new BadFileError(`${index}: invalid index (${(err as Error).message}); expected {"weight_map": {tensor: shard file}}`);
    }
    const shards = new Map<string, SafetensorsFile>();
    const where = new Map<string, SafetensorsFile>();
    try {
      for (const [name, shard] of Object.entries(map)) {
        if (!shards.has(shard))
          shards.set(
            shard,
            await SafetensorsFile.open(insideFolder(dir, shard, `${index}: weight_map[${JSON.stringify(name).slice(0, 80)}]`)),
          );
        const f = shards.get(shard)!;
        if (!f.has(name)) throw new BadFileError(`${f.file}: tensor ${name} listed in ${index} is not in the shard`);
        where.set(name, f);
      }
    } catch (err) {
      await Promise.all([...shards.values()].map((f) => f.close()));
      throw err;
    }
    return new Checkpoint(where, [...shards.values()]);
  }

  has(name: string): boolean {
    return this.where.has(name);
  }
  keys(): string[] {
    return [...this.where.keys()];
  }
  /** The file a tensor lives in (for error messages). */
  fileOf(name: string): string {
    return this.where.get(name)?.file ?? this.files.map((f) => f.file).join(", ");
  }
  shape(name: string): number[] {
    return this.get(name).shape(name);
  }
  read(name: string): Promise<HostTensor> {
    return this.get(name).read(name);
  }
  async close(): Promise<void> {
    await Promise.all(this.files.map((f) => f.close()));
  }
  private get(name: string): SafetensorsFile {
    const f = this.where.get(name);
    if (!f) throw new BadFileError(`${this.fileOf(name)}: tensor ${name} missing from the checkpoint`);
    return f;
  }
}
