import { beforeAll, describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import type { Tokenizer } from "../../src/model/types.ts";
import type { Tool } from "../../src/agents/types.ts";
import { parseToolCalls } from "../../src/agents/toolcall.ts";
import { rolloutGroups, type RolloutConfig, type RolloutStepInfo } from "../../src/rollout/rollout.ts";
import { ToolResponseRenderer } from "../../src/rollout/tool-messages.ts";
import { Rng } from "../../src/util/rng.ts";
import { qwenTokenizer } from "./helpers/qwen-tokenizer.ts";
import { ScriptedModel } from "./helpers/scripted-model.ts";

let tok: Tokenizer;
beforeAll(async () => {
  tok = await qwenTokenizer();
});

/** Stand-in calculator: integers with + - * left to right, errors as text (as tools report them). */
const calc: Tool = {
  name: "calculator",
  description: "Evaluate an arithmetic expression",
  parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] },
  async run(args) {
    const expr = String(args.expression ?? "");
    if (!/^\d+([-+*]\d+)*$/.test(expr)) return `Error: cannot evaluate ${JSON.stringify(expr)}`;
    const parts = expr.split(/([-+*])/);
    let acc = Number(parts[0]);
    for (let i = 1; i < parts.length; i += 2) {
      const b = Number(parts[i + 1]);
      acc = parts[i] === "+" ? acc + b : parts[i] === "-" ? acc - b : acc * b;
    }
    return String(acc);
  },
};
const crashing: Tool = {
  name: "crash",
  description: "always throws",
  parameters: { type: "object" },
  async run() {
    throw new Error("boom");
  },
};

const call = (name: string, expression: string) =>
  `<tool_call>\n{"name": "${name}", "arguments": {"expression": "${expression}"}}\n</tool_call>`;
const response = (...results: string[]) =>
  `\n<|im_start|>user${results.map((r) => `\n<tool_response>\n${r}\n</tool_response>`).join("")}<|im_end|>\n<|im_start|>assistant\n`;

function config(over: Partial<RolloutConfig> = {}): RolloutConfig {
  return {
    samplesPerPrompt: 2,
    maxNewTokens: 200,
    maxTurns: 3,
    temperature: 1,
    topP: 1,
    topK: 0,
    rng: new Rng(1),
    tools: [calc, crashing],
    ...over,
  };
}

