/** Talking to a checkpoint as an agent, behind scripts/chat.ts: each user message is one rollout of the
 *  whole conversation so far (system prompt, earlier turns, tool results), streamed token by token, with
 *  each tool call shown as it runs (the --tools tools; the calculator by default). The trajectory's turns go back into the conversation as
 *  assistant messages with tool_calls plus tool messages, so the chat template renders the next prompt
 *  exactly as for any tool-using chat. Commands: /reset, /temp T, /tools on|off, /exit.
 *  Interactive on a terminal (Ctrl-C stops a generation, twice at the prompt exits); with piped stdin
 *  one message per line, plain output, exit at EOF. Leaves out: history editing, multiple samples. */
import * as readline from "node:readline";
import { defaultTools } from "../agents/builtin.ts";
import { checkToolsFit, systemPromptFor } from "../agents/prompts.ts";
import { openRunTools } from "../agents/toolset.ts";
import type { Tool } from "../agents/types.ts";
import { UsageError } from "../util/errors.ts";
import type { CausalLM, ChatMessage, Tokenizer } from "../model/types.ts";
import { TINY_BASE_DIR } from "../presets/tiny.ts";
import { encodePrompts, stopTokenIds, type Trajectory } from "../rollout/rollout.ts";
import { Rng } from "../util/rng.ts";
import { CHAT_FLAGS, CHAT_HELP, chatCommand, TINY_CHAT_PRESET, type ChatFlags } from "./chat-flags.ts";
import { TINY_EVAL_MODELS } from "./eval-run.ts";
import { parseFlags, samplingSettings, turnSettings } from "./flags.ts";
import { toolConfig } from "./options.ts";
import { checkModelSource, openPolicy } from "./policy.ts";
import { openGenerationEngine } from "./rollout-engine.ts";
import { localGenerate } from "../rollout/engines/local.ts";
import type { RolloutEngine } from "../rollout/engines/types.ts";

export { CHAT_HELP, chatCommand };

// ---------------------------------------------------------------- commands

export type ChatCommand =
  | { kind: "message"; text: string }
  | { kind: "reset" }
  | { kind: "temp"; value: number }
  | { kind: "tools"; on: boolean }
  | { kind: "exit" }
  | { kind: "empty" }
  | { kind: "invalid"; message: string };

/** One input line → what to do. Anything not starting with "/" is a message to the model. */
export function parseChatCommand(line: string): ChatCommand {
  const text = line.trim();
  if (text === "") return { kind: "empty" };
  if (!text.startsWith("/")) return { kind: "message", text };
  const [cmd, ...args] = text.split(/\s+/);
  const arg = args.join(" ");
  switch (cmd) {
    case "/reset":
      return args.length ? { kind: "invalid", message: `/reset takes no argument; got "${arg}"` } : { kind: "reset" };
    case "/exit":
    case "/quit":
      return { kind: "exit" };
    case "/temp": {
      const v = arg === "" ? NaN : Number(arg);
      return Number.isFinite(v) && v >= 0 && v <= 10 && args.length === 1
        ? { kind: "temp", value: v }
        : { kind: "invalid", message: `/temp "${arg}": expected one number between 0 and 10 (0 = greedy)` };
    }
    case "/tools":
      return arg === "on" || arg === "off"
        ? { kind: "tools", on: arg === "on" }
        : { kind: "invalid", message: `/tools "${arg}": expected on or off` };
    default:
      return { kind: "invalid", message: `unknown command ${cmd}; ${CHAT_HELP}` };
  }
}

// ---------------------------------------------------------------- trajectory → messages

/** The assistant's side of one rollout as chat messages. A turn with well-formed calls becomes an
 *  assistant message with `tool_calls` (content = the text outside the blocks) followed by one tool
 *  message per result; a turn with malformed blocks keeps its raw text (what the model wrote is what it
 *  should see again) and the parse errors follow as tool messages, as the rollout fed them back.
 *  With tools off, every turn is plain text and nothing ran. */
