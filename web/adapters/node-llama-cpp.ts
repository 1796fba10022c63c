/** node-llama-cpp for the page: llama.cpp's native builds run in Node only (--rollout_engine llama). */
export function getLlama(): never {
  throw new Error("node-llama-cpp: llama.cpp runs in Node only; the page rolls out with its own tfjs model");
}
