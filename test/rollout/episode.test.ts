/** The turn rules are written once (rollout/episode.ts): the token loop (rolloutGroups, one token a
 *  step) and the turn loop (turnRollouts, a turn at a time from a completer) given the same model
 *  text produce the same ids, loss masks, forced tokens, turn records and finish reasons, with tools
 *  and with environments, including budgets that run out inside a turn and inside a tool response. */
import { beforeAll, describe, expect, it } from "vitest";
import type { Tool } from "../../src/agents/types.ts";
import { EnvError, failedEnvironment, type Environment } from "../../src/envs/types.ts";
import type { ChatMessage, Tokenizer } from "../../src/model/types.ts";
import { Episodes } from "../../src/rollout/episode.ts";
import { rolloutGroups, type RolloutConfig, type Trajectory } from "../../src/rollout/rollout.ts";
import { turnRollouts, type TurnCompleter } from "../../src/rollout/turns.ts";
import { Rng } from "../../src/util/rng.ts";
import { qwenTokenizer } from "./helpers/qwen-tokenizer.ts";
import { ScriptedModel } from "./helpers/scripted-model.ts";

let tok: Tokenizer;
beforeAll(async () => {
  tok = await qwenTokenizer();
});

const add: Tool = {
  name: "add",
  description: "a + b",
  parameters: { type: "object", properties: { a: { type: "number" }, b: { type: "number" } } },
  async run(args) {
    return String(Number(args.a) + Number(args.b));
  },
};
const call = (a: number, b: number) => `<tool_call>\n{"name": "add", "arguments": {"a": ${a}, "b": ${b}}}\n</tool_call>`;

/** The turn loop's completer on the same scripts as ScriptedModel: row r's k-th request gets turn k's
 *  text and the stop token, cut to the room it is given. */
function scriptedTurns(scripts: number[][][]): TurnCompleter {
  const asked = new Map<number, number>();
  return {
    async complete(row, _ids, p) {
      const k = asked.get(row) ?? 0;
      asked.set(row, k + 1);
      const turn = [...scripts[row][Math.min(k, scripts[row].length - 1)], tok.eosTokenId];
      const ids = turn.slice(0, p.maxTokens);
      return { ids, logprobs: ids.map(() => 0), finishReason: ids.length < turn.length ? "length" : "stop" };
    },
  };
}

type Stream = [number, number, boolean][];

/** Both loops on the same scripts and config; each with the tokens onToken saw. */
async function bothLoops(
  scripts: number[][][],
  prompts: ChatMessage[][],
  over: Partial<RolloutConfig>,
  envs?: () => Environment[],
): Promise<[Trajectory[], Stream, Trajectory[], Stream]> {
  const cfg = (stream: Stream): RolloutConfig => ({
    samplesPerPrompt: 2,
    maxNewTokens: 200,
    maxTurns: 3,
    temperature: 1,
    topP: 1,
    topK: 0,
    rng: new Rng(1),
    tools: [add],
    envs: envs?.(),
    onToken: (r, id, forced) => stream.push([r, id, forced]),
    ...over,
  });
  const header = tok.encode("<|im_start|>assistant\n");
  const model = new ScriptedModel({ vocabSize: tok.vocabSize, eosTokenId: tok.eosTokenId, header, scripts });
  const [a, b]: Stream[] = [[], []];
  const tokenLoop = await rolloutGroups(model, tok, prompts, cfg(a));
  const turnLoop = await turnRollouts(scriptedTurns(scripts), tok, prompts, { ...cfg(b), seed: 1, maxPositions: 4096 });
  const byRow = (s: Stream) => [...s].sort((x, y) => x[0] - y[0]); // one row's tokens keep their order
  return [tokenLoop, byRow(a), turnLoop, byRow(b)];
}

const view = (t: Trajectory) => {
  const { sampleLogprobs, ...rest } = t;
  return { ...rest, sampleLogprobs: sampleLogprobs.map((x) => (x === 0 ? 0 : x)) }; // -0 from log 1
};

