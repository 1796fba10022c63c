/** AgentGym's TextCraft server, as recorded from agentenv-textcraft at commit 3ef9235
 *  (test/fixtures/agentgym/textcraft.json) and replayed over real HTTP: the family picked from its
 *  banner, the start-up probe's real reset, a wrong family named at once, episodes in AgentGym's own
 *  prompt and action format scored by its own rule, every instance closed (also on abort), the steps
 *  of one turn overlapping, and the task ranges checked against its 544 tasks. Also the other
 *  families' parsers and scores on their clients' own examples, and a first observation too long
 *  for the context failing its row alone. */
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import { missingFields } from "../../src/envs/agentgym.ts";
import {
  checkTaskRange,
  defaultTaskRanges,
  environmentTasks,
  episodePrompt,
  openEnvironmentServer,
  openEpisodes,
} from "../../src/envs/episodes.ts";
import { actionLine, FAMILIES, reactAction } from "../../src/envs/families.ts";
import type { Environment } from "../../src/envs/types.ts";
import type { Tokenizer } from "../../src/model/types.ts";
import { rolloutGroups } from "../../src/rollout/rollout.ts";
import { evaluate } from "../../src/run/evaluate.ts";
import { Rng } from "../../src/util/rng.ts";
import { qwenTokenizer } from "../rollout/helpers/qwen-tokenizer.ts";
import { ScriptedModel } from "../rollout/helpers/scripted-model.ts";
import { replayAgentGym, type ReplayServer } from "./helpers/agentgym-replay.ts";

const FIXTURE = "test/fixtures/agentgym/textcraft.json";
const open = { timeoutMs: 30_000, maxChars: 4_000 };
const servers: ReplayServer[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
});
async function replay(o: Parameters<typeof replayAgentGym>[1] = {}) {
  const s = await replayAgentGym(FIXTURE, o);
  servers.push(s);
  return s;
}

let tok: Tokenizer;
beforeAll(async () => {
  tok = await qwenTokenizer();
});
/** The stand-in counts assistant headers to know its turn: AgentGym's prompt already holds one (the
 *  acknowledgement), so its scripts start with a turn that is never played. */
const scripted = (scripts: string[][], agentGymPrompt = true) =>
  new ScriptedModel({
    vocabSize: tok.vocabSize,
    eosTokenId: tok.eosTokenId,
    header: tok.encode("<|im_start|>assistant\n"),
    scripts: scripts.map((turns) => [...(agentGymPrompt ? ["(in the prompt)"] : []), ...turns].map((t) => tok.encode(t))),
  });
/** A turn in AgentGym's ReAct layout: the action on the line after "Action:". */
const turn = (thought: string, action: string) => `Thought:\n${thought}\n\nAction:\n${action}`;

describe("the start-up probe", () => {
  it("auto picks TextCraft from its banner; the probe creates, resets and closes one instance", async () => {
    const s = await replay();
    const factory = await openEnvironmentServer(s.url, { dialect: "auto", ...open });
    expect(factory.family?.name).toBe("textcraft");
    expect([s.created, s.open.size]).toEqual([1, 0]);
  });

  it("a wrong family fails at once, naming the field; FastAPI's 422 is read for the field it wanted", async () => {
    const s = await replay();
    await expect(openEnvironmentServer(s.url, { dialect: "sqlgym", ...open })).rejects.toThrow(
      /^--env http:\/\/127\.0\.0\.1:\d+: environment .*\/create: reply has no env_idx: \{"id":0,.*\(is the server running, and is --env_dialect sqlgym its family\?\)$/,
    );
    expect(s.open.size).toBe(1); // the server made one; a client that cannot name it cannot close it
    // The recorded 422 for a WebShop/SQLGym-shaped reset (pydantic 1), and pydantic 2's shape.
    const recorded = '{"detail": [{"loc": ["body", "id"], "msg": "field required", "type": "value_error.missing"}]}';
    expect(missingFields(recorded)).toBe('the server requires "id" (field required)');
    expect(
      missingFields('{"detail":[{"type":"missing","loc":["body","item_id"],"msg":"Field required","input":{"env_idx":0,"data_idx":3}}]}'),
    ).toBe('the server requires "item_id" (Field required)');
    expect(missingFields("Internal Server Error")).toBe("the server refused the request: Internal Server Error");
  });

  it("a probe on a task the server refuses, or a dead server, is a usage error", async () => {
    const s = await replay();
    await expect(openEnvironmentServer(s.url, { dialect: "textcraft", ...open, probeIdx: 5 })).rejects.toThrow(
      /\/reset: HTTP 500 .*not recorded: reset .*data_idx.*5\}/,
    );
    expect(s.open.size).toBe(0);
    const url = s.url;
    await s.close();
    await expect(openEnvironmentServer(url, { dialect: "textcraft", ...open })).rejects.toThrow(
      /^--env http:\/\/127\.0\.0\.1:\d+: environment .*\/create: connect ECONNREFUSED/,
    );
  });
});

