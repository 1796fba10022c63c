/** The page shell shared by the reports: HTML escaping, one stylesheet, tables, a text cap. Pages
 *  hold no scripts, fonts, images or links to anything outside themselves (interaction is CSS only:
 *  <details> and radio-button filters), so a report opens anywhere and can be attached as is. */
import { formatNumber } from "../trainer/metrics.ts";

const ENTITIES: Record<string, string> = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };

/** Text → HTML text or attribute value. Control characters other than tab and newline (NUL, ESC,
 *  DEL, C1) cannot appear in HTML as such: they are shown as `\xNN` so the reader sees they were there. */
export function escapeHtml(s: string): string {
  return s.replace(
    /[&<>"']|[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g,
    (c) => ENTITIES[c] ?? `\\x${c.charCodeAt(0).toString(16).padStart(2, "0")}`,
  );
}

/** At most `max` characters of `s`, and how many were left out. Cuts at a code-point boundary. */
export function capText(s: string, max: number): { text: string; omitted: number } {
  if (s.length <= max) return { text: s, omitted: 0 };
  let end = max;
  const c = s.charCodeAt(end - 1);
  if (c >= 0xd800 && c <= 0xdbff) end--; // do not split a surrogate pair
  return { text: s.slice(0, end), omitted: s.length - end };
}

export const CSS = `body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1d2330;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:26px 0 8px}h3{font-size:14px;margin:14px 0 6px}.sub{color:#667;margin:0 0 14px}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{border:1px solid #e3e6ec;border-radius:6px;background:#fcfcfd}
.t{font-size:13px;font-weight:600;fill:#1d2330}.yl{font-size:10px;fill:#556;text-anchor:end}.xl{font-size:10px;fill:#556;text-anchor:middle}
.g{stroke:#eceef2}.a{stroke:#99a}.line{fill:none;stroke:#2563eb;stroke-width:1.6}.band{fill:#2563eb;opacity:.16}.dot{fill:#2563eb}
.flat{margin:10px 0 0;color:#445;font-size:13px}.flat li{margin:1px 0}
table{border-collapse:collapse;font-size:13px}td,th{border-bottom:1px solid #e3e6ec;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f4f5f8}td.n{text-align:right;font-variant-numeric:tabular-nums}code{font:12px ui-monospace,monospace;word-break:break-all}
.bar{fill:#2563eb;opacity:.8}.ci{stroke:#1d2330;stroke-width:1.4}
details{margin:6px 0}summary{cursor:pointer;font-weight:600}
.group{border:1px solid #e3e6ec;border-radius:6px;padding:8px 10px;margin:10px 0;background:#fcfcfd}
.q{font-size:13px;color:#334;margin:0 0 6px;white-space:pre-wrap}
.rollouts{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:8px}
.ro{border:1px solid #dde1e8;border-radius:5px;padding:6px 8px;background:#fff;min-width:0}
.ro.best{border:2px solid #16a34a}.ro.worst{border:2px solid #dc2626}
.meta{font-size:12px;color:#445;margin-bottom:4px}
.tag{display:inline-block;font-size:11px;padding:0 5px;border-radius:3px;margin-right:4px;background:#eef0f4}
.tag.ok{background:#dcfce7;color:#14532d}.tag.bad{background:#fee2e2;color:#7f1d1d}.tag.warn{background:#fef3c7;color:#78350f}
.tx{font:12px/1.4 ui-monospace,monospace;white-space:pre-wrap;word-break:break-word;margin:0}
.tx .turn{display:block;border-left:3px solid #2563eb;padding-left:6px;margin:3px 0}
.tx .call{background:#e0ecff;border-radius:3px}
.tx .res{display:block;border-left:3px solid #9ca3af;background:#f3f4f6;color:#374151;padding-left:6px;margin:3px 0}
.tx .res.err,.tx .perr{background:#fee2e2;border-color:#dc2626}.tx .cut{color:#888;font-style:italic}
.cmp{display:grid;gap:8px}.qs .q{margin:0}
.filters{margin:8px 0 12px}.filters input{display:none}
.filters label{display:inline-block;border:1px solid #cbd2dc;border-radius:14px;padding:2px 10px;margin:2px 4px 2px 0;cursor:pointer;
font-size:13px;background:#fff}
.legend{font-size:12px;color:#556}`;

/** A whole page. `css` adds rules (for example a page's filters). */
export function page(title: string, subtitle: string, body: string, css = ""): string {
  return (
    `<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">` +
    `<title>${escapeHtml(title)}</title><style>${CSS}${css}</style></head>\n` +
    `<body><h1>${escapeHtml(title)}</h1><p class="sub">${escapeHtml(subtitle)}</p>\n${body}\n</body></html>\n`
  );
}

export function cell(v: unknown): string {
  if (typeof v === "number") return `<td class="n">${escapeHtml(formatNumber(v, 4))}</td>`;
  if (typeof v === "string") return `<td><code>${escapeHtml(v)}</code></td>`;
  return `<td><code>${escapeHtml(JSON.stringify(v) ?? "")}</code></td>`;
}

export function keyValueTable(obj: Record<string, unknown>): string {
  const rows = Object.entries(obj).map(([k, v]) => `<tr><th>${escapeHtml(k)}</th>${cell(v)}</tr>`);
  return `<table>${rows.join("")}</table>`;
}
