/** The scripts' `--help` texts against the texts captured in test/fixtures/help/ (captured from the
 *  scripts themselves; compared here through the commands the scripts build, in-process).
 *  Help is compared entry by entry with whitespace collapsed, since commander pads every entry to the
 *  longest flag and wraps at 80 columns: one new long flag moves every line. A flag added since the
 *  capture is listed in ADDED; a flag whose text changed on purpose in CHANGED (with its new text). */
import { describe, expect, it } from "vitest";
import { promises as fs } from "node:fs";
import * as path from "node:path";
import type { Command } from "commander";
import { chatCommand } from "../../src/run/chat.ts";
import { evalCommand } from "../../src/run/eval-run.ts";
import { grpoCommand } from "../../src/run/grpo-flags.ts";
import { sftCommand } from "../../src/run/sft-flags.ts";

const ROOT = path.join(import.meta.dirname, "..", "..");
const FIXTURES = path.join(ROOT, "test", "fixtures", "help");

/** Flags (as the entry starts, e.g. "--max_steps <n>") that exist now and did not at the capture. */
const TOOL_FLAGS = ["--tools <list>", "--tool_timeout <s>", "--tool_max_chars <n>"];
const ROLLOUT_FLAGS = [
  "--rollout_engine <kind>",
  "--rollout_url <url>",
  "--rollout_model <name>",
  "--rollout_timeout <s>",
  "--async_rollouts <k>",
];
/** Every engine's flags but the training ones (--async_rollouts): eval and chat take them too. */
const ENGINE_FLAGS = [
  "--rollout_engine <kind>",
  "--engine_weights <type>",
  "--engine_gpu <kind>",
  "--rollout_url <url>",
  "--rollout_model <name>",
  "--rollout_timeout <s>",
];
const ADDED: Record<string, string[]> = {
  "train-sft": [],
  "train-gsm8k-agent": [
    "--importance_sampling_level <level>",
    "--mask_truncated_completions",
    ...TOOL_FLAGS,
    "--env <url>",
    "--env_dialect <kind>",
    "--env_max_failed_steps <n>",
    "--env_tasks <ranges>",
    "--env_eval_tasks <ranges>",
    ...ROLLOUT_FLAGS,
    "--engine_weights <type>",
    "--engine_gpu <kind>",
    "--tis_cap <c>",
  ],
  eval: [...TOOL_FLAGS, "--env <url>", "--env_dialect <kind>", "--env_tasks <ranges>", ...ENGINE_FLAGS],
  chat: [...TOOL_FLAGS, ...ENGINE_FLAGS],
};

/** Descriptions that changed on purpose: the agent's tools are a flag now, not the calculator alone. */
const HEADS: Record<string, string> = {
  eval: "Usage: eval [options] Accuracy of one or more checkpoints on held-out GSM8K-format questions or a task file, with the --tools tools",
  chat: "Usage: chat [options] Chat with a checkpoint as a tool-using agent. commands: /reset (new conversation), /temp T (0 = greedy), /tools on|off, /exit",
};

