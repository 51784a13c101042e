/**
 * Sparse representations of a teacher's next-token distribution q_t = softmax(z / T), one per position:
 *
 * - `sample:N` (the default, N = 24): N draws from q_t by systematic sampling (one uniform u, the points (i + u) / N
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
import { hashUniform } from '../util/rng.js';

export { sparseRow, type SparseEntry } from '../backend/cpu/kernels/sparse-rows.js';

export type SparseRep = { kind: 'sample'; n: number } | { kind: 'top'; k: number };

export const DEFAULT_SPARSE: SparseRep = { kind: 'sample', n: 24 };

export function formatSparse(r: SparseRep): string { return r.kind === 'sample' ? `sample:${r.n}` : `top:${r.k}`; }

/** Parses --sparse sample:N | top:K (1 ≤ N, K ≤ MAX_SPARSE_SLOTS). */
export function parseSparse(s: string): SparseRep {
  const m = /^(sample|top):(\d+)$/.exec(s.trim());
  const n = m ? Number(m[2]) : NaN;
  if (!m || !(n >= 1 && n <= MAX_SPARSE_SLOTS)) {
    throw new UsageError(`--sparse ${JSON.stringify(s)}: expected sample:N or top:K with N, K from 1 to ${MAX_SPARSE_SLOTS}`,
      'e.g. --sparse sample:24 (the default: unbiased) or --sparse top:32');
  }
  return m[1] === 'sample' ? { kind: 'sample', n } : { kind: 'top', k: n };
}

/** Slots per position of a representation (the most distinct ids a row can have). */
export function sparseSlots(r: SparseRep): number { return r.kind === 'sample' ? r.n : r.k; }

/**
 * The k-th uniform in [0, 1) of a cache row: hashUniform(seed, window, position, k), so a row's samples do not depend
 * on the order rows are computed in, and a cache job that continues after an interruption draws what the uninterrupted
 * job would have.
 */
export function cacheUniform(seed: number, window: number, pos: number, k: number): number {
  return hashUniform(seed, window, pos, k);
}
