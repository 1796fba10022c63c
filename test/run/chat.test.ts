/** The chat REPL's pieces: command parsing, trajectory → chat messages, incremental decoding of
 *  multi-byte text, the rollout's streaming and abort hooks, a scripted agent turn with a real
 *  calculator call, one session using the built-in calculator and an MCP server's tool together, and
 *  the script fed by piped stdin. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { PassThrough } from "node:stream";
import * as tf from "@tensorflow/tfjs";
import { shutdownCalculator } from "../../src/agents/calculator.ts";
import { SYSTEM_PROMPT } from "../../src/agents/prompts.ts";
import { createModel } from "../../src/model/load.ts";
import type { Qwen2ForCausalLM } from "../../src/model/qwen2.ts";
import { loadTokenizerFromDir } from "../../src/model/tokenizer.ts";
import type { Tokenizer } from "../../src/model/types.ts";
import { rolloutGroups, type Trajectory } from "../../src/rollout/rollout.ts";
import {
  ChatSession,
  parseChatArgs,
  parseChatCommand,
  printable,
  runChat,
  TokenStreamer,
  trajectoryToMessages,
  type ChatRunConfig,
  type OpenChatModel,
} from "../../src/run/chat.ts";
import { Rng } from "../../src/util/rng.ts";
import { ScriptedModel } from "../rollout/helpers/scripted-model.ts";
import { makeSmallModelDir, SMALL_MODEL_CONFIG } from "./helpers/tiny-fixture.ts";

let modelDir: string;
let tok: Tokenizer;
let model: Qwen2ForCausalLM;
beforeAll(async () => {
  modelDir = await makeSmallModelDir("chat-model-");
  tok = await loadTokenizerFromDir(modelDir);
  model = await createModel({ ...SMALL_MODEL_CONFIG, vocabSize: tok.vocabSize }, { seed: 5 });
});
afterAll(async () => {
  model?.dispose();
  await shutdownCalculator();
});

describe("parseChatCommand", () => {
  it("reads commands and their arguments, and everything else as a message", () => {
    expect(parseChatCommand("  What is 2+3? ")).toEqual({ kind: "message", text: "What is 2+3?" });
    expect(parseChatCommand("")).toEqual({ kind: "empty" });
    expect(parseChatCommand("/reset")).toEqual({ kind: "reset" });
    expect(parseChatCommand("/exit")).toEqual({ kind: "exit" });
    expect(parseChatCommand("/temp 0.7")).toEqual({ kind: "temp", value: 0.7 });
    expect(parseChatCommand("/temp 0")).toEqual({ kind: "temp", value: 0 });
    expect(parseChatCommand("/tools off")).toEqual({ kind: "tools", on: false });
    expect(parseChatCommand("/tools   on")).toEqual({ kind: "tools", on: true });
  });
  it("rejects bad arguments with the value and what is accepted", () => {
    expect(parseChatCommand("/temp abc")).toEqual({
      kind: "invalid",
      message: '/temp "abc": expected one number between 0 and 10 (0 = greedy)',
    });
    expect(parseChatCommand("/temp")).toMatchObject({ kind: "invalid" });
    expect(parseChatCommand("/temp -1")).toMatchObject({ kind: "invalid" });
    expect(parseChatCommand("/temp 0.5 1")).toMatchObject({ kind: "invalid" });
    expect(parseChatCommand("/tools maybe")).toEqual({ kind: "invalid", message: '/tools "maybe": expected on or off' });
    expect(parseChatCommand("/reset now")).toMatchObject({ kind: "invalid" });
    expect(parseChatCommand("/nope")).toMatchObject({
      kind: "invalid",
      message: expect.stringMatching(/^unknown command \/nope; commands: /),
    });
  });
});

const traj = (turns: Trajectory["turns"]): Trajectory => ({
  promptIndex: 0,
  sampleIndex: 0,
  promptIds: [],
  completionIds: [],
  lossMask: [],
  sampleLogprobs: [],
  turns,
  finalText: "",
  finishReason: "stop",
  truncated: false,
  numToolCalls: 0,
  numToolErrors: 0,
  numParseErrors: 0,
  numUnknownTools: 0,
});

describe("trajectoryToMessages", () => {
  const call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "16-3"}}\n</tool_call>';
  it("turns tool calls into assistant tool_calls plus tool messages, and the answer into plain content", () => {
    const t = traj([
      {
        text: `First the eggs. ${call}`,
        content: "First the eggs. ",
        toolCalls: [{ name: "calculator", arguments: { expression: "16-3" }, result: "13", error: false }],
        parseErrors: [],
        ended: true,
      },
      { text: "\\boxed{13}", content: "\\boxed{13}", toolCalls: [], parseErrors: [], ended: true },
    ]);
    expect(trajectoryToMessages(t)).toEqual([
      {
        role: "assistant",
        content: "First the eggs.",
        tool_calls: [{ type: "function", function: { name: "calculator", arguments: { expression: "16-3" } } }],
      },
      { role: "tool", content: "13" },
      { role: "assistant", content: "\\boxed{13}" },
    ]);
  });
  it("keeps a malformed turn's raw text and feeds its errors back as tool messages; tools off is plain text", () => {
    const bad = "<tool_call>\n{oops}\n</tool_call>";
    const t = traj([
      { text: bad, content: "", toolCalls: [], parseErrors: ["Error: tool call is not valid JSON"], ended: true },
      { text: "unfinished", content: "unfinished", toolCalls: [], parseErrors: [], ended: false },
    ]);
    expect(trajectoryToMessages(t)).toEqual([
      { role: "assistant", content: bad },
      { role: "tool", content: "Error: tool call is not valid JSON" },
      { role: "assistant", content: "unfinished" },
    ]);
    const off = traj([
      {
        text: `x ${call}`,
        content: "x ",
        toolCalls: [{ name: "calculator", arguments: {}, result: "Error: unknown tool", error: true }],
        parseErrors: [],
        ended: true,
      },
    ]);
    expect(trajectoryToMessages(off, false)).toEqual([{ role: "assistant", content: `x ${call}` }]);
  });
});

describe("TokenStreamer", () => {
  it("prints multi-byte characters whole, in order, and skips forced and stop tokens", () => {
    const text = "Prix: 3×4 € = 12 ✓";
    const ids = tok.encode(text);
    expect(ids.some((id) => tok.decode([id]).includes("\uFFFD"))).toBe(true); // some tokens are partial characters
    const pieces: string[] = [];
    const s = new TokenStreamer(tok, new Set([tok.eosTokenId]), (p) => pieces.push(p));
    for (const id of ids) s.push(id, false);
    s.push(tok.eosTokenId, false);
    for (const id of tok.encode("<tool_response>")) s.push(id, true);
    expect(pieces.join("")).toBe(text + "\n");
    expect(pieces.some((p) => p.includes("\uFFFD"))).toBe(false);
  });
  it("shows control characters from the model as U+FFFD, so it cannot send terminal escapes", () => {
    const pieces: string[] = [];
    const s = new TokenStreamer(tok, new Set([tok.eosTokenId]), (p) => pieces.push(p));
    for (const id of tok.encode("a\x1b]0;owned\x07b\tc\r\n")) s.push(id, false);
    s.endTurn();
    expect(pieces.join("")).toBe("a\uFFFD]0;owned\uFFFDb\tc\uFFFD\n\n");
    expect(printable("x\u009by")).toBe("x\uFFFDy");
  });
});

describe("rollout streaming hooks", () => {
  it("onToken reports every completion token with its forced flag; an aborted signal stops all rows", async () => {
    const seen: Array<[number, number, boolean]> = [];
    const before = tf.memory().numTensors;
    const cfg = { samplesPerPrompt: 2, maxNewTokens: 8, maxTurns: 2, temperature: 1, topP: 1, topK: 0, tools: [], toolsInPrompt: false };
    const out = await rolloutGroups(model, tok, [[{ role: "user", content: "Janet has 16 eggs." }]], {
      ...cfg,
      rng: new Rng(3),
      onToken: (row, id, forced) => seen.push([row, id, forced]),
    });
    for (const [r, t] of out.entries()) {
      const mine = seen.filter((s) => s[0] === r);
      expect(mine.map((s) => s[1])).toEqual(t.completionIds);
      expect(mine.map((s) => (s[2] ? 0 : 1))).toEqual(t.lossMask);
    }
    const ac = new AbortController();
    let n = 0;
    const stopped = await rolloutGroups(model, tok, [[{ role: "user", content: "Janet has 16 eggs." }]], {
      ...cfg,
      maxNewTokens: 50,
      rng: new Rng(3),
      signal: ac.signal,
      onToken: () => {
        if (++n === 3) ac.abort();
      },
    });
    for (const t of stopped) {
      expect(["aborted", "stop"]).toContain(t.finishReason); // stopped by the abort, or had already ended
      expect(t.completionIds.length).toBeLessThanOrEqual(2);
    }
    expect(stopped.some((t) => t.finishReason === "aborted")).toBe(true);
    expect(tf.memory().numTensors).toBe(before);
  });
});

describe("ChatSession", () => {
  it("streams a scripted agent turn, shows the calculator call as it runs, and keeps the conversation", async () => {
    const call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "16-3"}}\n</tool_call>';
    const scripted = new ScriptedModel({
      vocabSize: tok.vocabSize,
      eosTokenId: tok.eosTokenId,
      header: tok.encode("<|im_start|>assistant\n"),
      scripts: [[tok.encode(call), tok.encode("She has \\boxed{13} eggs left.")]],
    });
    const session = new ChatSession(scripted, tok, {
      temperature: 0,
      top_p: 1,
      max_new_tokens: 200,
      max_turns: 3,
      tools_in_prompt: false,
      seed: 0,
    });
    let shown = "";
    const t = await session.send("Janet has 16 eggs and sells 3. How many are left?", (s) => (shown += s));
    expect(shown).toBe(`${call}\n[calculator] 16-3 → 13\nShe has \\boxed{13} eggs left.\n`);
    expect(t.finishReason).toBe("stop");
    expect(session.messages.map((m) => m.role)).toEqual(["system", "user", "assistant", "tool", "assistant"]);
    expect(session.messages[0].content).toBe(SYSTEM_PROMPT);
    expect(session.messages[2].tool_calls?.[0].function).toEqual({ name: "calculator", arguments: { expression: "16-3" } });
    expect(session.messages[3].content).toBe("13");
    session.reset();
    expect(session.messages).toEqual([{ role: "system", content: SYSTEM_PROMPT }]);
  });
});

/** runChat fed `lines` as piped stdin: what it printed, its notes and errors, and each reply. */
async function chatPiped(cfg: ChatRunConfig, lines: string, open?: OpenChatModel) {
  const input = new PassThrough();
  const output = new PassThrough();
  let stdout = "";
  output.on("data", (d) => (stdout += d));
  const errs: string[] = [];
  const replies: Trajectory[] = [];
  input.end(lines);
  await runChat(cfg, { input, output, err: (l) => errs.push(l), onReply: (t) => replies.push(t) }, open);
  return { stdout, errs, replies };
}

