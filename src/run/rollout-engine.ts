/** A policy's rollout engine for the scripts that only generate (eval, chat): the engine named by
 *  --rollout_engine, from the table as GRPO opens it, on the policy's model, with a scratch folder for
 *  what it keeps on disk, removed at close. */
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import type { Tool } from "../agents/types.ts";
import { prepareEngine } from "../rollout/engines/index.ts";
import type { EngineFlags, RolloutEngine } from "../rollout/engines/types.ts";
import type { CausalLM, Tokenizer } from "../model/types.ts";

export async function openGenerationEngine(
  policy: { model: CausalLM; tokenizer: Tokenizer; base?: string },
  f: EngineFlags,
  o: { tools: Tool[]; log?: (line: string) => void },
): Promise<RolloutEngine> {
  const log = o.log ?? ((line: string) => process.stderr.write(line + "\n"));
  const open = await prepareEngine(f, log);
  const workDir = await fs.mkdtemp(path.join(os.tmpdir(), "mini-agentic-rl-engine-"));
  try {
    const engine = await open({
      model: policy.model,
      tokenizer: policy.tokenizer,
      modelDir: policy.base ?? "", // a stand-in model (tests) has no folder: only the local engine runs it
      workDir,
      tools: o.tools,
      // Per call (generate's config); these only serve GRPO's rollouts().
      sampling: { samplesPerPrompt: 1, maxNewTokens: 1, maxTurns: 1, temperature: 1, topP: 1, topK: 0, toolsInPrompt: true },
      log,
    });
    const close = engine.close.bind(engine);
    return Object.assign(engine, {
      close: async () => {
        await close();
        await fs.rm(workDir, { recursive: true, force: true });
      },
    });
  } catch (err) {
    await fs.rm(workDir, { recursive: true, force: true });
    throw err;
  }
}
