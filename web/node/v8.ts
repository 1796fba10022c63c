/** node:v8 for the page: V8's flags are the browser's, not the page's to set. */
export function setFlagsFromString(flags: string): void {
  throw new Error(`v8.setFlagsFromString("${flags}"): not available in the page`);
}
export default { setFlagsFromString };
