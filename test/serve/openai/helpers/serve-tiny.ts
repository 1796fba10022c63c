/** The tiny preset served over real HTTP on 127.0.0.1, as scripts/serve-openai.ts serves it. */
import { initBackend } from "../../../../src/kernels/backend.ts";
import { TINY_BASE_DIR } from "../../../../src/presets/tiny.ts";
import { defaultsOf } from "../../../../src/run/flags.ts";
import { SERVE_OPENAI_FLAGS, serveOpenAi, type ServeOpenAiFlags, type ServingOpenAi } from "../../../../src/serve/openai/run.ts";

export const API_KEY = "test-key";

export async function serveTiny(o: Partial<ServeOpenAiFlags> = {}): Promise<ServingOpenAi> {
  await initBackend("wasm");
  return serveOpenAi({
    ...defaultsOf(SERVE_OPENAI_FLAGS),
    model_path: TINY_BASE_DIR,
    served_model_name: "tiny",
    tools_in_prompt: false,
    port: 0,
    backend: "wasm",
    api_key: API_KEY,
    max_json_string: 32, // what --preset tiny sets: the tiny model seldom closes a string by itself
    ...o,
  });
}

/** POST a JSON body to /v1/<route> with the key. */
export const postJson = (server: ServingOpenAi, route: string, body: unknown) =>
  fetch(`${server.url}/v1/${route}`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${API_KEY}` },
    body: JSON.stringify(body),
  });
