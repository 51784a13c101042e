/**
 * The sparse rows of a teacher's logits on the GPU (the teacher-cache job): `sample_rows` turns each row of logits into
 * the distinct ids of S systematic draws at temperature T — the points p_i = (i + u) · Σ / S, i < S, of the cumulative
 * distribution Σ_{j' ≤ j} e^{(z_j' − M)/T} — with log q_t of each, and the row's argmax. One block per row:
 *   1. one pass over the logits: each thread reads its contiguous chunk of the vocabulary (a multiple of 4 tokens, with
 *      16-byte loads where the rows are 16-byte aligned), keeping its maximum m and argmax (first index on ties) and the
 *      chunk's mass relative to m in double (rescaled by e^{(m_old − m_new)/T} when m grows; a NaN logit makes it NaN,
 *      and the row's slots then all come out −1, as before); the block's maximum M and argmax follow;
 *   2. each chunk's mass relative to M (one double factor e^{(m − M)/T}; zero when the walk's largest term in the chunk,
 *      e^{(m − M)/T} in float32, is zero, so a chunk has mass exactly when its walk sees some), and a block scan (double)
 *      gives every chunk's start; the starts are then made non-decreasing (a scan's per-lane addition order can
 *      otherwise put a start below its predecessor), so the chunks partition [0, Σ) and each point belongs to exactly
 *      one thread; the last chunk with mass also owns the points that rounding puts at or past its end, and chunks
 *      without mass own none;
 *   3. the threads that own points walk their chunk, four tokens a load (the running sum in double: in float32, a token
 *      below half an ulp of the running sum, about 6e-8 of it at Qwen's 151936 tokens, could never be drawn) and emit the
 *      distinct ids the points land on, counted first, then written at the offsets of a second block scan (never past
 *      the S slots): the ids come out ascending, as on the CPU (src/backend/cpu/kernels/sparse-rows.ts, float64). The
 *      walk's float32 terms sum to its chunk's mass only up to rounding: a point the walk does not reach goes to the
 *      chunk's last token with mass (the leftover rule), one past it belongs to the next chunk's first.
 * Baked: block size. Runtime: T, S, the row uniforms.
 */
import { BLOCK_DOMAIN, defineFamily, reductionHelpers } from './spec.js';

export type SampleRowsP = { block: number };

/**
 * Block-wide exclusive prefix sums in thread order, every thread also getting the block's total: blockScanD (double)
 * and blockScanI (int); chunkStarts turns each thread's chunk mass into monotone chunk starts in shared memory.
 */
export function scanHelpers(): string {
  return `
__device__ double blockScanD(double v, double* total) {
  __shared__ double wd[BLOCK / 32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  double x = v;
  for (int o = 1; o < 32; o <<= 1) { const double y = __shfl_up_sync(0xffffffffu, x, o); if (lane >= o) x += y; }
  double ex = __shfl_up_sync(0xffffffffu, x, 1);
  if (lane == 0) ex = 0.0;
  __syncthreads();
  if (lane == 31) wd[w] = x;
  __syncthreads();
  double before = 0.0, tot = 0.0;
  for (int i = 0; i < BLOCK / 32; i++) { if (i < w) before += wd[i]; tot += wd[i]; }
  *total = tot;
  return before + ex;
}
__device__ int blockScanI(int v, int* total) {
  __shared__ int wi[BLOCK / 32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int x = v;
  for (int o = 1; o < 32; o <<= 1) { const int y = __shfl_up_sync(0xffffffffu, x, o); if (lane >= o) x += y; }
  __syncthreads();
  if (lane == 31) wi[w] = x;
  __syncthreads();
  int before = 0, tot = 0;
  for (int i = 0; i < BLOCK / 32; i++) { if (i < w) before += wi[i]; tot += wi[i]; }
  *total = tot;
  return before + x - v;
}
/* Each thread's chunk [start, end) of [0, total): starts from a double scan of the chunk masses, made non-decreasing;
   the last chunk with mass ends at +infinity (it owns what rounding puts past the total), a chunk without mass owns none. */
__device__ void chunkRange(double cs, double* start, double* end, double* total) {
  __shared__ double starts[BLOCK + 1];
  const double s0 = blockScanD(cs, total);
  starts[threadIdx.x] = s0;
  if (threadIdx.x == 0) starts[BLOCK] = *total;
  const float lastWithMass = blockMax(cs > 0.0 ? (float)threadIdx.x : -1.0f);
  __syncthreads();
  if (threadIdx.x == 0) for (int i = 1; i <= BLOCK; i++) if (starts[i] < starts[i - 1]) starts[i] = starts[i - 1];
  __syncthreads();
  *start = starts[threadIdx.x];
  *end = cs > 0.0 ? ((float)threadIdx.x == lastWithMass ? (double)__int_as_float(0x7f800000) : starts[threadIdx.x + 1]) : *start;
  __syncthreads();
}
`;
}

