/** The stdio transport for MCP servers this process starts (in place of the SDK's StdioClientTransport,
 *  with the same framing: one JSON-RPC message per line). What differs, and why:
 *  - the server runs in its own process group (a new session: Ctrl-C in a chat reaches the chat, not
 *    the server), and close() signals the whole group: `npx -y pkg` and `sh -c` start the real server
 *    as a grandchild, which outlived a signal to the direct child and kept the script's pipes open;
 *  - the streams are destroyed on close, so nothing of the server keeps this process's event loop alive;
 *  - the direct child's exit is the server going away (its grandchildren are signalled too), even when
 *    a grandchild still holds stdout;
 *  - the environment is this process's (API keys, proxies, MEMORY_FILE_PATH...) with `env` on top, not
 *    the SDK's default of HOME, PATH, SHELL and TERM;
 *  - groups still running when this process exits (an error, process.exit) get SIGTERM then.
 *  Leaves out: Windows (no process groups there). */
import { spawn, type ChildProcess } from "node:child_process";
import { ReadBuffer, serializeMessage } from "@modelcontextprotocol/sdk/shared/stdio.js";
import type { Transport } from "@modelcontextprotocol/sdk/shared/transport.js";
import type { JSONRPCMessage } from "@modelcontextprotocol/sdk/types.js";

export interface StdioServerParams {
  command: string;
  args: string[];
  /** Set on top of this process's environment. */
  env?: Record<string, string>;
  cwd?: string;
  /** Each line the server writes to stderr (default: dropped). */
  onStderrLine?: (line: string) => void;
  /** How long close() waits after closing stdin, and again after SIGTERM, before the next step (ms). */
  graceMs?: number;
}

const liveGroups = new Set<number>(); // process-group ids of servers not yet closed
let exitHookInstalled = false;

function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // ESRCH: the group is gone already
  }
}

/** Resolves true once no process of the group is left, false after `ms` (polled every 50 ms; `ref`
 *  false: the polling does not keep this process alive). */
async function groupGone(pgid: number, ms: number, ref = true): Promise<boolean> {
  for (const end = Date.now() + ms; ;) {
    try {
      process.kill(-pgid, 0);
    } catch {
      return true;
    }
    if (Date.now() >= end) return false;
    await new Promise((r) => {
      const t = setTimeout(r, 50);
      if (!ref) t.unref();
    });
  }
}

export class ProcessGroupStdioTransport implements Transport {
  onclose?: () => void;
  onerror?: (error: Error) => void;
  onmessage?: (message: JSONRPCMessage) => void;
  private child: ChildProcess | null = null;
  private readonly buffer = new ReadBuffer();
  private closed = false;

  constructor(private readonly params: StdioServerParams) {}

  /** The server's process-group id (its direct child's pid), once started. */
  get pid(): number | null {
    return this.child?.pid ?? null;
  }

  start(): Promise<void> {
    if (this.child) throw new Error("ProcessGroupStdioTransport already started");
    if (!exitHookInstalled) {
      exitHookInstalled = true;
      process.once("exit", () => liveGroups.forEach((g) => signalGroup(g, "SIGTERM")));
    }
    return new Promise((resolve, reject) => {
      const child = spawn(this.params.command, this.params.args, {
        env: { ...process.env, ...this.params.env },
        cwd: this.params.cwd,
        stdio: ["pipe", "pipe", "pipe"],
        detached: true, // setsid(): its own session and process group, led by this child
      });
      this.child = child;
      child.once("error", (err) => {
        reject(err);
        this.finish();
      });
      child.once("spawn", () => {
        if (child.pid !== undefined) liveGroups.add(child.pid);
        resolve();
      });
      child.once("exit", () => this.finish());
      child.stdin!.on("error", (err) => this.onerror?.(err)); // EPIPE when the server is gone
      child.stdout!.on("data", (chunk: Buffer) => {
        try {
          this.buffer.append(chunk);
          for (let m = this.buffer.readMessage(); m !== null; m = this.buffer.readMessage()) this.onmessage?.(m);
        } catch (err) {
          this.onerror?.(err as Error); // a line that is not JSON-RPC: reported, the stream goes on
        }
      });
      let partial = "";
      child.stderr!.on("data", (chunk: Buffer) => {
        const lines = (partial + chunk.toString("utf8")).split("\n");
        partial = lines.pop()!.slice(-4_000);
        for (const line of lines) if (line.trim()) this.params.onStderrLine?.(line);
      });
    });
  }

  send(message: JSONRPCMessage): Promise<void> {
    const stdin = this.child?.stdin;
    if (!stdin || this.closed || stdin.destroyed) return Promise.reject(new Error("Not connected"));
    return new Promise((resolve) => {
      if (stdin.write(serializeMessage(message))) resolve();
      else stdin.once("drain", resolve);
    });
  }

  /** Close stdin (well-behaved servers exit on EOF), then SIGTERM the group, then SIGKILL it, each
   *  after the grace time if any process of the group is left: the direct child (npx, sh) may be gone
   *  while the server it started is not. */
  async close(): Promise<void> {
    const pgid = this.child?.pid;
    if (pgid === undefined) return this.finish();
    const grace = this.params.graceMs ?? 2_000;
    this.child!.stdin?.end();
    if (!(await groupGone(pgid, grace))) {
      signalGroup(pgid, "SIGTERM");
      if (!(await groupGone(pgid, grace))) signalGroup(pgid, "SIGKILL");
    }
    this.finish();
  }

  /** Once: signal what is left of the group, destroy the streams, report the close. */
  private finish(): void {
    if (this.closed) return;
    this.closed = true;
    const child = this.child;
    const pgid = child?.pid;
    if (pgid !== undefined) {
      // The direct child is gone (or close() is done): what is left of its group goes too.
      signalGroup(pgid, "SIGTERM");
      void groupGone(pgid, this.params.graceMs ?? 2_000, false).then((gone) => gone || signalGroup(pgid, "SIGKILL"));
      liveGroups.delete(pgid);
    }
    for (const s of [child?.stdin, child?.stdout, child?.stderr]) s?.destroy();
    child?.unref();
    this.buffer.clear();
    this.onclose?.();
  }
}
