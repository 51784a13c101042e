/**
 * The sparse rows of a teacher's logits (what a teacher cache keeps per position; src/cache/sparse.ts describes the
 * representations), on the host in float64: the CPU backend's sparseTeacherRows, and the reference of the CUDA kernel.
 */

/** What sparseRow keeps: systematic draws ('sample', n of them) or the k most likely tokens ('top'). */
export type SparseRowRep = { kind: 'sample'; n: number } | { kind: 'top'; k: number };

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
export function sparseRow(z: ArrayLike<number>, off: number, vocab: number, T: number, rep: SparseRowRep,
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
    // The tail: every other token's mass, (Σ − Σ top) / Σ in float64; none when the slots cover the vocabulary.
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
