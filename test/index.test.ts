import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";
import * as path from "node:path";
import { initBackend, loadModel, loadTokenizer, calculatorTool, shutdownCalculator } from "../src/index.ts";
import { makeTinyModelDir } from "./run/helpers/tiny-fixture.ts";

const FIX = path.join(import.meta.dirname, "fixtures", "qwen2-tiny");

describe("library API", () => {
  it("loadModel(path).forward gives [batch, seq, vocab] logits; loadTokenizer reads a folder", async () => {
    await initBackend("wasm"); // the caller starts the backend; loadModel only uses it
    const model = await loadModel(FIX);
    const logits = model.forward(
      [
        [1, 2, 3],
        [0, 4, 5],
      ],
      [
        [1, 1, 1],
        [0, 1, 1],
      ],
    );
    expect(logits.shape).toEqual([2, 3, 256]);
    tf.dispose(logits);
    model.dispose();
    const tok = await loadTokenizer(await makeTinyModelDir());
    expect(tok.decode(tok.encode("Ava has 12 apples."))).toBe("Ava has 12 apples.");
  });

  it("calculatorTool.run resolves to text, also for bad input", async () => {
    expect(await calculatorTool.run({ expression: "16-3-4" })).toBe("9");
    expect(await calculatorTool.run({ expression: "import('fs')" })).toMatch(/^Error/);
    await shutdownCalculator();
  });
});