describe("rolloutGroups with a scripted policy", () => {
  it("runs tools in the loop and records ids, masks, log-probs, turns and finish reasons exactly", async () => {
    const long = "one two three ".repeat(60);
    // scripts[row][turn]; rows are promptIndex * G + sampleIndex with G = 2
    const scriptText: string[][] = [
      ["Let me compute.\n" + call("calculator", "16-3-4"), "So \\boxed{9}."], // tool call, then the answer
      ['<tool_call>\n{"name": "calculator", "arguments": \n</tool_call>', "Sorry. \\boxed{1}"], // malformed call
      [call("search", "x"), "\\boxed{2}"], // unknown tool
      [call("calculator", "1+1")], // calls every turn: runs out of turns
      [long], // runs out of tokens inside a turn
      ["Two at once.\n" + call("calculator", "2*3") + "\n" + call("calculator", "7+8"), "\\boxed{21}"], // multi-call turn
      ["\\boxed{5}"], // answers at once: finishes first
      [call("crash", "1"), "done \\boxed{0}"], // a tool that throws
    ];
    const scripts = scriptText.map((turns) => turns.map((t) => tok.encode(t)));
    const model = new ScriptedModel({
      vocabSize: tok.vocabSize,
      eosTokenId: tok.eosTokenId,
      header: tok.encode("<|im_start|>assistant\n"),
      scripts,
    });
    const prompts = [0, 1, 2, 3].map((i) => [{ role: "user" as const, content: `Question ${i}: ${"and more ".repeat(i * 3)}?` }]);
    const steps: RolloutStepInfo[] = [];
    const before = tf.memory().numTensors;
    const out = await rolloutGroups(model, tok, prompts, config({ maxNewTokens: 140, onStep: (s) => steps.push(s) }));
    expect(tf.memory().numTensors).toBe(before);
    expect(model.lastCache!.disposed).toBe(true);

    expect(out.map((t) => [t.promptIndex, t.sampleIndex])).toEqual([
      [0, 0],
      [0, 1],
      [1, 0],
      [1, 1],
      [2, 0],
      [2, 1],
      [3, 0],
      [3, 1],
    ]);
    const schemaPrompt = (i: number) =>
      tok.encode(
        tok.applyChatTemplate(prompts[i], {
          tools: [calc, crashing].map((t) => ({
            type: "function" as const,
            function: { name: t.name, description: t.description, parameters: t.parameters },
          })),
          addGenerationPrompt: true,
        }),
      );
    out.forEach((t) => expect(t.promptIds).toEqual(schemaPrompt(t.promptIndex)));
    expect(tok.decode(out[0].promptIds)).toContain("<tools>");

    // Expected completion: sampled turn ids + stop (mask 1), forced response (mask 0), ...
    const eos = tok.eosTokenId;
    const expectSeq = (row: number, parts: Array<[string, 0 | 1]>, reason: string) => {
      const ids: number[] = [],
        mask: number[] = [];
      for (const [text, m] of parts) {
        const piece = m === 1 ? [...tok.encode(text), eos] : tok.encode(text);
        ids.push(...piece);
        mask.push(...piece.map(() => m));
      }
      const t = out[row];
      expect(tok.decode(t.completionIds)).toBe(tok.decode(ids));
      expect(t.completionIds).toEqual(ids);
      expect(t.lossMask).toEqual(mask);
      expect(t.sampleLogprobs).toEqual(mask.map(() => 0)); // all mass on the scripted token: log 1 = 0
      expect(t.finishReason).toBe(reason);
    };
    const s = scriptText;
    expectSeq(
      0,
      [
        [s[0][0], 1],
        [response("9"), 0],
        [s[0][1], 1],
      ],
      "stop",
    );
    const malformedErr = parseToolCalls(s[1][0]).errors;
    expect(malformedErr.length).toBe(1);
    expectSeq(
      1,
      [
        [s[1][0], 1],
        [response(malformedErr[0]), 0],
        [s[1][1], 1],
      ],
      "stop",
    );
    expect(out[2].turns[0].toolCalls[0].result).toMatch(/unknown tool "search".*calculator, crash/);
    expectSeq(
      2,
      [
        [s[2][0], 1],
        [response(out[2].turns[0].toolCalls[0].result), 0],
        [s[2][1], 1],
      ],
      "stop",
    );
    expectSeq(
      3,
      [
        [s[3][0], 1],
        [response("2"), 0],
        [s[3][0], 1],
        [response("2"), 0],
        [s[3][0], 1],
      ],
      "max_turns",
    );
    expectSeq(
      5,
      [
        [s[5][0], 1],
        [response("6", "15"), 0],
        [s[5][1], 1],
      ],
      "stop",
    );
    expectSeq(6, [[s[6][0], 1]], "stop");
    expect(out[7].turns[0].toolCalls[0]).toEqual({
      name: "crash",
      arguments: { expression: "1" },
      result: 'Error: tool "crash" failed: boom',
      error: true,
    });
    expectSeq(
      7,
      [
        [s[7][0], 1],
        [response('Error: tool "crash" failed: boom'), 0],
        [s[7][1], 1],
      ],
      "stop",
    );

    // Out of tokens inside the first turn: exactly maxNewTokens sampled tokens, an unended turn.
    const t4 = out[4];
    expect(t4.completionIds).toEqual(scripts[4][0].slice(0, 140));
    expect(t4.lossMask).toEqual(new Array(140).fill(1));
    expect([t4.finishReason, t4.truncated, t4.turns.length, t4.turns[0].ended]).toEqual(["length", true, 1, false]);
    expect(t4.finalText).toBe(tok.decode(scripts[4][0].slice(0, 140)));

    // Turn records and counters.
    expect(out[0].turns).toEqual([
      {
        text: s[0][0],
        content: parseToolCalls(s[0][0]).content,
        ended: true,
        parseErrors: [],
        toolCalls: [{ name: "calculator", arguments: { expression: "16-3-4" }, result: "9", error: false }],
      },
      { text: s[0][1], content: s[0][1], ended: true, parseErrors: [], toolCalls: [] },
    ]);
    expect(out[0].finalText).toBe("So \\boxed{9}.");
    expect(out.map((t) => t.truncated)).toEqual([false, false, false, false, true, false, false, false]);
    expect(out.map((t) => t.numToolCalls)).toEqual([1, 0, 1, 3, 0, 2, 0, 1]);
    expect(out.map((t) => t.numToolErrors)).toEqual([0, 0, 1, 0, 0, 0, 0, 1]);
    expect(out.map((t) => t.numParseErrors)).toEqual([0, 1, 0, 0, 0, 0, 0, 0]);
    expect(out[1].turns[0].parseErrors).toEqual(malformedErr);
    expect(out[5].turns[0].toolCalls.map((c) => c.result)).toEqual(["6", "15"]);
    expect(out[3].turns.length).toBe(3);
    expect(out[3].reward).toBeUndefined();

    // Finished rows left the decode batch: the cache was compacted and later steps ran fewer rows.
    expect(model.lastCache!.selects.length).toBeGreaterThan(0);
    expect(Math.min(...model.decodeBatchSizes)).toBeLessThan(8);
    expect(steps[steps.length - 1].live).toBe(0);
    const sampled = steps.reduce((a, x) => a + x.sampled, 0),
      forced = steps.reduce((a, x) => a + x.forced, 0);
    expect(sampled).toBe(out.reduce((a, t) => a + t.lossMask.filter((m) => m === 1).length, 0));
    expect(forced).toBe(out.reduce((a, t) => a + t.lossMask.filter((m) => m === 0).length, 0));
    expect(steps.length).toBe(Math.max(...out.map((t) => t.completionIds.length)));
    // The host sampler (this backend's profile) reads the logits of the rows that sampled, once a step.
    steps.forEach((x) => expect(x.readFloats).toBe(x.sampled * tok.vocabSize));
  });

  it("keeps the sampling log-prob of each sampled token (temperature, top-k renormalisation)", async () => {
    const [a, b] = [tok.encode("a")[0], tok.encode("b")[0]];
    const probs = new Map([
      [a, 0.6],
      [b, 0.3],
      [tok.eosTokenId, 0.1],
    ]);
    const model = new ScriptedModel({ vocabSize: tok.vocabSize, eosTokenId: tok.eosTokenId, header: [], fixed: probs });
    const prompts = [[{ role: "user" as const, content: "write" }]];
    const full = await rolloutGroups(model, tok, prompts, config({ samplesPerPrompt: 4, maxNewTokens: 30, tools: [], rng: new Rng(3) }));
    for (const t of full) {
      t.completionIds.forEach((id, i) => expect(t.sampleLogprobs[i]).toBeCloseTo(Math.log(probs.get(id)!), 5));
      expect(t.lossMask.every((m) => m === 1)).toBe(true);
      expect(t.finishReason).toBe(t.completionIds[t.completionIds.length - 1] === tok.eosTokenId ? "stop" : "length");
    }
    expect(full.some((t) => t.finishReason === "stop")).toBe(true);
    // top-k 2 drops the stop token: every row runs to the budget; log-probs are renormalised over {a, b}.
    const topk = await rolloutGroups(
      model,
      tok,
      prompts,
      config({ samplesPerPrompt: 2, maxNewTokens: 12, topK: 2, tools: [], rng: new Rng(3) }),
    );
    for (const t of topk) {
      expect([t.finishReason, t.completionIds.length]).toEqual(["length", 12]);
      t.completionIds.forEach((id, i) => expect(t.sampleLogprobs[i]).toBeCloseTo(Math.log(probs.get(id)! / 0.9), 5));
    }
    // Same seed, same rollouts.
    const again = await rolloutGroups(model, tok, prompts, config({ samplesPerPrompt: 4, maxNewTokens: 30, tools: [], rng: new Rng(3) }));
    expect(again.map((t) => t.completionIds)).toEqual(full.map((t) => t.completionIds));
  });

  it("handles a turn that is only a stop token (empty final answer)", async () => {
    const model = new ScriptedModel({
      vocabSize: tok.vocabSize,
      eosTokenId: tok.eosTokenId,
      header: tok.encode("<|im_start|>assistant\n"),
      scripts: [[[]]],
    });
    const [t] = await rolloutGroups(model, tok, [[{ role: "user", content: "q" }]], config({ samplesPerPrompt: 1 }));
    expect([t.completionIds, t.lossMask, t.finishReason, t.finalText, t.turns.length]).toEqual([[tok.eosTokenId], [1], "stop", "", 1]);
  });

  it("unpacks a quantized base for the rollout and releases it after, also when the rollout fails", async () => {
    const events: string[] = [];
    const model = new ScriptedModel({
      vocabSize: tok.vocabSize,
      eosTokenId: tok.eosTokenId,
      header: tok.encode("<|im_start|>assistant\n"),
      scripts: [[tok.encode("\\boxed{1}")]],
    });
    const unpacking = Object.assign(model, {
      unpackBase: () => {
        events.push("unpack");
        return () => events.push("release");
      },
    });
    const prefill = model.prefill.bind(model);
    model.prefill = (ids, mask) => (events.push("prefill"), prefill(ids, mask));
    await rolloutGroups(unpacking, tok, [[{ role: "user", content: "q" }]], config({ samplesPerPrompt: 1 }));
    expect(events).toEqual(["unpack", "prefill", "release"]);
    model.prefill = () => {
      throw new Error("out of memory");
    };
    await expect(rolloutGroups(unpacking, tok, [[{ role: "user", content: "q" }]], config({ samplesPerPrompt: 1 }))).rejects.toThrow(
      /out of memory/,
    );
    expect(events.slice(3)).toEqual(["unpack", "release"]);
  });

  it("derives the tool-response text from the chat template", () => {
    const r = new ToolResponseRenderer(tok);
    expect(r.render(["9"])).toBe("\n<|im_start|>user\n<tool_response>\n9\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    expect(r.render(["1", "x y"])).toBe(response("1", "x y"));
  });

  it("rejects bad configurations with the value and what is accepted", async () => {
    const model = new ScriptedModel({
      vocabSize: tok.vocabSize,
      eosTokenId: tok.eosTokenId,
      header: [],
      fixed: new Map([[tok.eosTokenId, 1]]),
    });
    const p = [[{ role: "user" as const, content: "q" }]];
    await expect(rolloutGroups(model, tok, p, config({ samplesPerPrompt: 0 }))).rejects.toThrow(/samplesPerPrompt 0 .*integer >= 1/);
    await expect(rolloutGroups(model, tok, p, config({ maxTurns: 1.5 }))).rejects.toThrow(/maxTurns 1.5/);
    await expect(rolloutGroups(model, tok, p, config({ topP: 2 }))).rejects.toThrow(/topP 2/);
    await expect(rolloutGroups(model, tok, [], config())).rejects.toThrow(/at least one prompt/);
    await expect(rolloutGroups(model, tok, p, config({ tools: [calc, calc] }))).rejects.toThrow(/"calculator" appears twice/);
    await expect(rolloutGroups(model, tok, p, config({ maxNewTokens: 5000 }))).rejects.toThrow(/max_position_embeddings 4096/);
  });
});