/** Entries whose text changed on purpose: old flag → the whole new entry, whitespace collapsed. */
const CHANGED: Record<string, Record<string, string>> = {
  "train-sft": {
    // Micro-batches split by memory on wasm.
    "--batch_size <n>":
      "--batch_size <n> conversations per micro-batch (on wasm, fewer where one layer of it would hold over 1 GiB; results do not change) (default: 8)",
    // A run killed before its first checkpoint is run again from step 0.
    "--resume":
      "--resume continue (or finish) the run in --output_dir from its latest checkpoint (from step 0 if it stopped before its first) (default: false)",
  },
  eval: {
    "--dataset <name>":
      '--dataset <name> gsm8k, synthetic, a GSM8K .jsonl/.parquet path or folder, or a task .jsonl ({id, query, answer, scorer?, answer_schema?}) (default: "gsm8k")',
  },
  "train-gsm8k-agent": {
    // "RL steps" was named after epochs; the old name stays accepted, hidden from --help.
    "--total_epochs <n>": "--max_steps <n> RL steps; each is one rollout → train round (default: 100)",
    // The loss table's names with each one's help, and minirl's own upper clip default.
    "--loss_type <kind>":
      '--loss_type <kind> grpo: clipped ratio, mean per sequence then over sequences; bnpo: clipped ratio, mean over all tokens; dapo: clipped ratio, mean over all tokens; dr_grpo: clipped ratio, sum ÷ (sequences × max_new_tokens); gspo: grpo with one importance ratio per sequence (GSPO); minirl: AgentRL\'s −sg(ρ)·A·logp, out-of-window tokens dropped, sum per sequence (default: "grpo")',
    "--resume":
      "--resume continue the run in --output_dir from its latest checkpoint (from step 0 if it stopped before its first) (default: false)",
    "--epsilon_high <x>": "--epsilon_high <x> upper clip range (default: --epsilon; minirl: --epsilon + 0.1, AgentRL's window)",
    // Task files next to GSM8K's format, and the environment's reward.
    "--dataset <name|path>":
      '--dataset <name|path> gsm8k (local HF cache or hub), synthetic, a GSM8K-format .jsonl/.parquet path, or a task .jsonl ({id, query, answer, scorer?, answer_schema?}) (default: "gsm8k")',
    "--reward_weights <spec>":
      '--reward_weights <spec> weights of the reward components, e.g. correctness=1,format=0.1,tool_use=0 (with --env: env=1) (default: "correctness=1,format=0.1")',
    // Micro-batches split by memory on wasm, and sized to a GPU's memory by auto.
    "--micro_batch_size <n>":
      "--micro_batch_size <n|auto> rollouts per forward/backward, at most (memory knob; results do not change up to float rounding). On wasm, fewer where one layer of the micro-batch would hold over 1 GiB (0.5B: 4 rollouts of ~500 tokens). auto: on a GPU as many as fit half its memory beside the weights (estimated from shapes; an out-of-memory error in the step's first micro-step halves it), on wasm the 1 GiB rule alone; the split it chose is printed at the first update and after an out-of-memory halving, and kept in run.json (micro_batch_auto) and metrics.jsonl (micro_batches, micro_batch_rows) (default: 8)",
  },
};

interface Help {
  head: string; // usage line and description
  entries: Map<string, string>; // flag → whole entry text
}

function parseHelp(text: string): Help {
  const [head, options = ""] = text.split(/\nOptions:\n/);
  const entries = new Map<string, string>();
  let current: string[] = [];
  const flush = () => {
    if (current.length === 0) return;
    const entry = current.join(" ").replace(/\s+/g, " ").trim();
    entries.set(flagOf(entry), entry);
    current = [];
  };
  for (const line of options.split("\n")) {
    if (/^ {2}-/.test(line)) flush();
    if (line.trim() !== "") current.push(line);
  }
  flush();
  return { head: head.replace(/\s+/g, " ").trim(), entries };
}

/** "--lora_r <n> LoRA rank (default: 16)" → "--lora_r <n>": the flag and its argument. */
function flagOf(entry: string): string {
  return /^(-\w, )?--[\w-]+( <[^>]+>| \[[^\]]+\])?/.exec(entry)![0];
}

const COMMANDS: Record<string, () => Command> = {
  "train-sft": sftCommand,
  "train-gsm8k-agent": grpoCommand,
  eval: evalCommand,
  chat: chatCommand,
};

describe.each(Object.keys(ADDED))("%s --help", (script) => {
  it("is the captured text apart from the flags added or changed on purpose", async () => {
    const before = parseHelp(await fs.readFile(path.join(FIXTURES, `${script}.txt`), "utf8"));
    const now = parseHelp(COMMANDS[script]().helpInformation());
    expect(now.head).toBe(HEADS[script] ?? before.head);
    const changed = CHANGED[script] ?? {};
    for (const flag of Object.keys(changed)) expect(before.entries.has(flag), `${flag} was not in the captured help`).toBe(true);
    const expected = new Map(
      [...before.entries].map(([flag, entry]) => (changed[flag] ? [flagOf(changed[flag]), changed[flag]] : [flag, entry])),
    );
    const added = new Set(ADDED[script]);
    const nowKept = [...now.entries].filter(([flag]) => !added.has(flag));
    for (const flag of added) expect(now.entries.has(flag), `${flag} is listed as added but absent`).toBe(true);
    // Same entries with the same text; order: the captured order, new entries where they fall.
    expect(new Map(nowKept)).toEqual(expected);
    const order = (flags: string[]) => flags.filter((f) => expected.has(f));
    expect(order(nowKept.map(([f]) => f))).toEqual(order([...expected.keys()]));
  });
});
