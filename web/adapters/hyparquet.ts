/** hyparquet for the page: its browser build, plus asyncBufferFromFile (Node-only in the package) over
 *  the page's file store, so src/datasets/gsm8k.ts reads a parquet file the user put there. */
import * as fs from "../node/fs.ts";
export * from "hyparquet";

export async function asyncBufferFromFile(file: string) {
  const bytes = (await fs.promises.readFile(file)) as Uint8Array;
  const buf = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) as ArrayBuffer;
  return { byteLength: buf.byteLength, slice: (start: number, end?: number) => buf.slice(start, end) };
}
