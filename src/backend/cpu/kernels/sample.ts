/**
 * Token sampling from rows of logits (batched generation, on-policy distillation), the reference of the CUDA kernel
 * (src/backend/cuda/kernels/sample.ts), in float64. For a row z over the first `vocab` columns:
 *   greedy (temperature 0): the first index of the maximum;
 *   else, with e_j = exp((z_j − max z) / T): the kept set is every token with z_j ≥ θ, θ = max(θ_k, θ_p), where
 *     θ_k = the k-th largest logit (topK > 0; every token tied with it is kept too; topK 0 or ≥ vocab: no cut),
 *     θ_p = the largest logit value v such that Σ_{j kept by θ_k, z_j ≥ v} e_j ≥ topP · Σ_{j kept by θ_k} e_j
 *           (the nucleus: the most likely tokens whose mass reaches topP, ties kept; topP ≥ 1: no cut);
 *   then r = u · Σ_kept e_j and the token is the first j, in index order over the kept tokens, whose running sum of e
 *   passes r (u: the row's uniform in [0, 1)).
 * Thresholds on logit values (not on a sorted order) are what a GPU block computes by bisection on the values' bits.
 */

import type { SampleParams } from '../../backend.js';

export function sampleRow(z: ArrayLike<number>, off: number, vocab: number, s: SampleParams, u: number): number {
  let mx = -Infinity, arg = 0;
  for (let j = 0; j < vocab; j++) { const x = z[off + j]!; if (x > mx) { mx = x; arg = j; } }
  if (!(s.temperature > 0)) return arg;
  const invT = 1 / s.temperature;
  const cutK = s.topK > 0 && s.topK < vocab, cutP = s.topP < 1;
  // the sorted order only where a cut needs it (plain temperature sampling is one pass: the host streams with it)
  const order = cutK || cutP ? Array.from({ length: vocab }, (_, j) => j).sort((a, b) => z[off + b]! - z[off + a]! || a - b) : [];
  let theta = -Infinity;
  if (cutK) theta = z[off + order[s.topK - 1]!]!;
  if (cutP) {
    let massK = 0;
    for (let j = 0; j < vocab; j++) if (z[off + j]! >= theta) massK += Math.exp((z[off + j]! - mx) * invT);
    let acc = 0;
    for (let i = 0; i < vocab; i++) {
      const x = z[off + order[i]!]!;
      if (x < theta) break;
      acc += Math.exp((x - mx) * invT);
      // include every token tied with this one before testing (a threshold keeps ties)
      if (i + 1 < vocab && z[off + order[i + 1]!] === x) continue;
      if (acc >= s.topP * massK) { theta = Math.max(theta, x); break; }
    }
  }
  let mass = 0;
  for (let j = 0; j < vocab; j++) if (z[off + j]! >= theta) mass += Math.exp((z[off + j]! - mx) * invT);
  const r = u * mass;
  let acc = 0, last = arg;
  for (let j = 0; j < vocab; j++) {
    if (z[off + j]! < theta) continue;
    acc += Math.exp((z[off + j]! - mx) * invT);
    last = j;
    if (acc > r) return j;
  }
  return last;
}
