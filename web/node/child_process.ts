/** node:child_process for the page: a browser tab starts no processes. */
function refuse(name: string): never {
  throw new Error(`child_process.${name}: a browser tab starts no processes`);
}
export const spawn = (): never => refuse("spawn");
export const execFileSync = (): never => refuse("execFileSync");
export const execFile = (): never => refuse("execFile");
export default { spawn, execFileSync, execFile };