describe("runChat with two tool sets", () => {
  it("--tools calculator,mcp:<server>: lists both, and one reply calls each and reads its result", async () => {
    // The project's MCP server (a real process over stdio) serves its calculator as remote_calculator.
    const server = path.resolve("scripts/mcp-tool-server.ts");
    const tools = `calculator,mcp:${JSON.stringify(process.execPath)} --import tsx ${JSON.stringify(server)} --prefix remote_`;
    const cfg = await parseChatArgs([
      "node",
      "chat",
      "--model_path",
      modelDir,
      "--tools",
      tools,
      "--max_new_tokens",
      "400",
      "--backend",
      "wasm",
    ]);
    const call = (name: string, expression: string) =>
      `<tool_call>\n{"name": "${name}", "arguments": {"expression": "${expression}"}}\n</tool_call>`;
    const turns = [call("calculator", "17*23"), call("remote_calculator", "391-58"), "17*23-58 = \\boxed{333}"];
    const scripted = new ScriptedModel({
      vocabSize: tok.vocabSize,
      eosTokenId: tok.eosTokenId,
      header: tok.encode("<|im_start|>assistant\n"),
      scripts: [turns.map((t) => tok.encode(t))],
    });
    const { stdout, errs, replies } = await chatPiped(cfg, "What is 17*23-58?\n", async () => ({ model: scripted, tokenizer: tok }));
    expect(errs).toEqual(["tools: calculator, remote_calculator"]);
    // The transcript a person sees: each call as it runs, with the result the model reads next.
    expect(stdout).toBe(`${turns[0]}\n[calculator] 17*23 → 391\n${turns[1]}\n[remote_calculator] 391-58 → 333\n${turns[2]}\n`);
    const [t] = replies;
    expect(t.turns.flatMap((x) => x.toolCalls.map((c) => [c.name, c.result, c.error]))).toEqual([
      ["calculator", "391", false],
      ["remote_calculator", "333", false],
    ]);
    expect(t).toMatchObject({ finishReason: "stop", numToolCalls: 2, numToolErrors: 0 });
    // Both tools' schemas are in the prompt's <tools> block.
    const prompt = tok.decode(t.promptIds);
    expect(prompt).toMatch(/<tools>[\s\S]*"name": ?"calculator"[\s\S]*"name": ?"remote_calculator"[\s\S]*<\/tools>/);
  }, 120_000);
});