export function trajectoryToMessages(t: Trajectory, toolsOn = true): ChatMessage[] {
  const out: ChatMessage[] = [];
  for (const turn of t.turns) {
    if (!toolsOn || !turn.ended || (turn.toolCalls.length === 0 && turn.parseErrors.length === 0)) {
      out.push({ role: "assistant", content: turn.text });
      continue;
    }
    if (turn.parseErrors.length > 0) out.push({ role: "assistant", content: turn.text });
    else
      out.push({
        role: "assistant",
        content: turn.content.trim(),
        tool_calls: turn.toolCalls.map((c) => ({ type: "function", function: { name: c.name, arguments: c.arguments } })),
      });
    for (const c of turn.toolCalls) out.push({ role: "tool", content: c.result });
    for (const e of turn.parseErrors) out.push({ role: "tool", content: e });
  }
  return out;
}

// ---------------------------------------------------------------- streaming

/** Model-written text is untrusted: control characters (ESC sequences could move the cursor, rewrite
 *  the screen or set the window title) are shown as U+FFFD. Newlines and tabs stay. */
export function printable(s: string): string {
  return s.replace(/[\u0000-\u0008\u000B-\u001F\u007F-\u009F]/g, "\uFFFD");
}

/** Prints one row's sampled tokens as text as they arrive. Decodes the current turn's ids so far and
 *  writes the new suffix, so a character split over several byte-level tokens comes out whole; a
 *  trailing U+FFFD (an unfinished UTF-8 sequence) waits for the next token. Forced tokens (tool
 *  responses, role headers) start a new turn and are not printed. */
export class TokenStreamer {
  private ids: number[] = [];
  private printed = "";

  constructor(
    private readonly tokenizer: Tokenizer,
    private readonly stopIds: Set<number>,
    private readonly write: (s: string) => void,
  ) {}

  push(tokenId: number, forced: boolean): void {
    if (forced) return this.endTurn();
    if (this.stopIds.has(tokenId)) return this.endTurn();
    this.ids.push(tokenId);
    const text = this.tokenizer.decode(this.ids);
    if (text.endsWith("\uFFFD") || !text.startsWith(this.printed)) return;
    this.write(printable(text.slice(this.printed.length)));
    this.printed = text;
  }

  /** Flush what is held back and start a new turn (a newline if this one printed anything). */
  endTurn(): void {
    if (this.ids.length > 0) {
      const text = this.tokenizer.decode(this.ids);
      if (text.startsWith(this.printed)) this.write(printable(text.slice(this.printed.length)));
      this.write("\n");
    }
    this.ids = [];
    this.printed = "";
  }
}

// ---------------------------------------------------------------- session

/** The session's settings, under the flags' names, and its open tools (default: DEFAULT_TOOLS, builtin.ts). */
export type ChatOptions = Pick<ChatFlags, "temperature" | "top_p" | "max_new_tokens" | "max_turns" | "tools_in_prompt" | "seed"> & {
  systemPrompt?: string;
  tools?: Tool[];
  /** The rollout engine's generate (rollout/engines/); default: the local engine's, on the session's model. */
  generate?: RolloutEngine["generate"];
};

/** A tool call's arguments as chat shows them: a lone string argument as itself (`16-3` for
 *  {"expression": "16-3"}), anything else as JSON. */
export function shownArguments(args: Record<string, unknown>): string {
  const values = Object.values(args);
  return values.length === 1 && typeof values[0] === "string" ? values[0] : JSON.stringify(args);
}

/** The conversation and the settings the commands change. */
export class ChatSession {
  messages: ChatMessage[] = [];
  temperature: number;
  toolsOn = true;
  private readonly rng: Rng;
  private readonly stopIds: Set<number>;

  constructor(
    readonly model: CausalLM,
    readonly tokenizer: Tokenizer,
    readonly o: ChatOptions,
  ) {
    this.temperature = o.temperature;
    this.rng = new Rng(o.seed);
    this.stopIds = stopTokenIds(tokenizer);
    this.reset();
  }

  reset(): void {
    this.messages = [{ role: "system", content: this.o.systemPrompt ?? systemPromptFor(this.o.tools ?? defaultTools()) }];
  }

