/** The requests of scripts/bench-load.ts and the check each answer must pass. Pure: a request kind and
 *  index in, a body out; a status, headers and text in, "ok" or what was wrong out. Leaves out timing. */

export type Kind = "plain" | "stream" | "tools" | "n2" | "json_schema" | "bad";
export const KINDS: Kind[] = ["plain", "stream", "tools", "n2", "json_schema", "bad"];

const SYSTEM = "Solve the math problem step by step. Use the calculator tool for arithmetic. Put the final answer in \\boxed{}.";
const CALCULATOR = {
  type: "function",
  function: {
    name: "calculator",
    description: "Evaluate an arithmetic expression",
    parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] },
  },
};
const ANSWER_SCHEMA = {
  type: "json_schema",
  json_schema: {
    name: "answer",
    strict: true,
    schema: {
      type: "object",
      properties: { answer: { type: "integer", minimum: 0, maximum: 9999 } },
      required: ["answer"],
      additionalProperties: false,
    },
  },
};

export interface LoadRequest {
  kind: Kind;
  path: string;
  body: string; // sent as is: a bad body need not be JSON
}

/** The i-th request: kinds in turn, numbers varied by i so prompts differ. */
export function requestOf(i: number, model: string, maxTokens: number): LoadRequest {
  const kind = KINDS[i % KINDS.length];
  const a = 100 + ((i * 37) % 900),
    b = 10 + ((i * 11) % 90);
  const messages = [
    { role: "system", content: SYSTEM },
    { role: "user", content: `Ava has ${a} pencils and buys ${b} more. How many pencils does Ava have now?` },
  ];
  const base = { model, messages, max_tokens: maxTokens, temperature: 0.7, seed: i };
  const chat = (extra: object) => ({ kind, path: "/v1/chat/completions", body: JSON.stringify({ ...base, ...extra }) });
  switch (kind) {
    case "plain":
      return chat({});
    case "stream":
      return chat({ stream: true, stream_options: { include_usage: true } });
    case "tools":
      return chat({ tools: [CALCULATOR], tool_choice: i % 12 === 2 ? "required" : "auto" });
    case "n2":
      return chat({ n: 2 });
    case "json_schema":
      // Room for `{"answer": 1234}` whatever max_tokens is: the check below wants whole JSON.
      return chat({ response_format: ANSWER_SCHEMA, max_tokens: Math.max(maxTokens, 32) });
    case "bad":
      return BAD_BODIES[Math.floor(i / KINDS.length) % BAD_BODIES.length](model);
  }
}

/** Bodies the server must refuse with a 4xx and an error body, without a 5xx or a hang. */
const BAD_BODIES: ((model: string) => LoadRequest)[] = [
  () => ({ kind: "bad", path: "/v1/chat/completions", body: '{"model": "x", "messages": [' }),
  () => ({ kind: "bad", path: "/v1/chat/completions", body: "[1, 2, 3]" }),
  (model) => ({ kind: "bad", path: "/v1/chat/completions", body: JSON.stringify({ model }) }),
  (model) => ({
    kind: "bad",
    path: "/v1/chat/completions",
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], temperature: "hot" }),
  }),
  () => ({
    kind: "bad",
    path: "/v1/chat/completions",
    body: JSON.stringify({ model: "no-such-model", messages: [{ role: "user", content: "hi" }] }),
  }),
  (model) => ({
    kind: "bad",
    path: "/v1/chat/completions",
    body: JSON.stringify({ model, messages: [{ role: "user", content: "hi" }], n: 0 }),
  }),
  (model) => ({
    kind: "bad",
    path: "/v1/chat/completions",
    body: JSON.stringify({
      model,
      messages: [{ role: "user", content: "hi" }],
      response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object", not: {} } } },
    }),
  }),
  (model) => ({ kind: "bad", path: "/v1/completions", body: JSON.stringify({ model, prompt: [[1e9]] }) }),
  (model) => ({ kind: "bad", path: "/v1/chat/completions", body: JSON.stringify({ model, messages: [{ role: "tool", content: "579" }] }) }),
];

export interface Answer {
  status: number;
  headers: { get(name: string): string | null };
  text: string;
}

/** "ok", or why the answer is not one the request may get. Every kind may get a 429 with Retry-After. */
export function checkAnswer(req: LoadRequest, a: Answer): "ok" | string {
  if (a.status === 429) {
    if (!a.headers.get("retry-after")) return "429 without Retry-After";
    return errorBody(a.text) ?? "ok";
  }
  if (req.kind === "bad") {
    if (a.status < 400 || a.status >= 500) return `bad body answered ${a.status}`;
    return errorBody(a.text) ?? "ok";
  }
  if (a.status !== 200) return `status ${a.status}: ${a.text.slice(0, 200)}`;
  if (req.kind === "stream") return checkStream(a.text);
  const body = parse(a.text);
  if (typeof body === "string") return body;
  const choices = (
    body as {
      choices?: { message?: { content: string | null; tool_calls?: { function: { arguments: string } }[] }; finish_reason?: string }[];
    }
  ).choices;
  if (!Array.isArray(choices) || choices.length !== (req.kind === "n2" ? 2 : 1)) return `expected ${req.kind === "n2" ? 2 : 1} choice(s)`;
  for (const c of choices) {
    if (!c.message || !["stop", "length", "tool_calls"].includes(c.finish_reason ?? "")) return `choice without message or finish_reason`;
    for (const tc of c.message.tool_calls ?? [])
      if (typeof parse(tc.function.arguments) === "string") return "tool call arguments are not JSON";
    if (req.kind === "json_schema") {
      const v = parse(c.message.content ?? "");
      if (typeof v === "string") return `json_schema content is not JSON (finish ${c.finish_reason}): ${c.message.content}`;
      if (!Number.isInteger((v as { answer?: unknown }).answer))
        return `json_schema content misses the integer answer: ${c.message.content}`;
    }
  }
  return "ok";
}

/** A stream: only `data:` events, each JSON, no error event, a finish chunk, then `[DONE]` last. */
function checkStream(text: string): "ok" | string {
  const events = text.split("\n\n").filter((e) => e.trim() !== "");
  if (events.at(-1) !== "data: [DONE]") return "stream does not end with [DONE]";
  let finished = false;
  for (const e of events.slice(0, -1)) {
    if (!e.startsWith("data: ")) return `stream event is not data: ${e.slice(0, 80)}`;
    const v = parse(e.slice(6));
    if (typeof v === "string") return `stream ${v}`;
    if ((v as { error?: unknown }).error) return `error inside a stream: ${e.slice(6, 200)}`;
    if ((v as { choices?: { finish_reason?: string | null }[] }).choices?.some((c) => c.finish_reason)) finished = true;
  }
  return finished ? "ok" : "stream without a finish_reason";
}

function errorBody(text: string): string | null {
  const v = parse(text);
  if (typeof v === "string") return `error answer ${v}`;
  const e = (v as { error?: { message?: unknown } }).error;
  return e && typeof e.message === "string" && e.message !== "" ? null : "error answer without error.message";
}

/** The parsed value, or a string saying it did not parse. */
function parse(text: string): object | string {
  try {
    const v = JSON.parse(text);
    return v !== null && typeof v === "object" ? v : "JSON is not an object";
  } catch {
    return `not JSON: ${text.slice(0, 80)}`;
  }
}
