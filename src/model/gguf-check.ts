/** Is a GGUF file whole? Reads its header (magic, version, metadata, tensor infos) and compares the
 *  file's size with the size the header describes: a file cut short by a full disk or a kill, or
 *  zeroed by a crash, fails. Used before a cached GGUF is reused. Leaves out: the tensor data's
 *  values (no checksum), tensor types other than the F32, F16 and Q8_0 that gguf.ts writes. */
import { promises as fs } from "node:fs";

const TYPE_BYTES: Record<number, (n: number) => number> = { 0: (n) => 4 * n, 1: (n) => 2 * n, 8: (n) => (n / 32) * 34 };
const SCALAR_BYTES: Record<number, number> = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 }; // gguf_type
const STRING = 8,
  ARRAY = 9;

/** What makes the file unusable, found while reading its header. */
class Damaged extends Error {}

/** Reads a file front to back, a megabyte at a time. */
class Reader {
  private buf = Buffer.alloc(0);
  private at = 0; // the file offset of buf[0]
  pos = 0;
  constructor(
    private readonly fh: fs.FileHandle,
    readonly size: number,
  ) {}
  async need(n: number): Promise<Buffer> {
    if (this.pos + n > this.size) throw this.cut();
    if (this.pos + n > this.at + this.buf.length) {
      const len = Math.min(this.size - this.pos, Math.max(n, 1 << 20));
      this.buf = Buffer.alloc(len);
      await this.fh.read(this.buf, 0, len, this.pos);
      this.at = this.pos;
    }
    const off = this.pos - this.at;
    this.pos += n;
    return this.buf.subarray(off, off + n);
  }
  async u32(): Promise<number> {
    return (await this.need(4)).readUInt32LE(0);
  }
  /** A count or a length (`bounded`: no more than the file's size) or an offset or dimension. */
  async u64(bounded = true): Promise<number> {
    const v = (await this.need(8)).readBigUInt64LE(0);
    if (bounded && v > BigInt(this.size)) throw new Damaged(`its header holds a count of ${v}, more than the file's ${this.size} bytes`);
    return Number(v);
  }
  cut(): Damaged {
    return new Damaged(`its header is cut short (${this.size} bytes)`);
  }
  async skip(n: number): Promise<void> {
    if (this.pos + n > this.size) throw this.cut();
    this.pos += n;
  }
  async str(): Promise<string> {
    return (await this.need(await this.u64())).toString("utf8");
  }
}

/** null when the file is whole; otherwise what is wrong, in a few words. */
export async function checkGguf(file: string): Promise<string | null> {
  const fh = await fs.open(file, "r");
  try {
    const size = (await fh.stat()).size;
    const r = new Reader(fh, size);
    try {
      if ((await r.need(4)).toString("latin1") !== "GGUF") return "no GGUF magic at its start";
      const version = await r.u32();
      if (version !== 3) return `GGUF version ${version}, expected 3`;
      const nTensors = await r.u64();
      const nKv = await r.u64();
      let alignment = 32;
      for (let i = 0; i < nKv; i++) {
        const key = await r.str();
        const type = await r.u32();
        if (key === "general.alignment" && type === 4) alignment = await r.u32();
        else await skipValue(r, type);
      }
      let end = 0; // of the data section
      for (let i = 0; i < nTensors; i++) {
        const name = await r.str();
        const nDims = await r.u32();
        if (nDims > 4) return `tensor ${name} has ${nDims} dimensions`;
        let n = 1;
        for (let d = 0; d < nDims; d++) n *= await r.u64(false);
        const type = await r.u32();
        const offset = await r.u64(false);
        const bytes = TYPE_BYTES[type];
        if (!bytes) return `tensor ${name} has type ${type}, not one this project writes`;
        end = Math.max(end, Math.ceil((offset + bytes(n)) / alignment) * alignment);
      }
      const expected = Math.ceil(r.pos / alignment) * alignment + end;
      return size === expected ? null : `${size} bytes where its header describes ${expected}`;
    } catch (err) {
      if (err instanceof Damaged) return err.message;
      throw err;
    }
  } finally {
    await fh.close();
  }
}

async function skipValue(r: Reader, type: number): Promise<void> {
  if (type === STRING) return r.skip(await r.u64());
  if (type === ARRAY) {
    const inner = await r.u32();
    const n = await r.u64();
    if (inner === STRING || inner === ARRAY) for (let i = 0; i < n; i++) await skipValue(r, inner);
    else await r.skip(n * scalarBytes(inner));
    return;
  }
  await r.skip(scalarBytes(type));
}

function scalarBytes(type: number): number {
  const b = SCALAR_BYTES[type];
  if (b === undefined) throw new Damaged(`its header names value type ${type}, which GGUF does not have`);
  return b;
}