describe("one episode, two loops", () => {
  it("gives the same masks, forced tokens, turn ends and finish reasons through the token loop and the turn loop", async () => {
    const scriptText: string[][] = [
      ["Let me add.\n" + call(2, 3), "So \\boxed{5}."], // a call, its result forced, then the answer
      ['<tool_call>\n{"name": "add", "arguments": \n</tool_call>', "\\boxed{1}"], // malformed: the error is forced
      [call(1, 1)], // calls every turn: max_turns
      ["one two three ".repeat(80)], // the budget runs out inside the first turn
      [call(1, 2) + "\n" + call(3, 4), "\\boxed{10}"], // two calls in one turn, two results forced
      ["\\boxed{7}"], // answers at once
    ];
    const scripts = scriptText.map((turns) => turns.map((t) => tok.encode(t)));
    const prompts = [0, 1, 2].map((i) => [{ role: "user" as const, content: `Question ${i}?` }]);
    const [a, sa, b, sb] = await bothLoops(scripts, prompts, {});
    expect(a.map((t) => t.finishReason)).toEqual(["stop", "stop", "max_turns", "length", "stop", "stop"]);
    expect(b.map(view)).toEqual(a.map(view));
    expect(sb).toEqual(sa);
    // the forced tokens are the rendered tool message and the next header, mask 0
    const forced = a[0].completionIds.filter((_, i) => a[0].lossMask[i] === 0);
    expect(tok.decode(forced)).toBe("\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    expect(a[4].turns[0].toolCalls.map((c) => c.result)).toEqual(["3", "7"]);
    expect(a[2].turns.length).toBe(3);
    expect([a[3].turns[0].ended, a[3].completionIds.length, a[3].truncated]).toEqual([false, 200, true]);
  });

  it("ends a row whose budget runs out inside a tool response the same way in both loops", async () => {
    const first = tok.encode("Let me add.\n" + call(20, 22));
    const scripts = [[first, tok.encode("\\boxed{42}")]];
    const budget = first.length + 1 + 5; // the turn, its stop token and 5 of the tool response's tokens
    const [a, sa, b, sb] = await bothLoops(scripts, [[{ role: "user", content: "q" }]], { samplesPerPrompt: 1, maxNewTokens: budget });
    expect(b.map(view)).toEqual(a.map(view));
    expect(sb).toEqual(sa);
    expect([a[0].finishReason, a[0].completionIds.length, a[0].lossMask.slice(-6)]).toEqual(["length", budget, [1, 0, 0, 0, 0, 0]]);
    expect(a[0].turns.map((t) => t.ended)).toEqual([true]); // the call was run; no turn was started after it
  });

  it("runs environment episodes the same way in both loops: observations forced, done, failures", async () => {
    // An environment that answers "heard N" and is done when the turn says "bye"; row 2's never
    // started; row 3's fails at its second step.
    const envs = (): Environment[] =>
      [0, 1, 2, 3].map((r) => {
        if (r === 2) return failedEnvironment("could not create");
        let n = 0;
        return {
          reset: async () => "start",
          close: async () => {},
          step: async (turn: string) => {
            if (r === 3 && ++n === 2) throw new EnvError("server gone");
            const done = turn.includes("bye");
            return { action: turn, observation: `heard ${turn.length}`, reward: done ? 1 : 0, done, score: done ? 1 : 0, success: done };
          },
        };
      });
    const scriptText = [["hello", "bye"], ["la", "la", "la"], ["x"], ["one", "two"]];
    const scripts = scriptText.map((turns) => turns.map((t) => tok.encode(t)));
    const prompts = [0, 1].map((i) => [{ role: "user" as const, content: `Task ${i}` }]);
    const [a, sa, b, sb] = await bothLoops(scripts, prompts, { tools: [] }, envs);
    expect(a.map((t) => t.finishReason)).toEqual(["stop", "max_turns", "env_error", "env_error"]);
    expect(a.map((t) => t.envError)).toEqual([undefined, undefined, "could not create", "server gone"]);
    expect(b.map(view)).toEqual(a.map(view));
    expect(sb).toEqual(sa);
    const forced = a[0].completionIds.filter((_, i) => a[0].lossMask[i] === 0);
    expect(tok.decode(forced)).toBe("\n<|im_start|>user\nheard 5<|im_end|>\n<|im_start|>assistant\n");
  });

  it("numbers the rows p·G + g, each carrying its group, and checks the configuration once for both loops", () => {
    const prompts = [0, 1, 2].map((i) => [{ role: "user" as const, content: `Question ${i}?` }]);
    const base = { samplesPerPrompt: 2, maxNewTokens: 10, maxTurns: 2, tools: [add] };
    const ep = new Episodes(tok, prompts, base, 4096);
    expect(ep.rows.map((r) => [r.index, r.traj.promptIndex, r.traj.sampleIndex])).toEqual([
      [0, 0, 0],
      [1, 0, 1],
      [2, 1, 0],
      [3, 1, 1],
      [4, 2, 0],
      [5, 2, 1],
    ]);
    expect(() => new Episodes(tok, [], base, 4096)).toThrow(/at least one prompt; got 0/);
    expect(() => new Episodes(tok, prompts, { ...base, maxTurns: 0 }, 4096)).toThrow(/maxTurns 0 is invalid/);
    expect(() => new Episodes(tok, prompts, { ...base, tools: [add, add] }, 4096)).toThrow(/"add" appears twice/);
    expect(() => new Episodes(tok, prompts, { ...base, envs: [] }, 4096)).toThrow(/0 environments for 3 prompts × 2 samples/);
    expect(() => new Episodes(tok, prompts, base, 20)).toThrow(/longest prompt \(\d+ tokens\) \+ maxNewTokens 10 exceeds/);
  });
});
