/** node:readline for the page: no terminal (the page's chat box calls src/run/chat.ts's ChatSession). */
export function createInterface(): never {
  throw new Error("readline.createInterface: the page has no terminal; it uses its chat box");
}
export default { createInterface };
