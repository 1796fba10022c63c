/** Talking to a checkpoint as an agent, behind scripts/chat.ts: each user message is one rollout of the
 *  whole conversation so far (system prompt, earlier turns, tool results), streamed token by token, with
 *  each tool call shown as it runs (the --tools tools; the calculator by default). The trajectory's turns go back into the conversation as
 *  assistant messages with tool_calls plus tool messages, so the chat template renders the next prompt
 *  exactly as for any tool-using chat. Commands: /reset, /temp T, /tools on|off, /exit.
 *  Interactive on a terminal (Ctrl-C stops a generation, twice at the prompt exits); with piped stdin
 *  one message per line, plain output, exit at EOF. Leaves out: history editing, multiple samples. */
import * as readline from "node:readline";
import { Command } from "commander";
import { calculatorTool } from "../agents/calculator.ts";
import { systemPromptFor } from "../agents/prompts.ts";
import { openRunTools } from "../agents/toolset.ts";
import type { Tool } from "../agents/types.ts";
import { parseFloatArg, parseIntArg, UsageError } from "../cli.ts";
import type { CausalLM, ChatMessage, Quantize, Tokenizer } from "../model/types.ts";
import { TINY_BASE_DIR } from "../presets/tiny.ts";
import { rolloutGroups, stopTokenIds, type Trajectory } from "../rollout/rollout.ts";
import { Rng } from "../util/rng.ts";
import { TINY_EVAL_MODELS } from "./eval-run.ts";
import { checkModelSource } from "./policy.ts";
import { addModelOptions, addToolOptions, parseWithPreset, toolConfig } from "./options.ts";
import { openPolicy } from "./policy.ts";
import type { ThreadsSpec } from "../wasm-threads.ts";

// ---------------------------------------------------------------- commands

export type ChatCommand =
  | { kind: "message"; text: string }
  | { kind: "reset" }
  | { kind: "temp"; value: number }
  | { kind: "tools"; on: boolean }
  | { kind: "exit" }
  | { kind: "empty" }
  | { kind: "invalid"; message: string };

export const CHAT_HELP = "commands: /reset (new conversation), /temp T (0 = greedy), /tools on|off, /exit";

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
      return arg === "on" || arg === "off" ? { kind: "tools", on: arg === "on" } : { kind: "invalid", message: `/tools "${arg}": expected on or off` };
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

  constructor(private readonly tokenizer: Tokenizer, private readonly stopIds: Set<number>, private readonly write: (s: string) => void) {}

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

export interface ChatOptions {
  temperature: number;
  topP: number;
  maxNewTokens: number;
  maxTurns: number;
  toolsInPrompt: boolean;
  seed: number;
  systemPrompt?: string;
  tools?: Tool[];
}

/** The conversation and the settings the commands change. */
export class ChatSession {
  messages: ChatMessage[] = [];
  temperature: number;
  toolsOn = true;
  private readonly rng: Rng;
  private readonly stopIds: Set<number>;

  constructor(readonly model: CausalLM, readonly tokenizer: Tokenizer, readonly o: ChatOptions) {
    this.temperature = o.temperature;
    this.rng = new Rng(o.seed);
    this.stopIds = stopTokenIds(tokenizer);
    this.reset();
  }

  reset(): void {
    this.messages = [{ role: "system", content: this.o.systemPrompt ?? systemPromptFor(this.o.tools ?? [calculatorTool]) }];
  }

  /** One user message → the streamed reply (tool calls shown through `write` as they run). The
   *  conversation keeps the reply, also when interrupted (what was written so far). */
  async send(text: string, write: (s: string) => void, signal?: AbortSignal): Promise<Trajectory> {
    const streamer = new TokenStreamer(this.tokenizer, this.stopIds, write);
    // Wrapped so each call is shown the moment it returns, before the model reads the result.
    const tools = this.toolsOn
      ? (this.o.tools ?? [calculatorTool]).map((t): Tool => ({
          ...t,
          run: async (args) => {
            const result = await t.run(args);
            streamer.endTurn();
            const shown = typeof args.expression === "string" ? args.expression : JSON.stringify(args);
            write(printable(`[${t.name}] ${shown} → ${result}`) + "\n");
            return result;
          },
        }))
      : [];
    const conversation: ChatMessage[] = [...this.messages, { role: "user", content: text }];
    const [traj] = await rolloutGroups(this.model, this.tokenizer, [conversation], {
      samplesPerPrompt: 1,
      maxNewTokens: this.o.maxNewTokens,
      maxTurns: this.toolsOn ? this.o.maxTurns : 1, // tools off: the first turn is the answer
      temperature: this.temperature,
      topP: this.o.topP,
      topK: 0,
      rng: this.rng,
      tools,
      toolsInPrompt: this.toolsOn && this.o.toolsInPrompt,
      onToken: (_row, id, forced) => streamer.push(id, forced),
      signal,
    });
    streamer.endTurn();
    this.messages = [...conversation, ...trajectoryToMessages(traj, this.toolsOn)];
    return traj;
  }
}

// ---------------------------------------------------------------- flags and the loop

