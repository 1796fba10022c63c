/** Right-padding of token sequences into rectangular rows for training forwards. Training sees whole
 *  sequences at once, so right padding is enough: causal attention keeps real tokens from seeing the
 *  pad after them, and positions count from 0 either way. (The rollout engine left-pads for decoding.) */

export interface PaddedBatch {
  ids: number[][]; // [B, L]
  attentionMask: number[][]; // [B, L] 1 on real tokens
  lossMask: number[][]; // [B, L] the given loss masks, 0 on padding
}

/** Pad each sequence (and its loss mask) on the right to the longest one, or to `length`. */
export function rightPad(seqs: number[][], lossMasks: number[][], padId: number, length?: number): PaddedBatch {
  if (seqs.length !== lossMasks.length) throw new Error(`got ${seqs.length} sequences but ${lossMasks.length} loss masks; need one each`);
  if (!Number.isInteger(padId) || padId < 0) throw new Error(`padId ${padId} must be a non-negative integer token id`);
  const longest = Math.max(0, ...seqs.map((s) => s.length));
  const L = length ?? longest;
  if (L < longest) throw new Error(`length ${L} is shorter than the longest sequence (${longest} tokens)`);
  const out: PaddedBatch = { ids: [], attentionMask: [], lossMask: [] };
  seqs.forEach((s, i) => {
    const m = lossMasks[i];
    if (m.length !== s.length) throw new Error(`sequence ${i} has ${s.length} tokens but its loss mask has ${m.length}`);
    const pad = L - s.length;
    out.ids.push([...s, ...new Array<number>(pad).fill(padId)]);
    out.attentionMask.push([...new Array<number>(s.length).fill(1), ...new Array<number>(pad).fill(0)]);
    out.lossMask.push([...m.map((x) => (x ? 1 : 0)), ...new Array<number>(pad).fill(0)]);
  });
  return out;
}

/** Split items into consecutive chunks of at most `size`. */
export function chunks<T>(items: T[], size: number): T[][] {
  if (!(Number.isInteger(size) && size > 0)) throw new Error(`micro-batch size ${size} must be a positive integer`);
  const out: T[][] = [];
  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));
  return out;
}

/** Indices of the sequences in each micro-batch: consecutive chunks of at most `microBatchSize`, a
 *  chunk split again into equal parts when its longest sequence allows fewer rows (`maxRows`, the
 *  rows of that length one forward and backward may hold; at least 1 whatever it says).
 *  `byLength`: the sequences taken longest first (ties in index order), so each micro-batch pads its
 *  rows to a length close to theirs (GRPO's rollouts of one step: 16% padding → 7% in the tiny
 *  quickstart); for losses normalised over the whole batch this changes no gradient, only the order
 *  the micro-batches' gradients are added in. `groups` (with byLength): a group key per sequence
 *  (GRPO: its prompt); groups are kept together, longest group first, longest first within, so a
 *  micro-batch's rows share their prompt where they can (a model that runs a shared prefix once). */
export function microBatchRows(
  lengths: number[],
  microBatchSize: number,
  maxRows?: (length: number) => number,
  byLength = false,
  groups?: number[],
): number[][] {
  const order = lengths.map((_, i) => i);
  const longest = new Map<number, number>(); // a group's longest sequence
  groups?.forEach((g, i) => longest.set(g, Math.max(longest.get(g) ?? 0, lengths[i])));
  const top = (i: number) => (groups ? longest.get(groups[i])! : lengths[i]);
  const group = (i: number) => (groups ? groups[i] : 0);
  if (byLength) order.sort((a, b) => top(b) - top(a) || group(a) - group(b) || lengths[b] - lengths[a] || a - b);
  return chunks(order, microBatchSize).flatMap((rows) => {
    const cap = maxRows ? Math.max(1, Math.floor(maxRows(Math.max(...rows.map((r) => lengths[r]))))) : rows.length;
    return rows.length <= cap ? [rows] : chunks(rows, Math.ceil(rows.length / Math.ceil(rows.length / cap)));
  });
}