describe("episodes against TextCraft", () => {
  it("AgentGym's prompt and action format; success by TextCraft's rule; every instance closed", async () => {
    const s = await replay();
    const factory = await openEnvironmentServer(s.url, { dialect: "textcraft", ...open });
    // Task 0 × 2: won in two actions (the first with the trailing period TextCraft would not find).
    // Task 3 × 2: three useless actions; the second row first writes two actions, which the client
    // refuses itself, as AgentGym's does, without stepping the server.
    const win = [turn("I need a blue orchid.", "get 1 blue orchid."), turn("Now craft it.", "craft 1 light blue dye using 1 blue orchid")];
    const lose = [
      turn("Look first.", "inventory"),
      turn("Glass.", "get 8 glass"),
      turn("Craft.", "craft 8 green stained glass using 8 glass, 1 green dye"),
    ];
    const model = scripted([win, win, lose, ["Action: inventory\nAction: get 8 glass", ...lose]]);
    const before = tf.memory().numTensors;
    const r = await evaluate(model, tok, environmentTasks([0, 3]), {
      samplesPerPrompt: 2,
      temperature: 1,
      batchSize: 2,
      maxNewTokens: 400,
      maxTurns: 3,
      toolsInPrompt: false,
      seed: 0,
      tools: [],
      envs: factory,
    });
    expect(tf.memory().numTensors).toBe(before);
    const [won, lost] = r.questions;
    expect(won.question).toMatch(/^Crafting commands:\n[\s\S]*\n\nGoal: craft light blue dye\.$/);
    expect(won.samples.map((x) => [x.strict, x.envReward, x.formatValid])).toEqual([
      [true, 1, true],
      [true, 1, true],
    ]);
    expect(won.samples[0].turns.map((t) => [t.action, t.observation, t.reward])).toEqual([
      ["get 1 blue orchid", "Got 1 blue orchid", 0],
      ["craft 1 light blue dye using 1 blue orchid", "Crafted 1 minecraft:light_blue_dye", 1],
    ]);
    expect(lost.samples.map((x) => [x.strict, x.envReward, x.envError])).toEqual([
      [false, 0, undefined],
      [false, 0, undefined],
    ]);
    expect(lost.samples[1].turns[0]).toMatchObject({
      action: "",
      observation: "Error: Only one 'Action' is allowed per response. Please adjust your response.",
    });
    expect(lost.samples[1].turns.at(-1)!.observation).toBe("Got 8 glass"); // max_turns 3: the refused turn, then two of the three
    expect(r.strict.value).toBe(0.5);
    expect(r.envErrorRate).toBe(0);
    expect([s.created, s.open.size]).toEqual([5, 0]); // the probe's and the four rows', all closed
  });

  it("the prompt is AgentGym's conversation: its instruction, the acknowledgement, the observation", async () => {
    const s = await replay();
    const factory = await openEnvironmentServer(s.url, { dialect: "auto", ...open });
    const episodes = await openEpisodes(factory, [0], 1);
    const model = scripted([[turn("x", "get 1 blue orchid")]]);
    const [t] = await rolloutGroups(
      model,
      tok,
      episodes.observations.map((o) => episodePrompt(factory, o)),
      {
        samplesPerPrompt: 1,
        maxNewTokens: 100,
        maxTurns: 1,
        temperature: 1,
        topP: 1,
        topK: 0,
        rng: new Rng(0),
        tools: [],
        envs: episodes.envs,
      },
    );
    await episodes.close();
    const prompt = tok.decode(t.promptIds);
    expect(prompt).toContain(
      '<|im_start|>user\nYou are given few useful crafting recipes to craft items in Minecraft. Crafting commands are of the format "craft [target object] using [input ingredients]".',
    );
    expect(prompt).toContain(
      `<|im_start|>assistant\nOK. I'll follow your instructions and try my best to solve the task.<|im_end|>\n<|im_start|>user\n${episodes.observations[0]}<|im_end|>\n<|im_start|>assistant\n`,
    );
    expect(t).toMatchObject({ finishReason: "max_turns", envReward: 0, envSuccess: false });
    expect(s.open.size).toBe(0);
  });

  it("the steps of rows closing their turns at different tokens overlap: the server sees all four at once", async () => {
    // The replay answers a step only once 4 wait together (else after 10 s): stepping the rows one
    // after another would show 1 at a time.
    const s = await replay({ barrier: 4, barrierTimeoutMs: 10_000 });
    const factory = await openEnvironmentServer(s.url, { dialect: "textcraft", ...open });
    const episodes = await openEpisodes(factory, [0], 4);
    const thoughts = ["Hm.", "I need the orchid first.", "The recipe says one blue orchid makes one light blue dye, so get it.", "Get it."];
    const model = scripted(
      thoughts.map((th) => [turn(th, "get 1 blue orchid"), turn("Craft.", "craft 1 light blue dye using 1 blue orchid")]),
    );
    const out = await rolloutGroups(
      model,
      tok,
      episodes.observations.map((o) => episodePrompt(factory, o)),
      {
        samplesPerPrompt: 4,
        maxNewTokens: 300,
        maxTurns: 3,
        temperature: 1,
        topP: 1,
        topK: 0,
        rng: new Rng(0),
        tools: [],
        envs: episodes.envs,
      },
    );
    await episodes.close();
    expect(s.maxConcurrentSteps).toBe(4);
    expect(out.map((t) => [t.finishReason, t.envReward, t.envSuccess])).toEqual(Array(4).fill(["stop", 1, true]));
    // A held row read nothing while it waited: its transcript is exactly its turns and observations.
    expect(tok.decode(out[0].completionIds)).toBe(
      `${turn("Hm.", "get 1 blue orchid")}<|im_end|>\n<|im_start|>user\nGot 1 blue orchid<|im_end|>\n<|im_start|>assistant\n${turn("Craft.", "craft 1 light blue dye using 1 blue orchid")}<|im_end|>`,
    );
  });

  it("an abort while steps are in flight ends every row and still closes every instance", async () => {
    // Steps wait 1.5 s at the server; Ctrl-C comes once both rows' steps are there.
    const ctl = new AbortController();
    const s = await replay({ barrier: 99, barrierTimeoutMs: 1_500, onStep: (n) => n === 2 && ctl.abort() });
    const factory = await openEnvironmentServer(s.url, { dialect: "textcraft", ...open });
    const episodes = await openEpisodes(factory, [0], 2);
    const model = scripted([[turn("a", "get 1 blue orchid")], [turn("b", "get 1 blue orchid")]]);
    const out = await rolloutGroups(
      model,
      tok,
      episodes.observations.map((o) => episodePrompt(factory, o)),
      {
        samplesPerPrompt: 2,
        maxNewTokens: 300,
        maxTurns: 3,
        temperature: 1,
        topP: 1,
        topK: 0,
        rng: new Rng(0),
        tools: [],
        envs: episodes.envs,
        signal: ctl.signal,
      },
    );
    await episodes.close();
    expect(out.map((t) => t.finishReason)).toEqual(["aborted", "aborted"]);
    expect(out.map((t) => t.turns.map((x) => x.observation))).toEqual([[undefined], [undefined]]); // ended while stepping
    expect(s.open.size).toBe(0);
  });
});

