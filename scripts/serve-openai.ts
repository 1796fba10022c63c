/** OpenAI-compatible server for any checkpoint (chat and text completions, tools, streaming, LoRA
 *  adapters loaded at run time, as vLLM serves them):
 *    npx tsx scripts/serve-openai.ts --model_path outputs/tiny/grpo/final --quantize nf4 --no-tools_in_prompt
 *    npx tsx scripts/serve-openai.ts --model_path Qwen/Qwen2.5-0.5B --port 8001 --api_key KEY
 *  Ctrl-C (or SIGTERM) stops it. Runs in a child process (superviseSelf) so a signal is taken at once
 *  even while a decode step holds the event loop. */
import { superviseSelf } from "../src/run/shutdown.ts";

await superviseSelf();
const { runMain } = await import("../src/run/cli.ts");
const { closeOnSignal } = await import("../src/run/shutdown.ts");
const { parseServeOpenAiArgs, serveOpenAi } = await import("../src/serve/openai/run.ts");

await runMain(async () => {
  const cfg = await parseServeOpenAiArgs(process.argv);
  const log = (line: string) => process.stderr.write(line + "\n");
  const server = await serveOpenAi(cfg, log);
  const name = cfg.served_model_name ?? cfg.model_path;
  log(
    `OpenAI-compatible server on ${server.url}/v1 | model "${name}" (quantize ${cfg.quantize}${cfg.adapter ? `, adapter ${cfg.adapter}` : ""}) | ${cfg.api_key ? "API key required" : "no API key"}`,
  );
  if (!["127.0.0.1", "::1", "localhost"].includes(cfg.host))
    log(`warning: bound to ${cfg.host}: other machines can reach this server${cfg.api_key ? "" : " and it has no --api_key"}`);
  closeOnSignal(server, log);
});
