import { describe, expect, it } from "vitest";
import * as tf from "@tensorflow/tfjs";

describe("toolchain", () => {
  it("runs tfjs on the cpu backend", async () => {
    await tf.setBackend("cpu");
    const s = tf.tidy(() => tf.add(tf.scalar(2), tf.scalar(3)));
    expect((await s.data())[0]).toBe(5);
    s.dispose();
  });
});
