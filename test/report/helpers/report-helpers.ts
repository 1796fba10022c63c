/** Checks shared by the report tests. */
import { expect } from "vitest";

/** The page references nothing outside itself: no scripts, links, images, frames, fonts or URLs. */
export function expectSelfContained(html: string) {
  expect(html.startsWith("<!DOCTYPE html>")).toBe(true);
  expect(html.trim().endsWith("</html>")).toBe(true);
  expect(html).not.toMatch(/https?:|\/\/[a-z]|<script|<link|<img|<iframe|<object|<embed|<a\s|\ssrc=|\shref=|@import|url\(/i);
  for (const tag of ["svg", "pre", "details", "div", "table"])
    expect(html.match(new RegExp(`<${tag}[ >]`, "g"))?.length, tag).toBe(html.match(new RegExp(`</${tag}>`, "g"))?.length);
}
