/** A time and the parts of it that were measured, in one phrase that adds up: "0.60 s, of which
 *  0.10 s the host encoding the steps, 0.45 s the draws and 0.05 s the rest". Parts are printed as
 *  rounded and the rest is the rounded whole less their sum, so the printed figures add up exactly.
 *  Parts timed over intervals that overlap (or inside a whole timed apart) can add to more than the
 *  whole: then the phrase says so, with their sum, instead of a negative rest. Zero parts are left
 *  out. */
export function formatBreakdown(whole: number, parts: [label: string, seconds: number][], digits = 2): string {
  const r = (x: number) => Math.round(x * 10 ** digits) / 10 ** digits;
  const s = (x: number) => `${r(x).toFixed(digits)} s`;
  const shown = parts.map(([label, v]) => [label, r(v)] as const).filter(([, v]) => v > 0);
  if (shown.length === 0) return s(whole);
  const sum = r(shown.reduce((a, [, v]) => a + v, 0));
  const rest = r(r(whole) - sum);
  const items = shown.map(([label, v]) => `${s(v)} ${label}`);
  if (rest < 0) return `${s(whole)}, of which ${list(items)} (these overlap: together ${s(sum)}, more than the whole)`;
  return `${s(whole)}, of which ${list(rest > 0 ? [...items, `${s(rest)} the rest`] : items)}`;
}

const list = (items: string[]) => (items.length === 1 ? items[0] : `${items.slice(0, -1).join(", ")} and ${items[items.length - 1]}`);
