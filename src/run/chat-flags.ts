/** The flags of scripts/chat.ts, which are the chat's configuration (flags.ts): the session reads them
 *  under these names. */
import { parseFloatArg, parseIntArg } from "./cli.ts";
import { commandOf, flag, optional, type FlagTable, type OptionsOf } from "./flags.ts";
import { modelFlags, toolFlags } from "./options.ts";
import { rolloutEngineFlag, withEngineFlags } from "../rollout/engines/index.ts";

export const CHAT_HELP = "commands: /reset (new conversation), /temp T (0 = greedy), /tools on|off, /exit";

const OWN_FLAGS = {
  ...modelFlags({ modelPath: "Qwen/Qwen2.5-0.5B", quantize: "none" }),
  ...toolFlags(),
  adapter: optional("--adapter <dir>", "PEFT adapter folder to attach to --model_path"),
  temperature: flag("--temperature <t>", "sampling temperature; 0 = greedy (change with /temp)", parseFloatArg("temperature", 0, 10), 0),
  top_p: flag("--top_p <p>", "nucleus sampling mass", parseFloatArg("top_p", 0, 1), 1),
  max_new_tokens: flag(
    "--max_new_tokens <n>",
    "token budget per reply over all turns, tool responses included",
    parseIntArg("max_new_tokens", 1),
    512,
  ),
  max_turns: flag("--max_turns <n>", "assistant turns per reply (each tool call starts a new one)", parseIntArg("max_turns", 1), 8),
  rollout_engine: rolloutEngineFlag("what generates the replies"),
} satisfies FlagTable;

/** The script's own flags, then every rollout engine's (rollout/engines/: each engine declares its own). */
export const CHAT_FLAGS = withEngineFlags(OWN_FLAGS, { training: false });

export type ChatFlags = OptionsOf<typeof CHAT_FLAGS>;

/** What `--preset tiny` sets (explicit flags still win); the checkpoint is picked by parseChatArgs. */
export const TINY_CHAT_PRESET = { max_new_tokens: 160, max_turns: 5, tools_in_prompt: false } satisfies Partial<ChatFlags>;

/** The script's command (its --help). */
export const chatCommand = () => commandOf("chat", `Chat with a checkpoint as a tool-using agent. ${CHAT_HELP}`, CHAT_FLAGS);
