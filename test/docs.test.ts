/** The README stays short (what it is, set up, quickstart, pointers; the rest in docs/), and every
 *  relative link in README.md and docs/*.md points at a file that exists, and at a heading of it when
 *  it names one (GitHub's anchors). */
import { describe, expect, it } from "vitest";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import * as path from "node:path";

const root = path.join(__dirname, "..");
const README_MAX_LINES = 350;
/** Linked before it lands: docs/serving-api.md comes with the Responses API and structured outputs. */
const LANDING = new Set(["docs/serving-api.md"]);

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens. */
export function slug(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/`/g, "")
    .replace(/[^\p{L}\p{N}\s_-]/gu, "")
    .replace(/\s/g, "-");
}

/** The text outside fenced code blocks and inline code, where links are links. */
function prose(markdown: string): string {
  return markdown.replace(/^```[\s\S]*?^```/gm, "").replace(/`[^`\n]*`/g, "");
}

function anchors(markdown: string): Set<string> {
  const headings = prose(markdown).match(/^#{1,6} .*$/gm) ?? [];
  return new Set(headings.map((h) => slug(h.replace(/^#+ /, ""))));
}

/** The relative links of a markdown file (path relative to `base`) that point at nothing. */
export function brokenLinks(file: string, markdown: string, base: string, landing: Set<string> = new Set()): string[] {
  const broken: string[] = [];
  for (const m of prose(markdown).matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)) {
    const target = m[1];
    if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // https:, mailto:
    const [p, anchor] = target.split("#");
    const resolved = p ? path.normalize(path.join(path.dirname(file), p)) : file;
    if (landing.has(resolved) && !existsSync(path.join(base, resolved))) continue;
    if (!existsSync(path.join(base, resolved))) {
      broken.push(`${file}: ${target} (no ${resolved})`);
      continue;
    }
    const text = p ? readFileSync(path.join(base, resolved), "utf8") : markdown;
    if (anchor && resolved.endsWith(".md") && !anchors(text).has(anchor))
      broken.push(`${file}: ${target} (no heading #${anchor} in ${resolved})`);
  }
  return broken;
}

const files = [
  "README.md",
  ...readdirSync(path.join(root, "docs"))
    .filter((f) => f.endsWith(".md"))
    .map((f) => `docs/${f}`),
];

describe("README and docs/", () => {
  it(`README.md has at most ${README_MAX_LINES} lines`, () => {
    const lines = readFileSync(path.join(root, "README.md"), "utf8").trimEnd().split("\n").length;
    expect(lines).toBeLessThanOrEqual(README_MAX_LINES);
  });

  it("every relative link in README.md and docs/*.md points at an existing file and heading", () => {
    const broken = files.flatMap((f) => brokenLinks(f, readFileSync(path.join(root, f), "utf8"), root, LANDING));
    expect(broken).toEqual([]);
  });

  it("the README's serving paragraph and docs/serving.md name every route of the OpenAI server, forced tool calls and structured output", () => {
    const server = readFileSync(path.join(root, "src/serve/openai/server.ts"), "utf8");
    const routes = [...server.matchAll(/^ {4}"(\/v1\/[a-z_/]+)": \{/gm)].map((m) => m[1]);
    expect(routes).toContain("/v1/responses");
    const section = (file: string, heading: string) => {
      const text = readFileSync(path.join(root, file), "utf8");
      const start = text.indexOf(`\n## ${heading}\n`);
      expect(start, `${file}: ## ${heading}`).toBeGreaterThan(-1);
      const end = text.indexOf("\n## ", start + 1);
      return text.slice(start, end === -1 ? undefined : end);
    };
    // The README names vLLM's two LoRA routes together ("vLLM's runtime LoRA endpoints").
    for (const [file, heading, named] of [
      ["README.md", "Serving (OpenAI-compatible API)", routes.filter((r) => !r.includes("lora"))],
      ["docs/serving.md", "The OpenAI-compatible server", routes],
    ] as const) {
      const text = section(file, heading);
      for (const word of [...named, "required", "response_format", "text.format"]) expect(text, `${file}: ${word}`).toContain(word);
    }
  });

  it("finds a broken link, a missing heading, and ignores code and URLs", () => {
    const md = [
      "# Top",
      "[ok](README.md) [ok](#top) [gone](docs/nope.md) [bad anchor](README.md#no-such-heading)",
      "![img](docs/images/missing.png) [web](https://example.com/x.md) `[code](nope.md)`",
      "```",
      "[in a block](nope.md)",
      "```",
    ].join("\n");
    expect(brokenLinks("README.md", md, root)).toEqual([
      "README.md: docs/nope.md (no docs/nope.md)",
      "README.md: README.md#no-such-heading (no heading #no-such-heading in README.md)",
      "README.md: docs/images/missing.png (no docs/images/missing.png)",
    ]);
    expect(slug("Quickstart: the tiny preset (offline, CPU)")).toBe("quickstart-the-tiny-preset-offline-cpu");
  });
});
