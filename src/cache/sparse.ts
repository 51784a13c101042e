/**
 * Sparse representations of a teacher's next-token distribution q_t = softmax(z / T), one per position:
 *
 * - `sample:N` (the default, N = 32): N draws from q_t by systematic sampling (one uniform u, the points (i + u) / N
 *   of the cumulative distribution, i < N: each draw is distributed as q_t), kept as the distinct ids drawn with
 *   log q_t of each. A token is drawn with probability exactly min(1, N·q_t), so the sparse loss weighs a drawn id k
 *   by π_k = q_t(k) / min(1, N·q_t(k)) = max(q_t(k), 1/N) (the Horvitz–Thompson weight), and Σ_k (π_k / q_t(k)) h_k
 *   is an unbiased estimate of every divergence Σ_j h_j and of its gradient (sampling the teacher for unbiased sparse
 *   targets: Anshumann et al., "Sparse Logit Sampling", ACL 2025). Every token of probability ≥ 1/N is always kept
 *   at its own probability: the estimate's variance comes from the tokens below 1/N only.
 * - `top:K`: the K most likely tokens with their probabilities, and the mass r the teacher puts on every other token
 *   (the loss treats it as one bucket: exact when K covers the vocabulary, biased otherwise, as in the tools that store
 *   top-K lists).
 *
 * Everything here is float64 on the host; the cache writer quantizes what it stores (src/cache/format.ts).
 */
import { MAX_SPARSE_SLOTS } from '../backend/backend.js';
import { UsageError } from '../cli/args.js';

export type SparseRep = { kind: 'sample'; n: number } | { kind: 'top'; k: number };

export const DEFAULT_SPARSE: SparseRep = { kind: 'sample', n: 32 };

export function formatSparse(r: SparseRep): string { return r.kind === 'sample' ? `sample:${r.n}` : `top:${r.k}`; }

/** Parses --sparse sample:N | top:K (1 ≤ N, K ≤ MAX_SPARSE_SLOTS). */
export function parseSparse(s: string): SparseRep {
  const m = /^(sample|top):(\d+)$/.exec(s.trim());
  const n = m ? Number(m[2]) : NaN;
  if (!m || !(n >= 1 && n <= MAX_SPARSE_SLOTS)) {
    throw new UsageError(`--sparse ${JSON.stringify(s)}: expected sample:N or top:K with N, K from 1 to ${MAX_SPARSE_SLOTS}`,
      'e.g. --sparse sample:16 (the default: unbiased) or --sparse top:32');
  }
  return m[1] === 'sample' ? { kind: 'sample', n } : { kind: 'top', k: n };
}

/** Slots per position of a representation (the most distinct ids a row can have). */
export function sparseSlots(r: SparseRep): number { return r.kind === 'sample' ? r.n : r.k; }

/** One position's sparse teacher: ids with log q_t, the tail mass r (−1: none) and the teacher's argmax. */
export interface SparseEntry {
  ids: number[];
  /** sample: how often each id was drawn (not stored: the loss weighs by q_t / P(drawn)); top: empty. */
  counts: number[];
  logq: number[];
  tail: number;
  argmax: number;
}

/**
 * The sparse teacher of one row of logits z[off .. off + vocab) at temperature T. `uniform(0)` is the row's uniform
 * in [0, 1) of the systematic draws (sample caches use cacheUniform: the same draws wherever and whenever the row is
 * computed); unused for top-K. Ids come out ascending for samples and by descending probability (ties: lower id
 * first) for top-K.
 */
