/** node:url for the page: a module's file path is its URL's path on the page's server. */
export const fileURLToPath = (u: string | URL): string => decodeURIComponent(new URL(String(u)).pathname);
export const pathToFileURL = (p: string): URL => new URL(p, "file:///");
export default { fileURLToPath, pathToFileURL };
