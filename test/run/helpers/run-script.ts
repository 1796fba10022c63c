/** Runs one of scripts/ as a user does (tsx, the repository as the working folder, CI=true so no
 *  progress bars) and collects its exit code and output. */
import { spawn } from "node:child_process";
import * as path from "node:path";

export const ROOT = path.join(import.meta.dirname, "..", "..", "..");
export const TSX = path.join(ROOT, "node_modules", ".bin", "tsx");

export function runScript(
  script: string,
  args: string[],
  env: Record<string, string> = {},
): Promise<{ code: number | null; stderr: string; stdout: string }> {
  return new Promise((resolve) => {
    const p = spawn(TSX, [path.join("scripts", script), ...args], {
      cwd: ROOT,
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, CI: "true", ...env },
    });
    let stderr = "",
      stdout = "";
    p.stderr.on("data", (d) => (stderr += d));
    p.stdout.on("data", (d) => (stdout += d));
    p.on("close", (code) => resolve({ code, stderr, stdout }));
  });
}