export interface ChatRunConfig extends Omit<ChatOptions, "tools"> {
  /** Tool specs (agents/toolset.ts; default calculator), per-call seconds, output cap. */
  tools?: string[];
  toolTimeout?: number;
  toolMaxChars?: number;
  modelPath: string;
  adapter?: string;
  quantize: Quantize;
  backend: string;
  threads?: ThreadsSpec; // wasm threads (default auto)
  unpackBase?: boolean;
  note?: string; // which checkpoint a preset picked, and why
}

export const TINY_CHAT_PRESET: Record<string, unknown> = { max_new_tokens: 160, max_turns: 5, tools_in_prompt: false };

export function chatCommand(): Command {
  const cmd = new Command()
    .name("chat")
    .description(`Chat with a checkpoint as a tool-using agent. ${CHAT_HELP}`)
    .exitOverride()
    .configureOutput({ outputError: () => {} });
  addToolOptions(addModelOptions(cmd, { modelPath: "Qwen/Qwen2.5-0.5B", quantize: "none" }));
  return cmd
    .option("--adapter <dir>", "PEFT adapter folder to attach to --model_path")
    .option("--temperature <t>", "sampling temperature; 0 = greedy (change with /temp)", parseFloatArg("temperature", 0, 10), 0)
    .option("--top_p <p>", "nucleus sampling mass", parseFloatArg("top_p", 0, 1), 1)
    .option("--max_new_tokens <n>", "token budget per reply over all turns, tool responses included", parseIntArg("max_new_tokens", 1), 512)
    .option("--max_turns <n>", "assistant turns per reply (each tool call starts a new one)", parseIntArg("max_turns", 1), 8);
}

/** argv → config; validates paths, writes nothing. `--preset tiny` picks the most trained tiny
 *  checkpoint that exists: RL (on its NF4 base), else SFT, else the base. */
export async function parseChatArgs(argv: string[]): Promise<ChatRunConfig> {
  const { preset, o, explicit } = parseWithPreset(chatCommand(), argv, { tiny: TINY_CHAT_PRESET });
  let modelPath: string = o.model_path;
  let quantize: Quantize = o.quantize;
  let note: string | undefined;
  if (preset === "tiny" && !explicit("model_path")) {
    const fs = await import("node:fs");
    const order = [...TINY_EVAL_MODELS].reverse(); // rl, sft, base
    const pick = order.find((m) => fs.existsSync(m.modelPath));
    if (!pick) throw new UsageError(`--preset tiny: none of ${order.map((m) => m.modelPath).join(", ")} exists; run make-tiny-base first (base: ${TINY_BASE_DIR})`);
    modelPath = pick.modelPath;
    if (!explicit("quantize")) quantize = pick.quantize;
    const missing = order.slice(0, order.indexOf(pick)).map((m) => m.name);
    note = `tiny preset: chatting with ${pick.name} (${pick.modelPath}, quantize ${quantize})${missing.length ? `; not found: ${missing.join(", ")}` : ""}`;
  }
  await checkModelSource(modelPath, "--model_path", o.adapter);
  return {
    modelPath, adapter: o.adapter, quantize, backend: o.backend, threads: o.threads, unpackBase: o.unpack_base, note,
    temperature: o.temperature, topP: o.top_p, maxNewTokens: o.max_new_tokens, maxTurns: o.max_turns,
    toolsInPrompt: o.tools_in_prompt, seed: o.seed, ...toolConfig(o),
  };
}

export interface ChatIo {
  input: NodeJS.ReadableStream & { isTTY?: boolean };
  output: NodeJS.WritableStream & { isTTY?: boolean };
  err: (line: string) => void;
  /** Called with each finished reply (logging; tests). */
  onReply?: (t: Trajectory) => void;
}

/** The REPL. Resolves when the user exits (/exit, Ctrl-C twice at the prompt, or end of input). */
export async function runChat(cfg: ChatRunConfig, io: ChatIo): Promise<void> {
  if (cfg.note) io.err(cfg.note);
  const toolSet = await openRunTools(cfg, io.err);
  try {
    io.err(`tools: ${toolSet.tools.map((t) => t.name).join(", ") || "(none)"}`);
    await chatLoop(cfg, io, toolSet.tools);
  } finally {
    await toolSet.close();
  }
}

async function chatLoop(cfg: ChatRunConfig, io: ChatIo, tools: Tool[]): Promise<void> {
  const interactive = Boolean(io.input.isTTY && io.output.isTTY);
  const write = (s: string) => void io.output.write(s);
  const dim = (s: string) => `\x1b[2m${s}\x1b[0m`;
  // Notes about the session: dimmed in the terminal; on stderr when piped, so stdout holds only replies.
  const note = (s: string) => (interactive ? write(dim(`${s}\n`)) : io.err(s));
  if (cfg.note) io.err(cfg.note);
  const policy = await openPolicy({ modelPath: cfg.modelPath, adapter: cfg.adapter, quantize: cfg.quantize, seed: cfg.seed, backend: cfg.backend, threads: cfg.threads, unpackBase: cfg.unpackBase });
  const session = new ChatSession(policy.model, policy.tokenizer, { ...cfg, tools });
  const rl = readline.createInterface({ input: io.input, output: interactive ? io.output : undefined, terminal: interactive, prompt: "you> " });
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
          else if (t.truncated) note(`(stopped at --max_new_tokens ${cfg.maxNewTokens})`);
          else if (t.finishReason === "max_turns") note(`(stopped at --max_turns ${cfg.maxTurns})`);
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
    policy.model.dispose();
  }
}
