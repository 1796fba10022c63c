/** GSM8K's calculator annotations `<<expr=result>>`: finding them in a solution and making the
 *  expression something the calculator accepts. No evaluation here (that is the calculator's job). */

export interface Annotation {
  start: number; // index of "<<" in the text
  end: number; // index just after ">>"
  expression: string; // as written, before the last "="
  result: string; // as written, after the last "="
}

/** Every `<<...=...>>` in order. Throws on one without "=" or with an empty side, naming it. */
export function parseAnnotations(text: string): Annotation[] {
  const out: Annotation[] = [];
  for (const m of text.matchAll(/<<([^<>]*)>>/g)) {
    const body = m[1];
    const eq = body.lastIndexOf("=");
    const expression = eq < 0 ? "" : body.slice(0, eq).trim();
    const result = eq < 0 ? "" : body.slice(eq + 1).trim();
    if (!expression || !result) throw new Error(`calculator annotation "<<${body}>>" is not "<<expression=result>>"`);
    out.push({ start: m.index, end: m.index + m[0].length, expression, result });
  }
  return out;
}

/** The annotation's expression in calculator syntax: `$` and thousands commas dropped, `x` / `×` / `÷`
 *  as `*` / `/`, Python's `//` as `/` (GSM8K uses it only where the division is exact), `**` as `^`. */
export function normalizeExpression(expr: string): string {
  return expr
    .replace(/\$/g, "")
    .replace(/(\d),(?=\d{3}(?!\d))/g, "$1")
    .replace(/(?<=[\d.)\s])[xX×](?=[\s\d.(])/g, "*")
    .replace(/÷/g, "/")
    .replace(/\/\//g, "/")
    .replace(/\*\*/g, "^")
    .replace(/\s+/g, " ")
    .trim();
}
