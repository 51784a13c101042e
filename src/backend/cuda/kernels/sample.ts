/**
 * Token sampling on the device (batched generation): one block per row of logits, the rule of the CPU reference
 * (src/backend/cpu/kernels/sample.ts), transformers' order:
 *   0. with SEEN (the rows' seen-token bitmask, SEEN_W words a row): the repetition penalty, applied in place to the row
 *      in the first pass (a marked id's z becomes z·PENALTY where negative, z / PENALTY otherwise): one pass reads the
 *      bitmask, the later ones the penalized row (reading the bitmask in every pass cost a fifth of a decode step);
 *   1. the row's maximum and first argmax (greedy when TEMP ≤ 0: done);
 *   2. top-k: the k-th largest logit by bisection on the order-preserving 32-bit keys of the floats (32 passes counting
 *      keys ≥ mid: exact, ties kept);
 *   3. top-p: the largest key whose kept mass Σ e^{(z−M)/T} (keys ≥ it and ≥ the top-k key) reaches TOPP · the top-k
 *      mass, by the same bisection over masses (32 passes);
 *   4. min-p: a token is kept only if e^{(z−M)/T} ≥ MINP as well (0: off; after top-p, as transformers orders them);
 *   5. the draw: r = u · kept mass; each thread sums the kept mass of its contiguous chunk of the vocabulary in double, a
 *      block scan gives the chunks' (monotone) starts, and the one thread whose chunk holds r walks it in double (the last
 *      chunk with mass also takes an r that rounding put at or past the total) and writes the token, and marks it in
 *      SEEN (a replayed decode step keeps the bitmask current).
 * Nothing but the sampled ids leaves the device. Baked: block size. Runtime: TEMP, TOPK, TOPP, PENALTY, MINP, the row
 * uniforms and the bitmask.
 */
import { BLOCK_DOMAIN, defineFamily, reductionHelpers } from './spec.js';
import { scanHelpers } from './sparse-rows.js';

export type SampleTokensP = { block: number };

