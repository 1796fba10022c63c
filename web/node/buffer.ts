/** The part of Node's Buffer that src/ uses (safetensors headers, the wasm assembler's strings), for
 *  the page: a Uint8Array with utf8 text and little-endian 64-bit reads. Injected as the global
 *  `Buffer` by scripts/web.ts. */
export class Buffer extends Uint8Array {
  static alloc(n: number): Buffer {
    return new Buffer(n);
  }
  // The second parameter is Uint8Array.from's map function in the base class: typed loosely to match.
  static override from(value: string | ArrayLike<number> | Iterable<number>, encoding?: unknown): Buffer {
    if (typeof value !== "string") return Buffer.of(...Array.from(value)) as Buffer;
    if (encoding !== undefined && encoding !== "utf8" && encoding !== "utf-8")
      throw new Error(`Buffer.from: encoding ${String(encoding)} is not supported in the page`);
    const bytes = new TextEncoder().encode(value);
    const out = new Buffer(bytes.length);
    out.set(bytes);
    return out;
  }
  static byteLength(s: string): number {
    return new TextEncoder().encode(s).length;
  }
  static isBuffer(x: unknown): boolean {
    return x instanceof Buffer;
  }
  readBigUInt64LE(offset = 0): bigint {
    return new DataView(this.buffer, this.byteOffset, this.byteLength).getBigUint64(offset, true);
  }
  override toString(encoding = "utf8"): string {
    if (encoding !== "utf8" && encoding !== "utf-8") throw new Error(`Buffer.toString: encoding ${encoding} is not supported in the page`);
    return new TextDecoder().decode(this);
  }
}
export default { Buffer };
