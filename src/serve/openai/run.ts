/** scripts/serve-openai.ts: its flags (one table, flags.ts) and the run that opens the checkpoint,
 *  starts the batcher and the HTTP server. `--model_path` takes what the other scripts take (a hub id,
 *  a Hugging Face folder, a run's final/ — a PEFT folder is served on its base with the adapter on). */
import { parseFloatArg, parseIntArg } from "../../run/cli.ts";
import { UsageError } from "../../util/errors.ts";
import { checkModelSource, openPolicy } from "../../run/policy.ts";
import { commandOf, flag, optional, parseFlags, type FlagTable, type OptionsOf } from "../../run/flags.ts";
import { modelFlags } from "../../run/options.ts";
import { TINY_BASE_DIR } from "../../presets/tiny.ts";
import { Batcher } from "./batcher.ts";
import { startOpenAiServer, type RunningOpenAiServer } from "./server.ts";

export const SERVE_OPENAI_FLAGS = {
  ...modelFlags({ modelPath: "Qwen/Qwen2.5-0.5B", quantize: "none" }),
  adapter: optional("--adapter <dir>", "PEFT adapter folder served on --model_path under the served name"),
  served_model_name: optional("--served_model_name <name>", 'the name requests give as "model" (default: --model_path as given)'),
  port: flag("--port <n>", "TCP port (0: any free one)", parseIntArg("port", 0, 65535), 8001),
  host: flag("--host <addr>", "address to bind; the default answers this machine only", undefined, "127.0.0.1"),
  api_key: optional("--api_key <key>", "require Authorization: Bearer <key> on every /v1 request"),
  max_queue: flag("--max_queue <n>", "requests that may wait behind the running batch; more get 429", parseIntArg("max_queue", 0), 256),
  max_batch_rows: flag(
    "--max_batch_rows <n>",
    "rows (prompts × n) decoded together in one batch, at most",
    parseIntArg("max_batch_rows", 1),
    64,
  ),
  max_json_string: flag(
    "--max_json_string <chars>",
    "structured output: the longest string a JSON schema without maxLength gets (0: no limit)",
    parseIntArg("max_json_string", 0),
    0,
  ),
  batch_wait_ms: flag(
    "--batch_wait_ms <ms>",
    "how long an idle batcher waits for more requests before it starts a batch",
    parseFloatArg("batch_wait_ms", 0, 10_000),
    5,
  ),
} satisfies FlagTable;

export type ServeOpenAiFlags = OptionsOf<typeof SERVE_OPENAI_FLAGS>;

export const serveOpenAiCommand = () =>
  commandOf(
    "serve-openai",
    "OpenAI-compatible server (chat and text completions, tools, LoRA adapters) for any checkpoint",
    SERVE_OPENAI_FLAGS,
  );

export async function parseServeOpenAiArgs(argv: string[]): Promise<ServeOpenAiFlags> {
  const { o } = parseFlags(serveOpenAiCommand(), SERVE_OPENAI_FLAGS, argv, {
    tiny: { model_path: TINY_BASE_DIR, tools_in_prompt: false, max_json_string: 32 },
  });
  await checkModelSource(o.model_path, "--model_path", o.adapter);
  return o;
}

export interface ServingOpenAi extends RunningOpenAiServer {
  batcher: Batcher;
}

/** Open the checkpoint and serve it; close() stops the server and frees the model. */
export async function serveOpenAi(cfg: ServeOpenAiFlags, log: (line: string) => void = () => {}): Promise<ServingOpenAi> {
  const policy = await openPolicy({
    modelPath: cfg.model_path,
    adapter: cfg.adapter,
    quantize: cfg.quantize,
    backend: cfg.backend,
    threads: cfg.threads,
    seed: cfg.seed,
    unpackBase: cfg.unpack_base,
  });
  const batcher = new Batcher(policy.model, policy.tokenizer, {
    maxQueue: cfg.max_queue,
    maxBatchRows: cfg.max_batch_rows,
    batchWaitMs: cfg.batch_wait_ms,
  });
  let server: RunningOpenAiServer;
  try {
    server = await startOpenAiServer(batcher, {
      host: cfg.host,
      port: cfg.port,
      servedModelName: cfg.served_model_name ?? cfg.model_path,
      apiKey: cfg.api_key,
      toolsInPrompt: cfg.tools_in_prompt,
      maxJsonString: cfg.max_json_string,
      log,
    });
  } catch (err) {
    batcher.dispose();
    throw new UsageError(`cannot listen on ${cfg.host}:${cfg.port}: ${(err as Error).message}`);
  }
  return {
    ...server,
    batcher,
    close: async () => {
      await server.close();
      batcher.dispose();
    },
  };
}
