/** A progress bar for long loops (training steps, eval questions) with ETA and one key metric.
 *  On a terminal it is a cli-progress bar that log lines print above; when stderr is not a terminal
 *  or CI=true, a redrawn bar would fill log files with carriage returns, so it prints a plain line
 *  every `everyPercent` % or `everySeconds` s instead. Rates and ETA count from the starting value,
 *  so a resumed run does not look instantly fast. */
import cliProgress from "cli-progress";
import { formatNumber, type Metrics } from "./metrics.ts";

export interface ProgressOptions {
  /** Metric shown in the bar, e.g. "reward" or "loss". */
  keyMetric?: string;
  /** Value the loop starts from (a resumed run). */
  start?: number;
  stream?: NodeJS.WritableStream & { isTTY?: boolean };
  /** Force plain lines (true) or the bar (false); default: plain unless a terminal outside CI. */
  plain?: boolean;
  everyPercent?: number;
  everySeconds?: number;
  /** Clock in ms (tests pass a fake one). */
  now?: () => number;
}

export interface Progress {
  /** Set the count of finished units and (optionally) the latest metrics. */
  update(n: number, metrics?: Metrics): void;
  /** Print a line without breaking the bar. */
  log(line: string): void;
  stop(): void;
}

/** h:mm:ss / m:ss / s, for elapsed and ETA. */
export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) return "?";
  const s = Math.round(seconds);
  const h = Math.floor(s / 3600),
    m = Math.floor((s % 3600) / 60),
    r = s % 60;
  const two = (x: number) => String(x).padStart(2, "0");
  return h > 0 ? `${h}:${two(m)}:${two(r)}` : m > 0 ? `${m}:${two(r)}` : `${r}s`;
}

export function createProgress(total: number, label: string, opts: ProgressOptions = {}): Progress {
  if (!Number.isInteger(total) || total < 0) throw new RangeError(`progress total ${total}: expected a whole number >= 0`);
  const stream = opts.stream ?? process.stderr;
  const plain = opts.plain ?? (!stream.isTTY || process.env.CI === "true");
  const metricText = (m?: Metrics): string => {
    const v = opts.keyMetric && m ? m[opts.keyMetric] : undefined;
    if (!opts.keyMetric) return "";
    return `${opts.keyMetric} ${typeof v === "number" ? formatNumber(v, 3) : v == null ? "-" : String(v)}`;
  };
  return plain ? plainProgress(total, label, stream, metricText, opts) : barProgress(total, label, stream, metricText, opts);
}

function plainProgress(
  total: number,
  label: string,
  stream: NodeJS.WritableStream,
  metricText: (m?: Metrics) => string,
  opts: ProgressOptions,
): Progress {
  const now = opts.now ?? Date.now;
  const everyPercent = opts.everyPercent ?? 10;
  const everySeconds = opts.everySeconds ?? 30;
  const start = opts.start ?? 0;
  const t0 = now();
  let lastPrintT = t0;
  let lastPrintN = start;
  let lastBucket = total > 0 ? Math.floor(((start / total) * 100) / everyPercent) : 0;
  let n = start;
  let metrics: Metrics | undefined;
  let stopped = false;

  const print = () => {
    const t = now();
    const elapsed = (t - t0) / 1000;
    const done = n - start;
    const eta = done > 0 ? (elapsed / done) * (total - n) : NaN;
    const pct = total > 0 ? Math.floor((n / total) * 100) : 100;
    const parts = [`${label} ${n}/${total} (${pct}%)`];
    const mt = metricText(metrics);
    if (mt) parts.push(mt);
    parts.push(`elapsed ${formatDuration(elapsed)}`, n >= total ? "done" : `eta ${formatDuration(eta)}`);
    stream.write(parts.join(" | ") + "\n");
    lastPrintT = t;
    lastPrintN = n;
  };

  return {
    update(value, m) {
      if (stopped) return;
      n = Math.min(value, total);
      if (m) metrics = m;
      const bucket = total > 0 ? Math.floor(((n / total) * 100) / everyPercent) : 0;
      const timeDue = (now() - lastPrintT) / 1000 >= everySeconds;
      if (n === total || bucket > lastBucket || timeDue) print();
      lastBucket = Math.max(lastBucket, bucket);
    },
    log(line) {
      stream.write(line.endsWith("\n") ? line : line + "\n");
    },
    stop() {
      if (stopped) return;
      stopped = true;
      if (n !== lastPrintN) print();
    },
  };
}

function barProgress(
  total: number,
  label: string,
  stream: NodeJS.WritableStream,
  metricText: (m?: Metrics) => string,
  opts: ProgressOptions,
): Progress {
  const multi = new cliProgress.MultiBar(
    {
      stream,
      format: `${label} |{bar}| {value}/{total} | {metric} | {duration_formatted} < eta {eta_formatted}`,
      barsize: 30,
      hideCursor: true,
      clearOnComplete: false,
      etaBuffer: 20,
      fps: 5,
      noTTYOutput: false,
    },
    cliProgress.Presets.shades_classic,
  );
  const bar = multi.create(total, opts.start ?? 0, { metric: metricText() });
  let stopped = false;
  return {
    update(value, m) {
      if (!stopped) bar.update(Math.min(value, total), m ? { metric: metricText(m) } : {});
    },
    log(line) {
      if (stopped) stream.write(line.endsWith("\n") ? line : line + "\n");
      else {
        multi.log(line.endsWith("\n") ? line : line + "\n");
        multi.update(); // draw now: MultiBar only flushes logged lines on its next redraw
      }
    },
    stop() {
      if (stopped) return;
      stopped = true;
      multi.stop();
    },
  };
}
