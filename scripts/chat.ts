/** Chat with a checkpoint as a tool-using agent (--tools; the calculator by default):
 *    npx tsx scripts/chat.ts --model_path Qwen/Qwen2.5-0.5B --adapter outputs/grpo/final
 *    npx tsx scripts/chat.ts --preset tiny           # the tiny RL checkpoint (else SFT, else base)
 *    echo "What is 17 * 23?" | npx tsx scripts/chat.ts --preset tiny     # one message per line
 *  Commands: /reset, /temp T, /tools on|off, /exit. */
import { runMain } from "../src/run/cli.ts";
import { parseChatArgs, runChat } from "../src/run/chat.ts";

await runMain(async () => {
  await runChat(await parseChatArgs(process.argv), {
    input: process.stdin,
    output: process.stdout,
    err: (l) => process.stderr.write(l + "\n"),
  });
});