/**
 * The walk of a thread's chunk over its points [ilo, ihi): `onHit` runs (with j) for each distinct token a point lands
 * on, `onLeftover` (with lastMass) once for points past the chunk's running sum; `init` declares extra state. Generated
 * twice: counting the distinct ids, then writing them at the thread's offset.
 */
function walk(onHit: string, onLeftover: string, init: string): string {
  return `  if (ilo < ihi) {
    double c = start;
    int i = ilo, last = -1, lastMass = -1${init};
    /* four tokens a load (16 bytes where the rows allow): the walk is a serial chain per thread, so each load's latency
       is paid once for four tokens instead of once for each */
    for (int jb = j0; jb < j1 && i < ihi; jb += 4) {
      float x4[4];
      if (VEC && jb + 3 < j1) { const float4 q = *(const float4*)(z + jb); x4[0] = q.x; x4[1] = q.y; x4[2] = q.z; x4[3] = q.w; }
      else { for (int e = 0; e < 4; e++) x4[e] = jb + e < j1 ? z[jb + e] : NEG_INF; }
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int j = jb + e;
        if (j >= j1 || i >= ihi) break;
        const float ex = expf((x4[e] - M) * INV_T);
        c += (double)ex;
        if (ex > 0.0f) lastMass = j;
        bool hit = false;
        while (i < ihi && ((double)i + u) * step < c) { hit = true; i++; }
        if (hit && j != last) {
          ${onHit}
          last = j;
        }
      }
    }
    if (i < ihi && lastMass >= 0 && lastMass != last) { ${onLeftover} }
  }`;
}

function generate(p: Readonly<SampleRowsP>): string {
  return `#define BLOCK ${p.block}
${reductionHelpers()}
${scanHelpers()}extern "C" __global__ void sample_rows(const float* logits, const float* uniforms, int* ids, float* logq, float* tail, int* argmax,
                                       int n, int V, int LD, int S, float TEMP) {
  const int row = blockIdx.x;
  if (row >= n) return;
  const float* z = logits + (long long)row * LD;
  const float INV_T = 1.0f / TEMP;
  /* 1. one pass over the thread's chunk (C tokens, a multiple of 4: 16-byte loads where the rows are 16-byte aligned):
     its maximum m and argmax (first index on ties), and its mass relative to m in double, rescaled when m grows */
  const int C = ((V + BLOCK - 1) / BLOCK + 3) & ~3;
  const int j0 = min(V, (int)threadIdx.x * C), j1 = min(V, j0 + C);
  float m = NEG_INF;
  int am = V;
  double cs = 0.0;
  const double DT = (double)TEMP;
  auto take = [&](float x, int j) {
    if (x > m) { cs *= exp(((double)m - (double)x) / DT); m = x; am = j; } /* exp(-inf) = 0 the first time */
    if (!(x == NEG_INF && m == NEG_INF)) cs += (double)expf((x - m) * INV_T); /* a NaN x makes cs NaN */
  };
  const bool VEC = (LD & 3) == 0 && (((unsigned long long)logits) & 15ull) == 0ull;
  int jj = j0;
  if (VEC) {
    for (; jj + 3 < j1; jj += 4) { const float4 x = *(const float4*)(z + jj); take(x.x, jj); take(x.y, jj + 1); take(x.z, jj + 2); take(x.w, jj + 3); }
  }
  for (; jj < j1; jj++) take(z[jj], jj);
  const float M = blockMax(m);
  const int AM = blockArgMax(m, am);
  /* 2. the chunk masses relative to the row's maximum M, and their ranges. A chunk has mass exactly when its walk will
     see some: its largest walk term, e^{(m - M)/T} computed as the walk computes it, is positive (in double alone, a
     chunk more than ~104·T below M would own points its walk never reaches) */
  if (cs == cs) { /* a NaN mass stays NaN */
    cs = (m == NEG_INF || expf((m - M) * INV_T) == 0.0f) ? 0.0 : cs * exp(((double)m - (double)M) / DT);
  }
  double start, end, total;
  chunkRange(cs, &start, &end, &total);
  const float lse = M * INV_T + (float)log(total);
  /* 3. this thread's points: start <= p_i < end */
  const double u = (double)uniforms[row], step = total / (double)S;
  int ilo = S, ihi = S;
  if (end > start) {
    for (int i = 0; i < S; i++) { if (((double)i + u) * step >= start) { ilo = i; break; } }
    for (int i = ilo; i < S; i++) { if (((double)i + u) * step >= end) { ihi = i; break; } }
  }
  int cnt = 0;
${walk('cnt++;', 'cnt++;', '')}
  int distinct;
  const int off = blockScanI(cnt, &distinct);
${walk('if (k < S) { ids[(long long)row * S + k] = j; logq[(long long)row * S + k] = z[j] * INV_T - lse; }\n        k++;',
    'if (k < S) { ids[(long long)row * S + k] = lastMass; logq[(long long)row * S + k] = z[lastMass] * INV_T - lse; }', ', k = off')}
  for (int k = min(distinct, S) + threadIdx.x; k < S; k += BLOCK) { ids[(long long)row * S + k] = -1; logq[(long long)row * S + k] = 0.0f; }
  if (threadIdx.x == 0) { tail[row] = -1.0f; argmax[row] = AM; }
}
`;
}

