/** How a training run stops on Ctrl-C (SIGINT) or SIGTERM. One path for every trainer:
 *
 *  - The first signal only sets a flag. The training loop looks at it at its safe point (between two
 *    steps, when weights, optimizer state and step counter agree), saves a checkpoint there and
 *    throws `Interrupted`; runMain exits 130. Nothing runs concurrently with a step.
 *  - A second signal exits at once (130); the last complete checkpoint is left as it was, since
 *    checkpoints are written under a temp name and renamed into place.
 *
 *  A busy process cannot answer a signal until its current synchronous kernel returns, which can
 *  take seconds. `superviseSelf` therefore runs the trainer in a child process and keeps the
 *  script's own process idle: it answers signals at once (tsx, which runs the README's commands,
 *  SIGKILLs a child that does not acknowledge a signal within ~60 ms) and relays each one to the
 *  trainer exactly once. The trainer runs in its own process group, so a terminal's Ctrl-C (sent to
 *  the whole foreground group) reaches it only through that relay, never twice. */
import { spawn } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";

/** Thrown at a training loop's safe point after an interrupt, once the checkpoint is saved. */
export class Interrupted extends Error {
  constructor(message: string) {
    super(message);
    this.name = "Interrupted";
  }
}

export interface StopIo {
  exit: (code: number) => void;
  stderr: (line: string) => void;
}

const processIo: StopIo = { exit: (code) => process.exit(code), stderr: (line) => process.stderr.write(line + "\n") };

/** Signals this soon after the first are the same Ctrl-C: tsx sends a terminal's SIGINT on to its
 *  child a second time when the child's acknowledgement comes late (a loaded machine). */
const SAME_INTERRUPT_MS = 1000;

/** The stop flag a training loop polls at its safe points. */
export class StopRequest {
  requested = false;
  private requestedAt = 0;
  private readonly aborter = new AbortController();
  /** Aborted with the stop request: work that cannot wait for a safe point (the closing evaluation's
   *  rollouts) ends at its next decode step. */
  readonly abortSignal: AbortSignal = this.aborter.signal;

  constructor(
    private io: StopIo = processIo,
    private now: () => number = Date.now,
  ) {}

  /** A signal arrived: the first asks for a stop, the next exits now, unless it comes within
   *  SAME_INTERRUPT_MS of the request: then it is the same Ctrl-C arriving a second way (the
   *  supervisor's relay after tsx, on a loaded machine, killed the supervisor for a late
   *  acknowledgement: the trainer sees its launcher gone, then the relayed signal). */
  signal(): void {
    if (this.requested) {
      if (this.now() - this.requestedAt < SAME_INTERRUPT_MS) return;
      this.io.stderr("interrupted again: exiting without saving (the last complete checkpoint is kept)");
      this.io.exit(130);
      return;
    }
    this.request("interrupted: stopping after the current step to save a checkpoint (Ctrl-C again to quit at once)");
  }

  /** At a safe point: let pending signals in first (a loop whose awaits all resolve as microtasks,
   *  as tfjs reads on the CPU backends do, never gives them a turn), then say whether to stop. */
  async poll(): Promise<boolean> {
    await new Promise((resolve) => setImmediate(resolve));
    return this.requested;
  }

  /** Ask for a stop at the next safe point (again: no effect). */
  request(why: string): void {
    if (this.requested) return;
    this.requested = true;
    this.requestedAt = this.now();
    this.io.stderr(why);
    this.aborter.abort();
  }
}

const SIGNALS = ["SIGINT", "SIGTERM"] as const;
let watching: StopRequest | undefined;

/** Listen for SIGINT/SIGTERM while a training loop runs. `dispose()` gives the signals back to
 *  Node's default (exit at once). */
export function watchInterrupts(io: StopIo = processIo): StopRequest & { dispose(): void } {
  const stop = new StopRequest(io);
  const onSignal = () => stop.signal();
  for (const s of SIGNALS) process.on(s, onSignal);
  watching = stop;
  return Object.assign(stop, {
    dispose: () => {
      for (const s of SIGNALS) process.off(s, onSignal);
      if (watching === stop) watching = undefined;
    },
  });
}

/** Set in the trainer process that superviseSelf starts. */
export const TRAINER_CHILD_ENV = "MARL_TRAINER_CHILD";