  /** One user message → the streamed reply (tool calls shown through `write` as they run). The
   *  conversation keeps the reply, also when interrupted (what was written so far). */
  async send(text: string, write: (s: string) => void, signal?: AbortSignal): Promise<Trajectory> {
    const streamer = new TokenStreamer(this.tokenizer, this.stopIds, write);
    // Wrapped so each call is shown the moment it returns, before the model reads the result.
    const tools = this.toolsOn
      ? (this.o.tools ?? defaultTools()).map((t): Tool => ({
          ...t,
          run: async (args) => {
            const result = await t.run(args);
            streamer.endTurn();
            const shown = shownArguments(args);
            write(printable(`[${t.name}] ${shown} → ${typeof result === "string" ? result : result.text}`) + "\n");
            return result;
          },
        }))
      : [];
    const conversation: ChatMessage[] = [...this.messages, { role: "user", content: text }];
    this.checkFits(conversation, tools);
    const generate = this.o.generate ?? localGenerate(this.model, this.tokenizer);
    const [traj] = await generate([conversation], {
      ...samplingSettings({ samples_per_prompt: 1, temperature: this.temperature, top_p: this.o.top_p, top_k: 0 }),
      ...turnSettings({
        max_new_tokens: this.o.max_new_tokens,
        max_turns: this.toolsOn ? this.o.max_turns : 1, // tools off: the first turn is the answer
        tools_in_prompt: this.toolsOn && this.o.tools_in_prompt,
      }),
      rng: this.rng,
      tools,
      onToken: (_row, id, forced) => streamer.push(id, forced),
      signal,
    });
    streamer.endTurn();
    this.messages = [...conversation, ...trajectoryToMessages(traj, this.toolsOn)];
    return traj;
  }

  /** A prompt that leaves no room for --max_new_tokens in the model's context is refused before
   *  anything runs, saying what the user can do; the conversation stays as it was. */
  private checkFits(conversation: ChatMessage[], tools: Tool[]): void {
    const [ids] = encodePrompts(this.tokenizer, [conversation], { tools, toolsInPrompt: this.toolsOn && this.o.tools_in_prompt });
    const positions = this.model.config.maxPositionEmbeddings;
    if (ids.length + this.o.max_new_tokens > positions)
      throw new Error(
        `this message makes the prompt ${ids.length} tokens; with --max_new_tokens ${this.o.max_new_tokens} ` +
          `that passes the model's ${positions} positions: send a shorter message, /reset to start a new ` +
          `conversation, or restart with a lower --max_new_tokens`,
      );
  }
}

// ---------------------------------------------------------------- flags and the loop

/** The chat's configuration: the script's flags as parsed (chat-flags.ts), with the checkpoint a
 *  preset picks settled in `model_path` and `quantize`. */
export type ChatRunConfig = ChatFlags & {
  note?: string; // which checkpoint a preset picked, and why
};

/** argv → config; validates paths, writes nothing. `--preset tiny` picks the most trained tiny
 *  checkpoint that exists: RL (on its NF4 base), else SFT, else the base. */
export async function parseChatArgs(argv: string[]): Promise<ChatRunConfig> {
  const { o, explicit } = parseFlags(chatCommand(), CHAT_FLAGS, argv, { tiny: TINY_CHAT_PRESET });
  const cfg: ChatRunConfig = { ...o };
  toolConfig(o); // a malformed --tools list is a usage error here
  if (o.preset === "tiny" && !explicit("model_path")) {
    const fs = await import("node:fs");
    const order = [...TINY_EVAL_MODELS].reverse(); // rl, sft, base
    const pick = order.find((m) => fs.existsSync(m.modelPath));
    if (!pick)
      throw new UsageError(
        `--preset tiny: none of ${order.map((m) => m.modelPath).join(", ")} exists; run make-tiny-base first (base: ${TINY_BASE_DIR})`,
      );
    cfg.model_path = pick.modelPath;
    if (!explicit("quantize")) cfg.quantize = pick.quantize;
    const missing = order.slice(0, order.indexOf(pick)).map((m) => m.name);
    cfg.note =
      `tiny preset: chatting with ${pick.name} (${pick.modelPath}, quantize ${cfg.quantize})` +
      (missing.length ? `; not found: ${missing.join(", ")}` : "");
  }
  await checkModelSource(cfg.model_path, "--model_path", cfg.adapter);
  return cfg;
}

export interface ChatIo {
  input: NodeJS.ReadableStream & { isTTY?: boolean };
  output: NodeJS.WritableStream & { isTTY?: boolean };
  err: (line: string) => void;
  /** Called with each finished reply (logging; tests). */
  onReply?: (t: Trajectory) => void;
}

