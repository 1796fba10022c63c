/** llama.cpp failing under a run is an EngineError, which GRPO turns into "saved checkpoint-N …
 *  continue with --resume": a decode that fails fails every turn in it with one (a stand-in batch,
 *  so this runs where llama.cpp's binaries do not). */
import { describe, expect, it } from "vitest";
import type { LlamaBatch } from "../../src/rollout/engines/llama-batch.ts";
import { LlamaTurns } from "../../src/rollout/engines/llama.ts";
import { EngineError } from "../../src/rollout/engines/types.ts";

/** A batch of 2 KV slots whose decode fails as a native llama_decode error surfaces. */
const dyingBatch = {
  sequences: 2,
  step: async () => {
    throw new Error("llama_decode failed: -3\n(native stack)");
  },
  endRow: async () => {},
} as unknown as LlamaBatch;

describe("the llama engine when llama.cpp fails", () => {
  it("fails each turn of a decode that fails with an EngineError naming what failed", async () => {
    const turns = new LlamaTurns(dyingBatch);
    const p = { maxTokens: 8, temperature: 0, topP: 1, topK: 0, seed: 1, stopTokenIds: [0] };
    const both = await Promise.allSettled([turns.complete(0, [5], p), turns.complete(1, [6], p)]);
    for (const r of both) {
      expect(r.status).toBe("rejected");
      const err = (r as PromiseRejectedResult).reason;
      expect(err).toBeInstanceOf(EngineError);
      expect(err).toMatchObject({ kind: "died", message: "llama engine: a decode failed: llama_decode failed: -3" });
    }
  });
});