export const sampleRowsKernel = defineFamily<SampleRowsP>({
  name: 'sample_rows',
  schema: { block: BLOCK_DOMAIN },
  example: { block: 512 },
  generate,
});

/**
 * `top_rows`: each row's K = min(S, V) most likely tokens at temperature T (ties: lower id first), in that order, with
 * log q_t of each, the mass of every other token (the tail; −1 when the K cover the vocabulary) and the argmax, as the
 * CPU's float64 reference (src/backend/cpu/kernels/sparse-rows.ts) computes them. One block per row:
 *   1. maximum and argmax (first index on ties), then Σ e^{(z_j − M)/T} in double;
 *   2. the K-th largest logit by a radix select over order-preserving 32-bit keys (4 passes of 8 bits, a 256-bin
 *      shared histogram each): afterwards `kth` is its key, and `want` of the tokens whose key equals it belong to the K
 *      (the others are all above);
 *   3. the tokens above kth are collected in any order (shared atomics); of those equal to it, all of them when exactly
 *      `want` exist, otherwise the `want` lowest ids, by a block scan over consecutive tiles in id order;
 *   4. a bitonic sort of the K in shared memory (key descending, id ascending), then one thread per slot writes id and
 *      log q_t; the K's mass (double) gives the tail.
 * Ordering by the logit equals ordering by probability (exp is monotone), but for tokens whose e^{(z − M)/T} underflows
 * to zero in float64 (a logit gap over 745·T), which the reference orders by id.
 * Baked: block size (a power of two, at least 32). Runtime: T, S (at most MAX_SPARSE_SLOTS = 256).
 */
