/** node:vm for the page: no new contexts (src/util/gc.ts then runs no forced collection). */
export function runInNewContext(code: string): unknown {
  throw new Error(`vm.runInNewContext(${JSON.stringify(code.slice(0, 20))}): not available in the page`);
}
export default { runInNewContext };