describe("GRPO against TextCraft on the tiny model", () => {
  it("prompts past the 1,024-token context fail their rows, not the run: it stops with a checkpoint to resume", async () => {
    const { runGrpo } = await import("../../src/run/grpo-run.ts");
    const { promises: fs } = await import("node:fs");
    const path = await import("node:path");
    const { tinyEnvRunConfig } = await import("./helpers/tiny-env-run.ts");
    const s = await replay();
    const cfg = await tinyEnvRunConfig(s.url, "auto", { env_tasks: "0,3", env_max_failed_steps: 1, max_steps: 2 });
    await expect(runGrpo(cfg)).rejects.toThrow(
      /^environment .*: every rollout failed in 1 steps in a row \(last: the first observation makes a prompt of \d+ tokens; with maxNewTokens 128 it passes the model's context of 1024 tokens\); stopped after step 1 and saved checkpoint-1 and report\.html in .*; continue with --resume once the server answers$/,
    );
    const run = JSON.parse(await fs.readFile(path.join(cfg.output_dir, "run.json"), "utf8"));
    expect(JSON.stringify(run)).toContain('"env_eval_tasks":"272-543"'); // TextCraft's upper half, by default
    expect(await fs.readdir(cfg.output_dir)).toContain("checkpoint-1");
    expect(s.open.size).toBe(0);
    await fs.rm(path.dirname(cfg.output_dir), { recursive: true, force: true });
  }, 120_000);
});

describe("task ranges against the environment's size", () => {
  it("TextCraft's 544 tasks: the held-out default is its upper half; ranges past it are refused (they wrap)", () => {
    expect(defaultTaskRanges(FAMILIES.textcraft, 100)).toEqual({ train: "0-99", heldOut: "272-543", evaluate: "272-371" });
    expect(defaultTaskRanges(FAMILIES.textcraft, 400)).toEqual({ train: "0-271", heldOut: "272-543", evaluate: "272-543" });
    expect(defaultTaskRanges(FAMILIES.id, 100)).toEqual({ train: "0-99", heldOut: "1000-1999", evaluate: "1000-1099" });
    expect(() => checkTaskRange(FAMILIES.textcraft, "--env_eval_tasks", "1000-1999")).toThrow(
      "--env_eval_tasks 1000-1999: the textcraft server has 544 tasks (data_idx 0-543); data_idx 1000-1999 would repeat tasks 456… (it wraps them modulo 544)",
    );
    expect(() => checkTaskRange(FAMILIES.textcraft, "--env_tasks", "0-543")).not.toThrow();
    expect(() => checkTaskRange(FAMILIES.id, "--env_tasks", "0-99999")).not.toThrow(); // no known size
  });
});

describe("the families' action formats and scores, on their clients' own examples", () => {
  const act = (p: ReturnType<typeof actionLine>) => ("action" in p ? p.action : `invalid: ${p.invalid}`);
  it("TextCraft/BabyAI: the one Action:, same or next line, letters, digits, commas and spaces only", () => {
    expect(act(actionLine("Thought:\nI need sticks.\n\nAction:\nget 2 oak planks.\n"))).toBe("get 2 oak planks");
    expect(act(actionLine("Action: craft 1 golden carrot using 8 gold nugget, 1 carrot"))).toBe(
      "craft 1 golden carrot using 8 gold nugget, 1 carrot",
    );
    expect(act(actionLine("no action here"))).toBe("");
    expect(act(actionLine("Action: a\nAction: b"))).toMatch(/^invalid: Error: Only one 'Action' is allowed/);
  });
  it("ReAct (SciWorld, ALFWorld, WebShop): everything after the last Action:; WebShop's bare search[…]", () => {
    expect(act(reactAction("Thought:\nI think ...\n\nAction: \nclick[something]"))).toBe("click[something]");
    expect(act(reactAction("search[red shoes]"))).toBe("");
    expect(act(reactAction("search[red shoes]", true))).toBe("search[red shoes]");
    expect(act(FAMILIES.sqlgym.action("Thought: count.\n\nAction: ```sql\nSELECT COUNT(*) FROM t;\n```"))).toBe("SELECT COUNT(*) FROM t;");
  });
  it("scores: the last reward; BabyAI's score below 1 is a success when done; SciWorld's 0-100 score", () => {
    expect(FAMILIES.textcraft.score({ reward: 1 }, 1, true)).toEqual({ score: 1, success: true });
    expect(FAMILIES.babyai.score({ reward: 0.82, score: 0.82 }, 0.82, true)).toEqual({ score: 0.82, success: true });
    expect(FAMILIES.babyai.score({ reward: 0, score: 0 }, 0, false)).toEqual({ score: 0, success: false });
    expect(FAMILIES.sciworld.score({ reward: 25, score: 100 }, 100, true)).toEqual({ score: 1, success: true });
    expect(FAMILIES.sciworld.score({ reward: 8, score: 33 }, 33, false)).toEqual({ score: 0.33, success: false });
    expect(FAMILIES.alfworld.resetBody(7)).toEqual({ game: 7, world_type: "Text" });
    expect(FAMILIES.sqlgym.resetBody(7)).toEqual({ item_id: 7 });
    expect(FAMILIES.webshop.resetBody(7)).toEqual({ session_id: 7 });
    expect(
      FAMILIES.sciworld.firstObservation({
        task_description: "Your task is to boil water.",
        observation: "This room is called the kitchen.",
      }),
    ).toBe("Your task is to boil water.\nThis room is called the kitchen.");
    expect(
      FAMILIES.alfworld.firstObservation({ observation: "You are in the middle of a room.", available_actions: ["go to desk 1", "look"] }),
    ).toBe("You are in the middle of a room.\nAVAILABLE ACTIONS: go to desk 1,look");
  });
});

describe("a first observation too long for the context", () => {
  it("fails its row alone (env_error, nothing decoded for it); the other rows play", async () => {
    const env = (obs: string): Environment => ({
      reset: async () => obs,
      close: async () => {},
      step: async () => ({ action: "x", observation: "done", reward: 1, done: true, score: 1, success: true }),
    });
    const long = "word ".repeat(5000); // ~5,000 tokens; the stand-in's context is 4,096
    const model = scripted([["Action: x"], ["Action: x"], ["Action: x"], ["Action: x"]], false);
    const out = await rolloutGroups(
      model,
      tok,
      [episodePrompt({ label: "t", create: async () => env("") }, long), [{ role: "user", content: "short" }]],
      {
        samplesPerPrompt: 2,
        maxNewTokens: 50,
        maxTurns: 2,
        temperature: 1,
        topP: 1,
        topK: 0,
        rng: new Rng(0),
        tools: [],
        envs: [env(long), env(long), env("short"), env("short")],
      },
    );
    expect(out.slice(0, 2).map((t) => [t.finishReason, t.completionIds.length])).toEqual([
      ["env_error", 0],
      ["env_error", 0],
    ]);
    expect(out[0].envError).toMatch(
      /^the first observation makes a prompt of \d+ tokens; with maxNewTokens 50 it passes the model's context of 4096 tokens$/,
    );
    expect(out.slice(2).map((t) => [t.finishReason, t.envReward])).toEqual([
      ["stop", 1],
      ["stop", 1],
    ]);
  });
});
