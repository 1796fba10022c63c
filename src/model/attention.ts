/** Host-side pieces of Qwen2 attention that depend only on the masks: position ids, the additive
 *  attention bias and the RoPE tables. Pure functions over plain arrays (tested on hand values). */

/** The bias of a masked score: exp() of it is 0 beside any real score, and it is finite, so an
 *  all-masked row (a pad query) stays finite. Not float32's lowest value as in Hugging Face: the
 *  webgpu backend's softmax gives NaN for a row of those, and the NaN reaches real rows through the
 *  pad positions' values (0 · NaN). */
export const MASKED = -1e9;

/** position = past + cumsum(mask) − 1 per row, pads set to 1 (what HF generate() builds). */
export function positionIds(mask: number[][], past: number[] = []): number[][] {
  return mask.map((row, b) => {
    let c = past[b] ?? 0;
    return row.map((m) => (m ? c++ : 1));
  });
}

/** Additive bias [B, T, W] (flattened): query t (absolute index S−T+t) sees key j iff j ≤ that index
 *  and keyMask[b][j] = 1. keyMask rows have length S (cached positions then the new ones); keys S…W − 1
 *  (a KV cache's free room, W ≥ S, default S) are masked. */
export function attentionBias(keyMask: number[][], T: number, W = keyMask[0].length): Float32Array {
  const B = keyMask.length,
    S = keyMask[0].length,
    L = S - T;
  const out = new Float32Array(B * T * W).fill(MASKED);
  for (let b = 0; b < B; b++)
    for (let t = 0; t < T; t++) for (let j = 0; j < S; j++) out[(b * T + t) * W + j] = j <= L + t && keyMask[b][j] ? 0 : MASKED;
  return out;
}

/** inv_freq[i] = 1/θ^(2i/d), in float32 steps like HF's rotary embedding. */
export function ropeInvFreq(theta: number, dim: number): Float32Array {
  const f = new Float32Array(dim / 2);
  for (let i = 0; i < dim / 2; i++) f[i] = Math.fround(1 / Math.fround(theta ** Math.fround((2 * i) / dim)));
  return f;
}

/** cos and signed sin tables [N, dim] for flattened positions: cos of cat(angle, angle) and
 *  cat(−sin, sin), so rotate_half(x)·sin = cat(x2, x1)·sinSigned (halves swapped, not negated). */
export function ropeTables(positions: number[], invFreq: Float32Array): { cos: Float32Array; sin: Float32Array } {
  const half = invFreq.length,
    dim = 2 * half;
  const cos = new Float32Array(positions.length * dim),
    sin = new Float32Array(positions.length * dim);
  positions.forEach((p, n) => {
    for (let i = 0; i < half; i++) {
      const a = Math.fround(p * invFreq[i]);
      const c = Math.cos(a),
        s = Math.sin(a);
      cos[n * dim + i] = c;
      cos[n * dim + half + i] = c;
      sin[n * dim + i] = -s;
      sin[n * dim + half + i] = s;
    }
  });
  return { cos, sin };
}

/** The [batch][seq] token ids of a forward (equal lengths, ids below V) and their attention mask (all
 *  ones when absent), checked: the mask is returned. */
export function checkBatch(V: number, ids: number[][], mask?: number[][]): number[][] {
  if (!Array.isArray(ids) || ids.length === 0 || !Array.isArray(ids[0]) || ids[0].length === 0)
    throw new Error("inputIds must be a non-empty [batch][seq] array");
  const T = ids[0].length;
  for (const row of ids) {
    if (row.length !== T) throw new Error(`inputIds rows must all have length ${T} (left-pad them), got ${row.length}`);
    for (const t of row) if (!(Number.isInteger(t) && t >= 0 && t < V)) throw new Error(`token id ${t} out of range 0..${V - 1}`);
  }
  const m = mask ?? ids.map((r) => r.map(() => 1));
  if (m.length !== ids.length || m.some((r) => r.length !== T))
    throw new Error(`attentionMask must have the shape of inputIds [${ids.length}, ${T}]`);
  return m;
}
