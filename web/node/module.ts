/** node:module for the page: createRequire serves the packages a page entry registers (the calculator
 *  worker registers mathjs); anything else is a one-line error. */
const provided = new Map<string, unknown>();
export function provideModule(name: string, mod: unknown): void {
  provided.set(name, mod);
}
export function createRequire(_from: string | URL) {
  const require = (name: string) => {
    if (!provided.has(name)) throw new Error(`require("${name}"): not provided in the page (web/node/module.ts)`);
    return provided.get(name);
  };
  return Object.assign(require, {
    resolve: (name: string) => {
      throw new Error(`require.resolve("${name}"): the page has no node_modules`);
    },
  });
}
export default { createRequire };