function generate(p: Readonly<SampleTokensP>): string {
  return `#define BLOCK ${p.block}
${reductionHelpers()}
${scanHelpers()}
/* float -> unsigned with the same order (negative floats reversed below the positive ones) */
__device__ __forceinline__ unsigned fkey(float x) {
  const unsigned u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
/* this thread's part of the mass e^{(z-M)/T} of the row's tokens whose key is at least t (top-p's passes) */
__device__ __forceinline__ float massFrom(const float* z, int V, unsigned t, float M, float INV_T) {
  float s = 0.0f;
  for (int j = threadIdx.x; j < V; j += BLOCK) { const float x = z[j]; if (fkey(x) >= t) s += expf((x - M) * INV_T); }
  return s;
}
/* a token's mass e^{(x-M)/T} when the cuts keep it (its key at least theta, the mass at least MINP), else -1 (NaN: -1) */
__device__ __forceinline__ float keptMass(float x, unsigned theta, float M, float INV_T, float MINP) {
  if (fkey(x) < theta) return -1.0f;
  const float e = expf((x - M) * INV_T);
  return e >= MINP ? e : -1.0f;
}
extern "C" __global__ void sample_tokens(int* out, float* logits, const float* uniforms, int n, int V, int LD,
                                         float TEMP, int TOPK, float TOPP, unsigned* SEEN, int SEEN_W, float PENALTY,
                                         float MINP) {
  const int row = blockIdx.x;
  if (row >= n) return;
  float* z = logits + (long long)row * LD;
  unsigned* seen = SEEN == nullptr ? nullptr : SEEN + (long long)row * SEEN_W;
  float m = NEG_INF;
  int am = V;
  /* with SEEN, the repetition penalty, once, in place: each marked logit is read and rewritten by the one thread that
     owns j; the block's barriers in blockMax make the rewritten row visible to every later pass */
  for (int j = threadIdx.x; j < V; j += BLOCK) {
    float x = z[j];
    if (seen && ((seen[j >> 5] >> (j & 31)) & 1u)) { x = x < 0.0f ? x * PENALTY : x / PENALTY; z[j] = x; }
    if (x > m) { m = x; am = j; }
  }
  const float M = blockMax(m);
  const int AM = blockArgMax(m, am);
  if (!(TEMP > 0.0f)) {
    /* AM == V: a row without a number (all NaN or -inf): nothing to mark */
    if (threadIdx.x == 0) { out[row] = AM; if (seen && AM < V) seen[AM >> 5] |= 1u << (AM & 31); }
    return;
  }
  const float INV_T = 1.0f / TEMP;
  unsigned theta = 0u;
  if (TOPK > 0 && TOPK < V) {
    unsigned lo = 0u, hi = 0xffffffffu;
    while (lo < hi) {
      const unsigned mid = lo + (unsigned)(((unsigned long long)hi - lo + 1ull) >> 1);
      float c = 0.0f;
      for (int j = threadIdx.x; j < V; j += BLOCK) c += fkey(z[j]) >= mid ? 1.0f : 0.0f;
      if (blockSum(c) >= (float)TOPK) lo = mid; else hi = mid - 1u;
    }
    theta = lo;
  }
  if (TOPP < 1.0f) {
    const float target = TOPP * blockSum(massFrom(z, V, theta, M, INV_T));
    unsigned lo = theta, hi = 0xffffffffu;
    while (lo < hi) {
      const unsigned mid = lo + (unsigned)(((unsigned long long)hi - lo + 1ull) >> 1);
      if (blockSum(massFrom(z, V, mid, M, INV_T)) >= target) lo = mid; else hi = mid - 1u;
    }
    theta = lo;
  }
  /* the draw over the kept tokens, in index order: chunk masses and the walk in double (chunkRange: monotone ranges,
     the last chunk with mass owns what rounding puts past the total) */
  const int C = (V + BLOCK - 1) / BLOCK;
  const int j0 = min(V, (int)threadIdx.x * C), j1 = min(V, j0 + C);
  double cs = 0.0;
  for (int j = j0; j < j1; j++) {
    const float e = keptMass(z[j], theta, M, INV_T, MINP);
    if (e >= 0.0f) cs += (double)e;
  }
  double start, end, total;
  chunkRange(cs, &start, &end, &total);
  const double r = (double)uniforms[row] * total;
  if (end > start && r >= start && r < end) {
    double acc = start;
    int last = -1, pick = -1;
    for (int j = j0; j < j1; j++) {
      const float e = keptMass(z[j], theta, M, INV_T, MINP);
      if (e < 0.0f) continue;
      acc += (double)e;
      last = j;
      if (acc > r) { pick = j; break; }
    }
    const int id = pick >= 0 ? pick : last;
    out[row] = id;
    if (seen) seen[id >> 5] |= 1u << (id & 31);
  }
}
`;
}

export const sampleTokensKernel = defineFamily<SampleTokensP>({
  name: 'sample_tokens',
  schema: { block: BLOCK_DOMAIN },
  example: { block: 512 },
  generate,
});

/**
 * The device side of one batched-generation decode step, after its tokens are sampled (Backend.decodeAdvance): one
 * thread per sequence b < N: ids[b] = sampled[b], positions[b] += 1, uniforms[b] = table[(step + 1) · N + b] with
 * step = counter[0] (0 past the table's ROWS rows); then thread 0 sets counter[0] = step + 1. One block (N ≤ BLOCK), so
 * every thread reads the counter before thread 0 writes it. Baked: block size. Runtime: N and the table's rows.
 */
export const decodeAdvanceKernel = defineFamily<{ block: number }>({
  name: 'decode_advance',
  schema: { block: BLOCK_DOMAIN },
  example: { block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
extern "C" __global__ void decode_advance(int* ids, int* positions, const int* sampled, float* uniforms, const float* table,
                                          int* counter, int N, int ROWS) {
  int b = threadIdx.x;
  int next = counter[0] + 1;
  if (b < N) {
    ids[b] = sampled[b];
    positions[b] += 1;
    uniforms[b] = next < ROWS ? table[(long long)next * N + b] : 0.0f;
  }
  __syncthreads();
  if (b == 0) counter[0] = next;
}
`,
});
