/** node:path for the page: POSIX paths over the page's in-memory file store (fs.ts). The working
 *  directory is "/". Only what src/ calls. */
export const sep = "/";
export const delimiter = ":";

export function normalize(p: string): string {
  const abs = p.startsWith("/");
  const out: string[] = [];
  for (const part of p.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") {
      if (out.length > 0 && out[out.length - 1] !== "..") out.pop();
      else if (!abs) out.push("..");
    } else out.push(part);
  }
  const s = (abs ? "/" : "") + out.join("/");
  return s || (abs ? "/" : ".");
}
export const isAbsolute = (p: string): boolean => p.startsWith("/");
export const join = (...parts: string[]): string => normalize(parts.filter((p) => p !== "").join("/") || ".");
export function resolve(...parts: string[]): string {
  let p = "/";
  for (const part of parts) p = part.startsWith("/") ? part : `${p}/${part}`;
  return normalize(p);
}
export function dirname(p: string): string {
  const n = normalize(p);
  const i = n.lastIndexOf("/");
  return i < 0 ? "." : i === 0 ? "/" : n.slice(0, i);
}
export function basename(p: string, ext?: string): string {
  const b = normalize(p).split("/").pop() ?? "";
  return ext && b.endsWith(ext) ? b.slice(0, -ext.length) : b;
}
export function extname(p: string): string {
  const b = basename(p);
  const i = b.lastIndexOf(".");
  return i <= 0 ? "" : b.slice(i);
}
export function relative(from: string, to: string): string {
  const a = resolve(from).split("/").filter(Boolean),
    b = resolve(to).split("/").filter(Boolean);
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return [...a.slice(i).map(() => ".."), ...b.slice(i)].join("/");
}
export const posix = { sep, delimiter, normalize, isAbsolute, join, resolve, dirname, basename, extname, relative };
export default posix;
