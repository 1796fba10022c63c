/** node:crypto for the page: GGUF export's checksums are the scripts' (scripts/export-gguf.ts). */
export function createHash(algorithm: string): never {
  throw new Error(`crypto.createHash("${algorithm}"): not available in the page`);
}
export default { createHash };
