/** Which vocabulary tokens a constrained row may take next (json-grammar.ts is the grammar).
 *  Each token's text is decoded once per tokenizer; the texts are walked in sorted order so the
 *  recognizer states of a shared prefix are reused, and every token under a refused prefix is skipped
 *  without being read. Tokens that are not whole characters (U+FFFD when decoded alone), control
 *  tokens (`<|...|>`) and empty ones never enter a constrained value; the stop tokens are allowed once
 *  the value may end. */
import type { Tokenizer } from "../../model/types.ts";
import { advance, canEnd, step, type State } from "./json-grammar.ts";

export interface Vocab {
  texts: string[]; // sorted
  ids: Int32Array; // ids[i]: the token whose text is texts[i]
  textOf: (string | null)[]; // by id; null: never allowed inside a value
  size: number;
  longest: number; // characters of the longest token text (special tokens included)
}

const vocabs = new WeakMap<Tokenizer, Vocab>();

/** The tokenizer's tokens as texts, sorted (built once per tokenizer). */
export function vocabOf(tok: Tokenizer, size: number): Vocab {
  const have = vocabs.get(tok);
  if (have) return have;
  const textOf: (string | null)[] = [];
  const entries: [string, number][] = [];
  let longest = 1;
  for (let id = 0; id < size; id++) {
    const t = id < tok.vocabSize ? tok.decode([id]) : "";
    longest = Math.max(longest, t.length);
    const ok = t !== "" && !t.includes("\uFFFD") && !/^<\|.*\|>$/.test(t);
    textOf.push(ok ? t : null);
    if (ok) entries.push([t, id]);
  }
  entries.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  const v = { texts: entries.map((e) => e[0]), ids: Int32Array.from(entries.map((e) => e[1])), textOf, size, longest };
  vocabs.set(tok, v);
  return v;
}

/** allowed[id] = 1 for every token the state takes (stop tokens when the value may end). */
export function tokenMask(state: State, vocab: Vocab, stopIds: Iterable<number>, allowed = new Uint8Array(vocab.size)): Uint8Array {
  allowed.fill(0);
  if (canEnd(state)) for (const id of stopIds) allowed[id] = 1;
  if (state === null) return allowed;
  // states[k]: the state after the first k characters of the previous text (undefined: refused there).
  const states: (State | undefined)[] = [state];
  let prev = "";
  for (let i = 0; i < vocab.texts.length; i++) {
    const text = vocab.texts[i];
    // k: characters shared with the previous text whose states are known (only the last may be refused)
    let k = 0;
    const n = Math.min(prev.length, text.length, states.length - 1);
    while (k < n && text.charCodeAt(k) === prev.charCodeAt(k)) k++;
    if (states[k] === undefined) continue; // under a refused prefix
    states.length = k + 1;
    let s: State | undefined = states[k];
    for (let j = k; j < text.length && s !== undefined; j++) {
      s = step(s, text[j]);
      states.push(s);
    }
    prev = text;
    if (s !== undefined) allowed[vocab.ids[i]] = 1;
  }
  return allowed;
}

/** The state after a token, or undefined if the grammar refuses its text. */
export function takeToken(state: State, vocab: Vocab, id: number): State | undefined {
  const t = vocab.textOf[id];
  return t === null || t === undefined ? undefined : advance(state, t);
}
