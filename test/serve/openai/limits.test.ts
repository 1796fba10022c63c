/** The server's limits on what comes in: a prompt too long for the context is refused with the
 *  field it came in (`prompt` for completions, `messages` for chat) before it is tokenized, so a
 *  3 MB prompt does not hold up the requests beside it; a full queue answers 429 with Retry-After. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ServingOpenAi } from "../../../src/serve/openai/run.ts";
import { postJson, serveTiny } from "./helpers/serve-tiny.ts";

let server: ServingOpenAi;
beforeAll(async () => {
  server = await serveTiny({ max_queue: 1, batch_wait_ms: 600 });
});
afterAll(async () => {
  await server?.close();
});

const errorOf = async (r: Response) =>
  ((await r.json()) as { error: { param: string | null; code: string | null; message: string } }).error;

describe("request limits", () => {
  it("refuses a 3 MB prompt by its field without tokenizing it, and keeps other requests moving", async () => {
    const tok = server.batcher.tokenizer;
    const encode = tok.encode.bind(tok);
    let longest = 0;
    tok.encode = (text: string) => {
      longest = Math.max(longest, text.length);
      return encode(text);
    };
    try {
      const huge = "Each bag has 15 marbles. ".repeat(120_000); // 3 MB
      const t0 = performance.now();
      const [completion, chat] = await Promise.all([
        postJson(server, "completions", { model: "tiny", prompt: huge, max_tokens: 2 }),
        postJson(server, "chat/completions", { model: "tiny", messages: [{ role: "user", content: huge }], max_tokens: 2 }),
      ]);
      const refused = performance.now() - t0;
      expect(completion.status).toBe(400);
      expect(await errorOf(completion)).toMatchObject({ param: "prompt", message: expect.stringContaining("characters") });
      expect(chat.status).toBe(400);
      expect((await errorOf(chat)).param).toBe("messages");
      expect(longest).toBeLessThan(10_000); // neither was tokenized
      // A short request sent behind them is answered as if they had not been there.
      const t1 = performance.now();
      const small = await postJson(server, "completions", { model: "tiny", prompt: "A box holds", max_tokens: 2, temperature: 0 });
      expect(small.status).toBe(200);
      console.log(
        `3 MB prompts refused in ${refused.toFixed(0)} ms; a short request after them: ${(performance.now() - t1).toFixed(0)} ms`,
      );
      // An over-long prompt that only tokenizing finds is named by its field too.
      const long = await postJson(server, "completions", { model: "tiny", prompt: "7 ".repeat(1100), max_tokens: 2 });
      expect(long.status).toBe(400);
      expect((await errorOf(long)).param).toBe("prompt");
    } finally {
      tok.encode = encode;
    }
  });

  it("answers 429 with Retry-After when --max_queue requests wait", async () => {
    const body = { model: "tiny", prompt: "A box holds", max_tokens: 2 };
    const first = postJson(server, "completions", body); // waits batch_wait_ms in the queue
    await new Promise((r) => setTimeout(r, 50));
    const second = await postJson(server, "completions", body);
    expect(second.status).toBe(429);
    expect(Number(second.headers.get("retry-after"))).toBeGreaterThan(0);
    expect((await errorOf(second)).code).toBe("rate_limit_exceeded");
    for (const [route, streamed] of [
      ["chat/completions", { model: "tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 2, stream: true }],
      ["responses", { model: "tiny", input: "hi", max_output_tokens: 2, stream: true }],
    ] as const) {
      const r = await postJson(server, route, streamed); // refused before the stream starts
      expect(r.status).toBe(429);
      expect(r.headers.get("retry-after")).toBe("1");
    }
    expect((await first).status).toBe(200);
  });
});