/** Opens the model a chat talks to (openPolicy; tests pass a scripted stand-in). */
export type OpenChatModel = (o: Parameters<typeof openPolicy>[0]) => Promise<{ model: CausalLM; tokenizer: Tokenizer; base?: string }>;

/** The REPL. Resolves when the user exits (/exit, Ctrl-C twice at the prompt, or end of input). */
export async function runChat(cfg: ChatRunConfig, io: ChatIo, open: OpenChatModel = openPolicy): Promise<void> {
  if (cfg.note) io.err(cfg.note);
  const toolSet = await openRunTools(toolConfig(cfg), io.err);
  try {
    io.err(`tools: ${toolSet.tools.map((t) => t.name).join(", ") || "(none)"}`);
    await chatLoop(cfg, io, toolSet.tools, open);
  } finally {
    await toolSet.close();
  }
}

async function chatLoop(cfg: ChatRunConfig, io: ChatIo, tools: Tool[], open: OpenChatModel): Promise<void> {
  const interactive = Boolean(io.input.isTTY && io.output.isTTY);
  const write = (s: string) => void io.output.write(s);
  const dim = (s: string) => `\x1b[2m${s}\x1b[0m`;
  // Notes about the session: dimmed in the terminal; on stderr when piped, so stdout holds only replies.
  const note = (s: string) => (interactive ? write(dim(`${s}\n`)) : io.err(s));
  const policy = await open({
    modelPath: cfg.model_path,
    adapter: cfg.adapter,
    quantize: cfg.quantize,
    seed: cfg.seed,
    backend: cfg.backend,
    threads: cfg.threads,
    unpackBase: cfg.unpack_base,
  });
  let engine: RolloutEngine;
  try {
    checkToolsFit(policy.tokenizer, policy.model.config.maxPositionEmbeddings, tools, cfg.max_new_tokens, cfg.tools_in_prompt);
    engine = await openGenerationEngine(policy, cfg, { tools, log: note });
  } catch (err) {
    policy.model.dispose();
    throw err;
  }
  const session = new ChatSession(policy.model, policy.tokenizer, { ...cfg, tools, generate: engine.generate.bind(engine) });
  const rl = readline.createInterface({
    input: io.input,
    output: interactive ? io.output : undefined,
    terminal: interactive,
    prompt: "you> ",
  });
  let generation: AbortController | null = null;
  let armedExit = false; // Ctrl-C once at the prompt
  let exiting = false;
  rl.on("SIGINT", () => {
    if (generation) return generation.abort(); // stop this reply, keep the session
    if (armedExit) {
      exiting = true;
      return rl.close();
    }
    armedExit = true;
    note("\n(Ctrl-C again to exit, or type /exit)");
    rl.prompt();
  });
  if (interactive) {
    note(CHAT_HELP);
    rl.prompt();
  }
  try {
    for await (const line of rl) {
      armedExit = false;
      const c = parseChatCommand(line);
      if (c.kind === "exit") break;
      if (c.kind === "reset") {
        session.reset();
        note("(new conversation)");
      } else if (c.kind === "temp") {
        session.temperature = c.value;
        note(`(temperature ${c.value})`);
      } else if (c.kind === "tools") {
        session.toolsOn = c.on;
        note(`(tools ${c.on ? "on" : "off"})`);
      } else if (c.kind === "invalid") {
        io.err(c.message);
      } else if (c.kind === "message") {
        generation = new AbortController();
        if (interactive) write(dim("assistant> "));
        try {
          const t = await session.send(c.text, write, generation.signal);
          io.onReply?.(t);
          if (t.finishReason === "aborted") note("(interrupted)");
          else if (t.truncated) note(`(stopped at --max_new_tokens ${cfg.max_new_tokens})`);
          else if (t.finishReason === "max_turns") note(`(stopped at --max_turns ${cfg.max_turns})`);
        } catch (err) {
          io.err(`error: ${(err as Error).message.split("\n")[0]}`);
        } finally {
          generation = null;
        }
      }
      if (exiting) break;
      if (interactive) rl.prompt();
    }
  } finally {
    rl.close();
    await engine.close();
    policy.model.dispose();
  }
}
