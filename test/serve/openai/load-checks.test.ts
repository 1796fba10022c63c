/** The load test's answer checks (scripts/lib/load-checks.ts) on hand-made answers: each kind of
 *  wrong answer is caught, and the right ones pass. */
import { describe, expect, it } from "vitest";
import { checkAnswer, KINDS, requestOf, type Answer } from "../../../scripts/lib/load-checks.ts";

const answer = (status: number, text: string, headers: Record<string, string> = {}): Answer => ({
  status,
  text,
  headers: { get: (k) => headers[k.toLowerCase()] ?? null },
});
const req = (kind: string) => requestOf(KINDS.indexOf(kind as never), "tiny", 8);
const chat = (choices: object[]) => JSON.stringify({ choices });
const msg = (content: string, extra: object = {}) => ({ message: { content, ...extra }, finish_reason: "stop" });

describe("load-checks", () => {
  it("cycles through every kind and keeps bodies as the server gets them", () => {
    expect(Array.from({ length: 6 }, (_, i) => requestOf(i, "tiny", 8).kind)).toEqual(KINDS);
    expect(requestOf(5, "tiny", 8).body).toBe('{"model": "x", "messages": ['); // the first bad body is not JSON
  });

  it("passes right answers", () => {
    expect(checkAnswer(req("plain"), answer(200, chat([msg("579")])))).toBe("ok");
    expect(checkAnswer(req("n2"), answer(200, chat([msg("1"), msg("2")])))).toBe("ok");
    expect(checkAnswer(req("json_schema"), answer(200, chat([msg('{"answer": 579}')])))).toBe("ok");
    const tool = msg("", { tool_calls: [{ function: { name: "calculator", arguments: '{"expression":"1+2"}' } }] });
    expect(checkAnswer(req("tools"), answer(200, chat([tool])))).toBe("ok");
    expect(checkAnswer(req("bad"), answer(400, '{"error": {"message": "messages: expected an array"}}'))).toBe("ok");
    expect(checkAnswer(req("plain"), answer(429, '{"error": {"message": "full"}}', { "retry-after": "1" }))).toBe("ok");
    const stream =
      'data: {"choices":[{"delta":{"content":"5"},"finish_reason":null}]}\n\ndata: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n';
    expect(checkAnswer(req("stream"), answer(200, stream))).toBe("ok");
  });

  it("catches wrong ones", () => {
    expect(checkAnswer(req("plain"), answer(200, "{not json"))).toMatch(/not JSON/);
    expect(checkAnswer(req("plain"), answer(500, '{"error": {"message": "boom"}}'))).toMatch(/status 500/);
    expect(checkAnswer(req("n2"), answer(200, chat([msg("1")])))).toMatch(/2 choice/);
    expect(checkAnswer(req("json_schema"), answer(200, chat([msg('{"answer": "')])))).toMatch(/not JSON/);
    const tool = msg("", { tool_calls: [{ function: { name: "calculator", arguments: '{"expression":' } }] });
    expect(checkAnswer(req("tools"), answer(200, chat([tool])))).toMatch(/arguments/);
    expect(checkAnswer(req("bad"), answer(200, chat([msg("hi")])))).toMatch(/answered 200/);
    expect(checkAnswer(req("bad"), answer(500, '{"error": {"message": "Maximum call stack"}}'))).toMatch(/answered 500/);
    expect(checkAnswer(req("bad"), answer(400, "bad request"))).toMatch(/not JSON/);
    expect(checkAnswer(req("plain"), answer(429, '{"error": {"message": "full"}}'))).toMatch(/Retry-After/);
    const cut = 'data: {"choices":[{"delta":{"content":"5"},"finish_reason":null}]}\n\n';
    expect(checkAnswer(req("stream"), answer(200, cut))).toMatch(/\[DONE\]/);
    const failed = 'data: {"error":{"message":"boom"}}\n\ndata: [DONE]\n\n';
    expect(checkAnswer(req("stream"), answer(200, failed))).toMatch(/error inside a stream/);
  });
});
