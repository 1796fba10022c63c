/** The compiled decoder's programs over the head's logits, one workgroup per sampling row: the
 *  draw (vocab.ts' greedy pick or whole-vocabulary id walk, the same WGSL), and a top-k/top-p row's
 *  candidates for the host's draw. Both write into the scratch (bound as `drawn`: the draw's code has
 *  an `s` of its own). */
import { cols, f32, rowPrelude } from "../program.ts";
import { drawWgsl, greedyWgsl } from "../vocab.ts";
import { CAND_K, kernel, SAMPLE_INTS, sampleBase, scratchLayout, type DecodeShape, type Kernel } from "./layout.ts";

/** A program over each sampling row's logits (256 threads, program.ts' row prelude). */
const rowKernel = (key: string, body: string): Kernel =>
  kernel(
    key,
    256,
    [
      ["drawn", "storage"],
      ["rin", "read-only-storage"],
      ["logits", "read-only-storage"],
    ],
    `${rowPrelude(256, "rin[1]")}${body}`,
  );

/** One sampling row per workgroup: greedy (T = 0) or the whole-vocabulary draw at temperature T
 *  (vocab.ts' code), the token and log-prob written to the scratch's OUT region at the row's slot
 *  (where the next pass's embedding reads a token fed on the device). */
export function sampleKernel(s: DecodeShape, T: number): Kernel {
  const { OUT } = scratchLayout(s);
  const SB = sampleBase(s);
  const io = {
    x: (i: string) => `logits[${i}]`,
    u: [`bitcast<f32>(rin[${SB} + row() * ${SAMPLE_INTS} + 2])`, `bitcast<f32>(rin[${SB} + row() * ${SAMPLE_INTS} + 3])`] as [
      string,
      string,
    ],
    write: (tok: string, lp: string) => `let slot = rin[${SB} + row() * ${SAMPLE_INTS} + 1];
      drawn[${OUT} + slot * 2] = ${tok};
      drawn[${OUT} + slot * 2 + 1] = ${lp};`,
  };
  return rowKernel(`sample_${T}`, T === 0 ? greedyWgsl(s.V, io) : drawWgsl(s.V, T, io));
}

/** A top-k/top-p row's candidates, what sampler.ts drawCandidates reads: [below, tied, values K, ids K]
 *  with the K largest logits (any order; of the ties at the K-th value, any that fit), `below` the
 *  normaliser's part under the K-th value (Σ exp((x − max)/T)), `tied` the count at it. The K-th
 *  value is found exactly by bisecting on the float's order-preserving bit pattern (32 counts of
 *  the row), so no sort of the vocabulary. One workgroup per sampling row; written to the scratch's
 *  CAND region (K ≤ CAND_K). */
export function candidatesKernel(s: DecodeShape, K: number, T: number): Kernel {
  const { CAND } = scratchLayout(s);
  const V = s.V,
    W = 2 + 2 * CAND_K;
  return rowKernel(
    `cand_${K}_${T}`,
    `var<workgroup> filled: atomic<u32>;
fn key(v: f32) -> u32 {
  let b = bitcast<u32>(v);
  return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}
fn unkey(k: u32) -> f32 { return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u)); }
fn main(index: i32) {
  let o = row() * ${V};
  var m = -3.4028234663852886e38;
  ${cols(V, 256, `m = max(m, logits[o + j]);`)}
  m = reduceMax(m);
  // the largest key t with at least K logits at or above it: the K-th value
  var lo = 0u;
  var hi = 0xffffffffu;
  for (var it = 0; it < 32; it++) {
    let mid = lo + (hi - lo) / 2u + ((hi - lo) & 1u); // the upper middle, without overflowing at the full range
    var c = 0.0;
    ${cols(V, 256, `if (key(logits[o + j]) >= mid) { c += 1.0; }`)}
    let n = reduceSum(c);
    let up = n >= ${f32(K)};
    lo = select(lo, mid, up);
    hi = select(mid - 1u, hi, up);
  }
  let kth = unkey(lo);
  if (localIndex == 0u) { atomicStore(&filled, 0u); }
  workgroupBarrier();
  let out = ${CAND} + row() * ${W};
  var below = 0.0;
  var tied = 0.0;
  ${cols(
    V,
    256,
    `let v = logits[o + j];
    if (v > kth) {
      let at = atomicAdd(&filled, 1u);
      if (rowOk()) { drawn[out + 2 + i32(at)] = v; drawn[out + 2 + ${K} + i32(at)] = f32(j); }
    } else if (v < kth) {
      let z = (v - m) / ${f32(T)};
      if (z > -40.0) { below += exp(z); }
    } else { tied += 1.0; }`,
  )}
  workgroupBarrier();
  ${cols(
    V,
    256,
    `if (logits[o + j] == kth) {
      let at = atomicAdd(&filled, 1u);
      if (at < ${K}u && rowOk()) { drawn[out + 2 + i32(at)] = kth; drawn[out + 2 + ${K} + i32(at)] = f32(j); }
    }`,
  )}
  let b = reduceSum(below);
  let t = reduceSum(tied);
  if (rowOk() && localIndex == 0u) {
    drawn[out] = b;
    drawn[out + 1] = t;
  }
}`,
  );
}
