/**
 * Token sampling from rows of logits (batched generation, on-policy distillation), the reference of the CUDA kernel
 * (src/backend/cuda/kernels/sample.ts), in float64. transformers' order: the repetition penalty on the raw logits, then
 * temperature, top-k, top-p, min-p. For a row z over the first `vocab` columns:
 *   repetition penalty P ≠ 1 (with a seen-token bitmask, seenWords(vocab) 32-bit words a row, bit j of word j >> 5): every
 *     seen token's logit becomes z·P where negative, z / P otherwise (transformers' RepetitionPenaltyLogitsProcessor
 *     over the sequence's ids: each distinct id once); the rest of the rule reads these logits;
 *   greedy (temperature 0): the first index of the maximum;
 *   else, with e_j = exp((z_j − max z) / T): the kept set is every token with z_j ≥ θ and e_j ≥ minP, θ = max(θ_k, θ_p), where
 *     θ_k = the k-th largest logit (topK > 0; every token tied with it is kept too; topK 0 or ≥ vocab: no cut),
 *     θ_p = the largest logit value v such that Σ_{j kept by θ_k, z_j ≥ v} e_j ≥ topP · Σ_{j kept by θ_k} e_j
 *           (the nucleus: the most likely tokens whose mass reaches topP, ties kept; topP ≥ 1: no cut),
 *     e_j ≥ minP: min-p, a token at least minP times as likely as the most likely one (minP 0: no cut; after top-p, so
 *           it does not change the nucleus; the most likely token always passes);
 *   then r = u · Σ_kept e_j and the token is the first j, in index order over the kept tokens, whose running sum of e
 *   passes r (u: the row's uniform in [0, 1)).
 * Thresholds on logit values (not on a sorted order) are what a GPU block computes by bisection on the values' bits.
 */

import { penaltyAndMinP, type SampleParams } from '../../backend.js';

/** Whether id j is marked in the bitmask row at word offset off. */
export function isSeen(seen: ArrayLike<number>, off: number, j: number): boolean {
  return ((seen[off + (j >>> 5)]! >>> (j & 31)) & 1) === 1;
}

/** Marks id j in the bitmask row at word offset off (an Int32Array or Uint32Array). */
export function markSeen(seen: Int32Array | Uint32Array, off: number, j: number): void {
  seen[off + (j >>> 5)] = seen[off + (j >>> 5)]! | (1 << (j & 31));
}

/**
 * The repetition penalty applied in place to a row of logits (Backend.sampleTokens: the device sampler rewrites the
 * marked ids' logits of its scratch row): each id marked in the bitmask row at word offset seenOff, once.
 */
export function penalizeInPlace(z: { [i: number]: number }, off: number, vocab: number, penalty: number, seen: ArrayLike<number>, seenOff: number): void {
  for (let j = 0; j < vocab; j++) {
    if (!isSeen(seen, seenOff, j)) continue;
    const x = z[off + j]!;
    z[off + j] = x < 0 ? x * penalty : x / penalty;
  }
}

/**
 * The row's logits with the repetition penalty applied to its seen ids (a copy in the row's own float type, so that a
 * float32 row rounds as the backend's in-place penalty does), or the row itself (and its offset) when there is none.
 */
function penalizedRow(z: ArrayLike<number>, off: number, vocab: number, penalty: number, seen: ArrayLike<number> | null | undefined, seenOff: number): { z: ArrayLike<number>; off: number } {
  if (penalty === 1) return { z, off };
  const out = z instanceof Float32Array ? new Float32Array(vocab) : new Float64Array(vocab);
  for (let j = 0; j < vocab; j++) out[j] = z[off + j]!;
  penalizeInPlace(out, 0, vocab, penalty, seen!, seenOff);
  return { z: out, off: 0 };
}

/** The kept set's rule over a (penalized) row: its maximum and first argmax, θ and the min-p bound on e_j. */
interface Kept { mx: number; arg: number; theta: number; invT: number; minP: number }

function keptRule(z: ArrayLike<number>, off: number, vocab: number, s: SampleParams, minP: number): Kept {
  let mx = -Infinity, arg = 0;
  for (let j = 0; j < vocab; j++) { const x = z[off + j]!; if (x > mx) { mx = x; arg = j; } }
  const invT = 1 / s.temperature;
  if (!(s.temperature > 0)) return { mx, arg, theta: -Infinity, invT, minP };
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
  return { mx, arg, theta, invT, minP };
}

/** The row the rule reads (penalized where the settings say) and its kept set's rule. */
function ruleOf(z: ArrayLike<number>, off: number, vocab: number, s: SampleParams, seen: ArrayLike<number> | null | undefined, seenOff: number): { z: ArrayLike<number>; off: number; k: Kept } {
  const { penalty, minP } = penaltyAndMinP(s, seen);
  const row = penalizedRow(z, off, vocab, penalty, seen, seenOff);
  return { ...row, k: keptRule(row.z, row.off, vocab, s, minP) };
}

/** e_j of a token the rule keeps, −1 for one it drops (a kept e_j may underflow to 0). */
function keptMass(x: number, k: Kept): number {
  if (x < k.theta) return -1;
  const e = Math.exp((x - k.mx) * k.invT);
  return e >= k.minP ? e : -1;
}

/**
 * The token the rule draws from row z (offset off) with uniform u. seen/seenOff: the row's seen-token bitmask (needed
 * with a repetition penalty; not changed here: the caller marks the drawn id).
 */
export function sampleRow(z: ArrayLike<number>, off: number, vocab: number, s: SampleParams, u: number,
  seen?: ArrayLike<number> | null, seenOff = 0): number {
  let k: Kept;
  ({ z, off, k } = ruleOf(z, off, vocab, s, seen, seenOff));
  if (!(s.temperature > 0)) return k.arg;
  let mass = 0;
  for (let j = 0; j < vocab; j++) mass += Math.max(0, keptMass(z[off + j]!, k));
  const r = u * mass;
  let acc = 0, last = k.arg;
  for (let j = 0; j < vocab; j++) {
    const e = keptMass(z[off + j]!, k);
    if (e < 0) continue;
    acc += e;
    last = j;
    if (acc > r) return j;
  }
  return last;
}

/**
 * The distribution the rule draws from (sampled settings: temperature > 0): the probability of each of the first
 * `vocab` ids, 0 for the ones it drops. For checks against other samplers (transformers' processed scores).
 */
export function sampleDistribution(z: ArrayLike<number>, off: number, vocab: number, s: SampleParams,
  seen?: ArrayLike<number> | null, seenOff = 0): Float64Array {
  if (!(s.temperature > 0)) throw new RangeError('sampleDistribution: greedy settings draw no distribution');
  let k: Kept;
  ({ z, off, k } = ruleOf(z, off, vocab, s, seen, seenOff));
  const p = new Float64Array(vocab);
  let mass = 0;
  for (let j = 0; j < vocab; j++) { p[j] = Math.max(0, keptMass(z[off + j]!, k)); mass += p[j]!; }
  for (let j = 0; j < vocab; j++) p[j] = p[j]! / mass;
  return p;
}