describe("runChat with piped input", () => {
  it("answers each message line, applies commands, and returns at end of input", async () => {
    const cfg = await parseChatArgs(["node", "chat", "--model_path", modelDir, "--max_new_tokens", "4", "--backend", "wasm"]);
    const { stdout, errs, replies } = await chatPiped(cfg, "Janet has 16 eggs.\n/temp 0.7\n/tools off\n\nHow many are left?\n/temp x\n");
    expect(replies).toHaveLength(2);
    expect(errs.filter((l) => !l.startsWith("(stopped at"))).toEqual([
      "tools: calculator",
      "(temperature 0.7)",
      "(tools off)",
      '/temp "x": expected one number between 0 and 10 (0 = greedy)',
    ]);
    expect(stdout).not.toMatch(/\x1b\[|you>/); // no prompts or ANSI when piped
  });

  it("a message too long for the context: one line naming --max_new_tokens and what to do; the session goes on", async () => {
    const cfg = await parseChatArgs(["node", "chat", "--model_path", modelDir, "--max_new_tokens", "4", "--backend", "wasm"]);
    const long = "eggs ".repeat(1100); // more tokens than the model's 1,024 positions
    const { errs, replies } = await chatPiped(cfg, `${long}\nHow many are left?\n`);
    const errors = errs.filter((l) => l.startsWith("error:"));
    expect(errors).toHaveLength(1);
    expect(errors[0]).toMatch(
      /^error: this message makes the prompt \d+ tokens; with --max_new_tokens 4 that passes the model's 1024 positions: send a shorter message, \/reset to start a new conversation, or restart with a lower --max_new_tokens$/,
    );
    expect(replies).toHaveLength(1); // the next message is answered, without the long one in its prompt
    expect(replies[0].promptIds.length).toBeLessThan(1024 - 4);
  });

  it("the script exits 0 at end of piped input", async () => {
    const tsx = path.resolve("node_modules/.bin/tsx");
    const p = spawn(tsx, ["scripts/chat.ts", "--model_path", modelDir, "--max_new_tokens", "3", "--backend", "wasm"], {
      stdio: ["pipe", "pipe", "pipe"],
    });
    let stderr = "";
    p.stderr.on("data", (d) => (stderr += d));
    p.stdin.end("What is 2+3?\n/reset\nAnd 4*5?\n");
    const code = await new Promise<number | null>((resolve) => p.on("close", resolve));
    expect(stderr).not.toMatch(/error/);
    expect(code).toBe(0);
  }, 120_000);
});
