/** Loops of value imports in a source folder: `npx tsx scripts/lib/import-cycles.ts [folder=src]` prints each
 *  loop as a path of files and exits 1 when there is one. A loop makes a module's exports depend on the
 *  order its importers happen to load in; type-only imports vanish at compile time and do not count.
 *
 *  Counted: `import … from`, side-effect `import "…"`, `export … from`, and `import("…")` with a literal
 *  (a load deferred to run time still closes the loop). Not counted: `import type`, `export type`, and
 *  `import { type A, type B }` where every name is a type. Only relative specifiers inside the folder make
 *  edges. Leaves out a real parser: statements are read at the start of a line, as Prettier writes them,
 *  and lines that open with a comment marker are skipped for `import(…)`. */
import { readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const SOURCE = /\.(ts|mts|js|mjs)$/;
// `import X, { a, type B } from "m"`, `export * from "m"`, `export { a as b } from "m"` (clause: names, braces, commas, `*`)
const STATIC = /^(import|export)(\s+type\b)?([\w$\s{},*]*?)\bfrom\s*["']([^"']+)["']/gm;
const SIDE_EFFECT = /^import\s*["']([^"']+)["']/gm;
const DYNAMIC = /(?<!typeof\s*)\bimport\(\s*["']([^"']+)["']\s*\)/g;

/** Whether an import/export clause brings in a value: not `type`, and not braces whose names are all `type X`. */
function bringsValue(typeKeyword: string | undefined, clause: string): boolean {
  if (typeKeyword) return false;
  const m = /^\s*\{([^}]*)\}\s*$/.exec(clause);
  if (!m) return true; // a default, a namespace, `*`, or braces beside a default
  const names = m[1]
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
  return names.length === 0 || names.some((n) => !/^type\s/.test(n));
}

/** The relative specifiers a file imports for their values. */
export function valueImports(text: string): string[] {
  const out: string[] = [];
  for (const m of text.matchAll(STATIC)) if (bringsValue(m[2], m[3])) out.push(m[4]);
  for (const m of text.matchAll(SIDE_EFFECT)) out.push(m[1]);
  for (const line of text.split("\n")) {
    if (/^\s*(\/\/|\/\*|\*)/.test(line)) continue;
    for (const m of line.matchAll(DYNAMIC)) out.push(m[1]);
  }
  return out.filter((s) => s.startsWith("./") || s.startsWith("../"));
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? sourceFiles(p) : SOURCE.test(name) && !name.endsWith(".d.ts") ? [p] : [];
  });
}

/** file → the files in the folder it imports values from (paths relative to the folder). */
export function importGraph(root: string): Map<string, string[]> {
  const files = sourceFiles(root).map((f) => relative(root, f));
  const known = new Set(files);
  const graph = new Map<string, string[]>();
  for (const file of files) {
    const targets = valueImports(readFileSync(join(root, file), "utf8"))
      .map((spec) => relative(root, resolve(root, dirname(file), spec)))
      .map((t) => (known.has(t) ? t : t.replace(/\.js$/, ".ts")))
      .filter((t) => known.has(t));
    graph.set(file, [...new Set(targets)]);
  }
  return graph;
}

/** One loop per strongly connected component (Tarjan), as a path that starts and ends at its first file in
 *  sort order: the shortest way round from there, with all the component's files. A component of several
 *  files can hold more loops; fixing the one shown and running again finds the next. */
export function importCycles(graph: Map<string, string[]>): { loop: string[]; files: string[] }[] {
  const index = new Map<string, number>(),
    low = new Map<string, number>(),
    stack: string[] = [],
    onStack = new Set<string>(),
    components: string[][] = [];
  const visit = (v: string) => {
    index.set(v, index.size);
    low.set(v, index.get(v)!);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) === index.get(v)) {
      const c: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        c.push(w);
      } while (w !== v);
      if (c.length > 1 || (graph.get(v) ?? []).includes(v)) components.push(c);
    }
  };
  for (const v of [...graph.keys()].sort()) if (!index.has(v)) visit(v);
  return components
    .map((c) => ({ loop: shortestLoop(graph, new Set(c)), files: c.sort() }))
    .sort((a, b) => a.loop[0].localeCompare(b.loop[0]));
}

/** Breadth-first from the component's first file back to itself, staying inside the component. */
function shortestLoop(graph: Map<string, string[]>, inside: Set<string>): string[] {
  const start = [...inside].sort()[0];
  const from = new Map<string, string>();
  const queue = [start];
  for (let i = 0; i < queue.length; i++) {
    for (const w of graph.get(queue[i]) ?? []) {
      if (!inside.has(w)) continue;
      if (w === start) {
        const way: string[] = [];
        for (let v = queue[i]; v !== start; v = from.get(v)!) way.unshift(v);
        return [start, ...way, start];
      }
      if (!from.has(w)) {
        from.set(w, queue[i]);
        queue.push(w);
      }
    }
  }
  throw new Error(`no loop through ${start}`); // unreachable for a strongly connected component
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const root = process.argv[2] ?? "src";
  const cycles = importCycles(importGraph(root));
  for (const { loop, files } of cycles) {
    console.log(`import loop in ${root}: ${loop.join(" → ")}`);
    if (files.length > loop.length - 1) console.log(`  (${files.length} files take part: ${files.join(", ")})`);
  }
  if (cycles.length) {
    console.log(`${cycles.length} import loop(s) of values in ${root}`);
    process.exit(1);
  }
  console.log(`no import loop of values in ${root}`);
}