export function sparseRow(z: ArrayLike<number>, off: number, vocab: number, T: number, rep: SparseRep,
  uniform: ((k: number) => number) | null, scratch?: Float64Array): SparseEntry {
  const invT = 1 / T;
  let mx = -Infinity, argmax = 0, best = -Infinity;
  for (let j = 0; j < vocab; j++) {
    const r = z[off + j]!;
    if (r > best) { best = r; argmax = j; }
    const x = r * invT;
    if (x > mx) mx = x;
  }
  const e = scratch && scratch.length >= vocab ? scratch : new Float64Array(vocab);
  let sum = 0;
  for (let j = 0; j < vocab; j++) { const v = Math.exp(z[off + j]! * invT - mx); e[j] = v; sum += v; }
  const lse = mx + Math.log(sum);
  const logq = (j: number): number => z[off + j]! * invT - lse;
  if (rep.kind === 'top') {
    const k = Math.min(rep.k, vocab);
    const ids = topIndices(e, vocab, k);
    let mass = 0;
    for (const j of ids) mass += e[j]!;
    // The tail: every other token's mass, summed over those tokens (no cancellation); none when the slots cover all.
    const tail = k >= vocab ? -1 : Math.max(0, (sum - mass) / sum);
    return { ids, counts: [], logq: ids.map(logq), tail, argmax };
  }
  // Systematic sampling: the N points (i + u) / N of the cumulative distribution, one pass over the vocabulary.
  const u0 = uniform!(0), u: number[] = [];
  for (let i = 0; i < rep.n; i++) u.push(((i + u0) / rep.n) * sum);
  const ids: number[] = [], counts: number[] = [];
  let c = 0, ui = 0, last = -1;
  for (let j = 0; j < vocab && ui < u.length; j++) {
    c += e[j]!;
    if (e[j]! > 0) last = j;
    while (ui < u.length && u[ui]! < c) {
      if (ids.length && ids[ids.length - 1] === j) counts[counts.length - 1]!++;
      else { ids.push(j); counts.push(1); }
      ui++;
    }
  }
  // Rounding at the very end of the cumulative sum: the rest go to the last token with mass.
  for (; ui < u.length; ui++) {
    if (ids.length && ids[ids.length - 1] === last) counts[counts.length - 1]!++;
    else { ids.push(last); counts.push(1); }
  }
  return { ids, counts, logq: ids.map(logq), tail: -1, argmax };
}

function fmix32(h: number): number {
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/**
 * The k-th uniform in [0, 1) of a cache row: a counter-based hash of (seed, window, position, k) (murmur3's
 * finalizer chained over the counters), so a row's samples do not depend on the order rows are computed in, and a
 * cache job that continues after an interruption draws what the uninterrupted job would have.
 */
export function cacheUniform(seed: number, window: number, pos: number, k: number): number {
  let h = fmix32((seed >>> 0) ^ 0x9e3779b9);
  h = fmix32(h ^ Math.imul(window + 1, 0x9e3779b1));
  h = fmix32(h ^ Math.imul(pos + 1, 0x85ebca77));
  h = fmix32(h ^ Math.imul(k + 1, 0xc2b2ae3d));
  return (h + 0.5) / 4294967296;
}

/** The k largest entries of e[0..n) by value (ties: lower index first), in that order. */
function topIndices(e: Float64Array, n: number, k: number): number[] {
  if (k >= n) return Array.from({ length: n }, (_, i) => i).sort((a, b) => e[b]! - e[a]! || a - b);
  // A min-heap of the k best so far.
  const heap: number[] = [];
  const worse = (a: number, b: number): boolean => e[a]! < e[b]! || (e[a] === e[b] && a > b);
  const down = (i: number): void => {
    for (;;) {
      const l = 2 * i + 1, r = l + 1;
      let m = i;
      if (l < heap.length && worse(heap[l]!, heap[m]!)) m = l;
      if (r < heap.length && worse(heap[r]!, heap[m]!)) m = r;
      if (m === i) return;
      [heap[i], heap[m]] = [heap[m]!, heap[i]!];
      i = m;
    }
  };
  for (let j = 0; j < n; j++) {
    if (heap.length < k) {
      heap.push(j);
      for (let i = heap.length - 1; i > 0;) {
        const p = (i - 1) >> 1;
        if (!worse(heap[i]!, heap[p]!)) break;
        [heap[i], heap[p]] = [heap[p]!, heap[i]!];
        i = p;
      }
    } else if (worse(heap[0]!, j)) {
      heap[0] = j;
      down(0);
    }
  }
  return heap.sort((a, b) => e[b]! - e[a]! || a - b);
}