/** Run the rest of this script in a child process (same node flags, same arguments) and wait for it:
 *  returns at once in that child, never in the parent, which exits with the child's exit code.
 *  In the parent, the first SIGINT/SIGTERM is relayed to the child; a later one (a second Ctrl-C)
 *  kills the child and exits 130. If the parent disappears (its IPC channel closes), the child stops
 *  at its next safe point as after a Ctrl-C. */
export async function superviseSelf(): Promise<void> {
  if (process.env[TRAINER_CHILD_ENV] === "1") {
    if (process.channel) {
      process.on("disconnect", () =>
        watching
          ? watching.request("interrupted: the launching process is gone; stopping after the current step to save a checkpoint")
          : process.exit(130),
      );
      process.channel.unref();
    }
    return;
  }
  const child = spawn(process.execPath, [...process.execArgv, ...process.argv.slice(1)], {
    stdio: ["ignore", "inherit", "inherit", "ipc"],
    detached: true, // own process group: a terminal's Ctrl-C reaches it only through the relay below
    env: { ...process.env, [TRAINER_CHILD_ENV]: "1" },
  });
  let first: number | undefined;
  const relay = (sig: NodeJS.Signals) => {
    if (first === undefined) {
      first = Date.now();
      child.kill(sig);
    } else if (Date.now() - first > SAME_INTERRUPT_MS) {
      child.kill("SIGKILL");
      processIo.stderr("interrupted again: exiting without saving (the last complete checkpoint is kept)");
      process.exit(130);
    }
  };
  for (const s of SIGNALS) process.on(s, relay);
  const stopWatching = watchLauncher(() => {
    processIo.stderr("the npm/npx process that launched this one is gone: stopping as on SIGTERM");
    relay("SIGTERM");
  });
  const code = await new Promise<number>((resolve) => {
    child.on("error", (err) => {
      processIo.stderr(`error: could not start the trainer process: ${err.message}`);
      resolve(1);
    });
    child.on("exit", (c, sig) => resolve(c ?? 128 + (sig ? os.constants.signals[sig] : 0)));
  });
  stopWatching();
  process.exit(code);
  await new Promise(() => {}); // process.exit does not return; keep the script from going on meanwhile
}

/** Linux: a process's state, parent pid and start time (to tell it from a later process with its pid). */
function procStat(pid: number): { state: string; ppid: number; start: string; cmd: string } | null {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    const f = stat.slice(stat.lastIndexOf(")") + 2).split(" "); // after "pid (comm) ": state ppid ...
    const cmd = fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ");
    return { state: f[0], ppid: Number(f[1]), start: f[19], cmd };
  } catch {
    return null;
  }
}

/** `npx tsx scripts/x.ts` runs npm → sh → tsx → this process. A SIGTERM to npm alone (a user's
 *  `kill $!` after `npx … &`) ends npm and sh but not tsx or this process, which would go on serving
 *  or training with no one to stop them. So, where the process table can be read (Linux), watch the
 *  nearest npm ancestor and call `gone` once it has exited. Returns the function that stops watching. */
function watchLauncher(gone: () => void): () => void {
  let pid = process.ppid;
  let npm: { pid: number; start: string } | null = null;
  for (let depth = 0; depth < 6 && pid > 1 && npm === null; depth++) {
    const st = procStat(pid);
    if (st === null) break;
    if (/^npm( |$)|(^|\/)npx( |$)/.test(st.cmd)) npm = { pid, start: st.start };
    pid = st.ppid;
  }
  if (npm === null) return () => undefined;
  const timer = setInterval(() => {
    const st = procStat(npm.pid);
    if (st !== null && st.start === npm.start && st.state !== "Z" && st.state !== "X") return; // a zombie has exited too
    clearInterval(timer);
    gone();
  }, 500);
  timer.unref();
  return () => clearInterval(timer);
}

/** A server's way to stop (scripts/serve.ts, serve-openai.ts): the first SIGINT/SIGTERM closes it
 *  (`note` says what that abandons) and exits 0; a second exits 130 at once. */
export function closeOnSignal(server: { close(): Promise<void> }, log: (line: string) => void, note = ""): void {
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) {
      log(`${signal} again: exiting now`);
      process.exit(130);
    }
    stopping = true;
    log(`${signal}: shutting down${note ? ` (${note}; ${signal} again to exit at once)` : ""}`);
    void server.close().then(() => process.exit(0));
  };
  process.on("SIGINT", () => stop("SIGINT"));
  process.on("SIGTERM", () => stop("SIGTERM"));
}
