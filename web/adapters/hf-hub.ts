/** @huggingface/hub for the page: the page reads the preset it serves and folders the user picks;
 *  downloading from the hub is the scripts' (src/model/model-dir.ts, src/util/hub.ts). */
function refuse(name: string): never {
  throw new Error(`${name}: downloads from the Hugging Face hub are not available in the page; it reads the files it serves`);
}
export const modelInfo = (): never => refuse("modelInfo");
export const downloadFileToCacheDir = (): never => refuse("downloadFileToCacheDir");
export const getRepoFolderName = ({ name, type }: { name: string; type?: string }): string =>
  `${type ?? "model"}s--${name.split("/").join("--")}`;
export class HubApiError extends Error {
  statusCode?: number;
}
export type RepoType = "model" | "dataset" | "space";