function generateTop(p: Readonly<SampleRowsP>): string {
  return `#define BLOCK ${p.block}
#define MAXS 256
${reductionHelpers()}
${scanHelpers()}
__device__ __forceinline__ unsigned orderKey(float f) {
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
/* a before b in the top list: the larger key, then the lower id */
__device__ __forceinline__ bool before(unsigned ka, int ia, unsigned kb, int ib) { return ka > kb || (ka == kb && ia < ib); }
extern "C" __global__ void top_rows(const float* logits, int* ids, float* logq, float* tail, int* argmax,
                                    int n, int V, int LD, int S, float TEMP) {
  const int row = blockIdx.x;
  if (row >= n) return;
  const float* z = logits + (long long)row * LD;
  const double INV_T = 1.0 / (double)TEMP;
  __shared__ unsigned hist[256];
  __shared__ unsigned ckey[MAXS];
  __shared__ int cid[MAXS];
  __shared__ int sel[3];
  __shared__ int nAbove, nEqual;
  /* 1. maximum, argmax, the sum of e in double */
  float m = NEG_INF;
  int am = V;
  for (int j = threadIdx.x; j < V; j += BLOCK) { const float x = z[j]; if (x > m) { m = x; am = j; } }
  const float M = blockMax(m);
  const int AM = blockArgMax(m, am);
  const double MX = (double)M * INV_T;
  double cs = 0.0;
  for (int j = threadIdx.x; j < V; j += BLOCK) cs += exp((double)z[j] * INV_T - MX);
  const double total = blockSumD(cs);
  const double lse = MX + log(total);
  const int K = min(S, V);
  /* 2. radix select of the K-th largest key */
  unsigned prefix = 0u, mask = 0u;
  int want = K, eqCount = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += BLOCK) hist[b] = 0u;
    __syncthreads();
    for (int j = threadIdx.x; j < V; j += BLOCK) {
      const unsigned key = orderKey(z[j]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int c = 0, b = 255;
      for (; b > 0; b--) { if (c + (int)hist[b] >= want) break; c += (int)hist[b]; }
      sel[0] = b; sel[1] = want - c; sel[2] = (int)hist[b];
    }
    __syncthreads();
    prefix |= (unsigned)sel[0] << shift; mask |= 255u << shift;
    want = sel[1]; eqCount = sel[2];
    __syncthreads();
  }
  const unsigned kth = prefix;
  /* 3. collect: every key above kth, and want of those equal to it (the lowest ids) */
  if (threadIdx.x == 0) { nAbove = 0; nEqual = 0; }
  __syncthreads();
  const int above = K - want;
  for (int j = threadIdx.x; j < V; j += BLOCK) {
    const unsigned key = orderKey(z[j]);
    if (key > kth) { const int s = atomicAdd(&nAbove, 1); cid[s] = j; ckey[s] = key; }
    else if (key == kth && eqCount == want) { const int s = above + atomicAdd(&nEqual, 1); cid[s] = j; ckey[s] = key; }
  }
  if (eqCount != want) {
    int taken = 0;
    for (int t0 = 0; t0 < V && taken < want; t0 += BLOCK) {
      const int j = t0 + threadIdx.x;
      const int eq = j < V && orderKey(z[j]) == kth ? 1 : 0;
      int tileEq;
      const int r = blockScanI(eq, &tileEq);
      if (eq && taken + r < want) { cid[above + taken + r] = j; ckey[above + taken + r] = kth; }
      taken += tileEq;
    }
  }
  /* 4. bitonic sort of the K (padded to a power of two with entries that sort last) */
  int P = 1;
  while (P < K) P <<= 1;
  __syncthreads();
  for (int s = K + threadIdx.x; s < P; s += BLOCK) { ckey[s] = 0u; cid[s] = 0x7fffffff; }
  __syncthreads();
  for (int size = 2; size <= P; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < P; i += BLOCK) {
        const int partner = i ^ stride;
        if (partner > i) {
          const bool firstHalf = (i & size) == 0;
          const bool swap = firstHalf ? before(ckey[partner], cid[partner], ckey[i], cid[i]) : before(ckey[i], cid[i], ckey[partner], cid[partner]);
          if (swap) {
            const unsigned tk = ckey[i]; ckey[i] = ckey[partner]; ckey[partner] = tk;
            const int ti = cid[i]; cid[i] = cid[partner]; cid[partner] = ti;
          }
        }
      }
      __syncthreads();
    }
  }
  double mass = 0.0;
  for (int s = threadIdx.x; s < S; s += BLOCK) {
    const long long o = (long long)row * S + s;
    if (s < K) {
      const int j = cid[s];
      ids[o] = j;
      logq[o] = (float)((double)z[j] * INV_T - lse);
      mass += exp((double)z[j] * INV_T - MX);
    } else { ids[o] = -1; logq[o] = 0.0f; }
  }
  mass = blockSumD(mass);
  if (threadIdx.x == 0) { tail[row] = K >= V ? -1.0f : (float)fmax(0.0, (total - mass) / total); argmax[row] = AM; }
}
`;
}

export const topRowsKernel = defineFamily<SampleRowsP>({
  name: 'top_rows',
  schema: { block: BLOCK_DOMAIN },
  example: { block: 512 },
  generate: generateTop,
});
