/**
 * The sparse rows of a teacher's logits on the GPU (the teacher-cache job): `sample_rows` turns each row of logits into
 * the distinct ids of S systematic draws at temperature T — the points p_i = (i + u) · Σ / S, i < S, of the cumulative
 * distribution Σ_{j' ≤ j} e^{(z_j' − M)/T} — with log q_t of each, and the row's argmax. One block per row, over tiles
 * of SAMPLE_TILE consecutive tokens:
 *   1. one pass over the logits, coalesced: a warp reads a tile at a time (each lane four 16-byte loads, 128 tokens
 *      apart), and keeps the tile's maximum and its mass relative to it (double); each lane its maximum, argmax (first
 *      index on ties) and whether it saw a NaN (a NaN logit leaves every slot of the row −1, as before);
 *   2. each tile's mass relative to the row's maximum M (one double factor e^{(m − M)/T}; zero when that factor is
 *      zero in float32: such a tile holds under 1e-42 of the row, and has no draw, as before); warp 0
 *      scans them (double, made non-decreasing: a scan's per-lane addition order can otherwise put a start below its
 *      predecessor) into every tile's start, and notes for every tile the last tile with mass at or before it;
 *   3. each point's tile by a binary search over the starts (a tile without mass hands its points to the last tile with
 *      mass before it, which also owns what rounding puts at or past the total); one job per tile that owns points;
 *   4. a warp walks each job's tile, each lane 16 consecutive tokens, with phase 1's own terms e^{(z − m)/T} and the
 *      points in the tile's units, (p − start) / e^{(m − M)/T}, so the walk's terms add up to the mass that placed the
 *      points: the lanes' masses, scanned (double, non-decreasing), split the tile's points among the lanes with mass
 *      (the first from −∞, the last to +∞), and each lane walks its tokens with the running sum in double (in float32,
 *      a token below half an ulp of the sum, about 6e-8 of it at Qwen's 151936 tokens, could never be drawn): a point
 *      lands on the token whose term takes the sum past it; one the walk does not reach (double rounding) goes to the
 *      lane's last token with mass;
 *   5. the distinct tokens (the points' tokens never decrease) are written in order at the offsets of a block scan:
 *      ascending, as on the CPU (src/backend/cpu/kernels/sparse-rows.ts, float64), with log q = (z − M)/T − log Σ in
 *      double (z/T − (M/T + log Σ) in float32 lost digits at large logits: 6e-5 at logits near 300, T = 0.25).
 * (The kernel before this one gave each thread a contiguous chunk of the row: its loads were 1.2 KB apart across a
 * warp, and it ran at about a fifth of the memory bandwidth; docs/measurements/teacher-cache/.)
 * Baked: block size, and 1024 / block blocks an SM for ptxas (64 registers a thread; left to itself it takes 71, and
 * an SM holds three blocks of 256 instead of four). Runtime: T, S, the row uniforms. Vocabularies up to
 * SAMPLE_TILE × SAMPLE_MAX_TILES tokens.
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

/** Tokens a tile of sample_rows: 32 lanes × 16 (four 16-byte loads a lane). */
export const SAMPLE_TILE = 512;
/** Tiles a row of sample_rows at most (its shared arrays): vocabularies up to SAMPLE_TILE × SAMPLE_MAX_TILES tokens. */
export const SAMPLE_MAX_TILES = 1024;

function generate(p: Readonly<SampleRowsP>): string {
  return `#define BLOCK ${p.block}
#define NW (BLOCK / 32)
#define TILE ${SAMPLE_TILE}
#define MAXT ${SAMPLE_MAX_TILES}
#define MAXS 256
#define FULL 0xffffffffu
${reductionHelpers()}
${scanHelpers()}
/* four logits from token j on (16-byte aligned when vec): those at or past V read as -inf */
__device__ __forceinline__ void load4(const float* z, int j, int V, bool vec, float* x) {
  if (vec && j + 3 < V) { const float4 q = *(const float4*)(z + j); x[0] = q.x; x[1] = q.y; x[2] = q.z; x[3] = q.w; }
  else { for (int e = 0; e < 4; e++) x[e] = j + e < V ? z[j + e] : NEG_INF; }
}
/* tile t's 16 logits of this lane, coalesced across the warp: tokens t·TILE + 128 r + 4 lane + e */
__device__ __forceinline__ void loadTile(const float* z, int t, int lane, int V, bool vec, float* x) {
#pragma unroll
  for (int r = 0; r < 4; r++) load4(z, t * TILE + r * 128 + lane * 4, V, vec, x + 4 * r);
}
/* phase 1 for one tile: its maximum and its mass relative to it (double) into tmax[t] and tmass[t]; the lane's maximum,
   argmax (its tokens come in index order, so strict > keeps the first on ties) and whether it saw a NaN */
__device__ __forceinline__ void tileStats(const float* x, int t, int lane, float INV_T, float* tmax, double* tmass, float& lm, int& lam, bool& nan) {
  float m = NEG_INF;
#pragma unroll
  for (int k = 0; k < 16; k++) {
    if (x[k] != x[k]) nan = true;
    if (x[k] > lm) { lm = x[k]; lam = t * TILE + (k >> 2) * 128 + lane * 4 + (k & 3); }
    m = fmaxf(m, x[k]);
  }
  m = warpMax(m);
  double s = 0.0;
  if (m != NEG_INF) {
#pragma unroll
    for (int k = 0; k < 16; k++) s += (double)expf((x[k] - m) * INV_T);
  }
  s = warpSumD(s);
  if (lane == 0) { tmax[t] = m; tmass[t] = s; }
}
extern "C" __global__ void __launch_bounds__(BLOCK, ${Math.max(1, Math.floor(1024 / p.block))}) sample_rows(const float* logits, const float* uniforms, int* ids, float* logq, float* tail, int* argmax,
                                       int n, int V, int LD, int S, float TEMP) {
  __shared__ double tmass[MAXT], tstart[MAXT], pts[MAXS];
  __shared__ float tmax[MAXT];
  __shared__ int owner[MAXT], hit[MAXS], jobFirst[MAXS + 1], jobTile[MAXS];
  __shared__ double shTotal;
  __shared__ int shLastMass, shJobs;
  const int row = blockIdx.x;
  if (row >= n) return;
  const float* z = logits + (long long)row * LD;
  const float INV_T = 1.0f / TEMP;
  const double DT = (double)TEMP, INF = (double)__int_as_float(0x7f800000);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, NT = (V + TILE - 1) / TILE;
  const bool VEC = (LD & 3) == 0 && (((unsigned long long)logits) & 15ull) == 0ull;
  /* 1. one coalesced pass, a warp a tile at a time (loadTile, tileStats) */
  float lm = NEG_INF;
  int lam = 0; /* a row without a finite logit: 0, as the float64 reference */
  bool nan = false;
  /* two tiles in registers: the next one's loads are in flight while this one is reduced */
  float xa[16], xb[16];
  if (w < NT) loadTile(z, w, lane, V, VEC, xa);
  for (int t = w; t < NT; t += 2 * NW) {
    if (t + NW < NT) loadTile(z, t + NW, lane, V, VEC, xb);
    tileStats(xa, t, lane, INV_T, tmax, tmass, lm, lam, nan);
    if (t + NW >= NT) break;
    if (t + 2 * NW < NT) loadTile(z, t + 2 * NW, lane, V, VEC, xa);
    tileStats(xb, t + NW, lane, INV_T, tmax, tmass, lm, lam, nan);
  }
  const float M = blockMax(lm);
  const int AM = blockArgMax(lm, lam);
  const bool rowNaN = blockMax(nan ? 1.0f : 0.0f) > 0.0f;
  /* 2. the tile masses relative to M; zero where the factor e^{(m - M)/T} is zero in float32 (under 1e-42 of the row:
     no draw there, as before; the walk below computes the factor as here, in double) */
  for (int t = threadIdx.x; t < NT; t += BLOCK) {
    const float m = tmax[t];
    tmass[t] = (m == NEG_INF || expf((m - M) * INV_T) == 0.0f) ? 0.0 : tmass[t] * exp(((double)m - (double)M) / DT);
  }
  __syncthreads();
  /* 3. warp 0: the tiles' starts, a double scan 32 tiles at a time made non-decreasing (a scan's per-lane addition
     order can otherwise put a start below its predecessor), and for every tile the last tile with mass at or before it
     (owner: the tile that owns points falling in a tile without mass; the last with mass owns what lies past the total) */
  if (w == 0) {
    double carry = 0.0, prevStart = 0.0;
    int prevOwner = -1;
    for (int t0 = 0; t0 < NT; t0 += 32) {
      const int t = t0 + lane;
      const double v = t < NT ? tmass[t] : 0.0;
      double x = v;
      for (int o = 1; o < 32; o <<= 1) { const double y = __shfl_up_sync(FULL, x, o); if (lane >= o) x += y; }
      double st = __shfl_up_sync(FULL, x, 1);
      if (lane == 0) st = 0.0;
      st = fmax(st + carry, prevStart);
      int ow = v > 0.0 ? t : prevOwner;
      for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(FULL, st, o);
        const int oo = __shfl_up_sync(FULL, ow, o);
        if (lane >= o) { st = fmax(st, y); ow = max(ow, oo); }
      }
      if (t < NT) { tstart[t] = st; owner[t] = ow; }
      carry += __shfl_sync(FULL, x, 31);
      prevStart = __shfl_sync(FULL, st, 31);
      prevOwner = __shfl_sync(FULL, ow, 31);
    }
    if (lane == 0) { shTotal = carry; shLastMass = prevOwner; }
  }
  __syncthreads();
  const double total = shTotal;
  const bool any = !rowNaN && shLastMass >= 0 && total > 0.0;
  /* 4. the points p_i = (i + u) · total / S and the tile that owns each: the last tile starting at or below it, or the
     last tile with mass before that one (owner) */
  const double u = (double)uniforms[row], step = total / (double)S;
  if (any) {
    for (int i = threadIdx.x; i < S; i += BLOCK) {
      const double pt = ((double)i + u) * step;
      int lo = 0, hi = NT - 1;
      while (lo < hi) { const int mid = (lo + hi + 1) >> 1; if (tstart[mid] <= pt) lo = mid; else hi = mid - 1; }
      pts[i] = pt;
      hit[i] = owner[lo]; /* the point's tile until the walk writes its token */
    }
  }
  __syncthreads();
  /* 5. one job per tile that owns points (the points come in order, and so do their tiles): its tile and first point
     (the tile is kept apart: the walk overwrites hit[]) */
  if (threadIdx.x == 0) {
    int nj = 0;
    if (any) for (int i = 0; i < S; i++) if (i == 0 || hit[i] != hit[i - 1]) { jobTile[nj] = hit[i]; jobFirst[nj++] = i; }
    jobFirst[nj] = S;
    shJobs = nj;
  }
  __syncthreads();
  /* 6. a warp walks each job's tile t, lane l over its 16 consecutive tokens base + 16 l + k, in the tile's own units:
     phase 1's terms e^{(z - m_t)/T} (float32, summed in double), whose sum times e^{(m_t - M)/T} is the tile's mass, and
     the tile's points as (p - start_t) / e^{(m_t - M)/T}, so the walk's terms add up to the mass that placed the points
     (terms e^{(z - M)/T} of their own fell about 1e-7 of the tile's mass short of it, and a point in that gap went to
     the tile's last token with mass, whatever its probability). The lanes' masses, scanned and made non-decreasing,
     give each lane with mass its range of points (the first from -inf, the last to +inf: every point of the tile lands
     in one lane); the lane walks its tokens (the running sum in double: in float32, a token below half an ulp of the
     sum, about 6e-8 of it at Qwen's 151936 tokens, could never be drawn) and a point lands on the token whose term takes
     the sum past it; one the walk does not reach (double rounding of the same terms) goes to the lane's last token
     with mass */
  const int jobs = shJobs;
  for (int j = w; j < jobs; j += NW) {
    const int ia = jobFirst[j], ib = jobFirst[j + 1], t = jobTile[j], base = t * TILE + lane * 16;
    const float mt = tmax[t];
    const double tileStart = tstart[t], sc = exp(((double)mt - (double)M) / DT);
    for (int i = ia + lane; i < ib; i += 32) pts[i] = (pts[i] - tileStart) / sc;
    float e[16];
#pragma unroll
    for (int r = 0; r < 4; r++) load4(z, base + 4 * r, V, VEC, e + 4 * r);
    double s = 0.0;
    int lastM = -1;
#pragma unroll
    for (int k = 0; k < 16; k++) { e[k] = expf((e[k] - mt) * INV_T); s += (double)e[k]; if (e[k] > 0.0f) lastM = base + k; }
    const unsigned mask = __ballot_sync(FULL, lastM >= 0);
    double x = s;
    for (int o = 1; o < 32; o <<= 1) { const double y = __shfl_up_sync(FULL, x, o); if (lane >= o) x += y; }
    double c0 = __shfl_up_sync(FULL, x, 1);
    if (lane == 0) c0 = 0.0;
    for (int o = 1; o < 32; o <<= 1) { const double y = __shfl_up_sync(FULL, c0, o); if (lane >= o) c0 = fmax(c0, y); }
    const unsigned later = lane == 31 ? 0u : mask & (FULL << (lane + 1));
    const double next = __shfl_sync(FULL, c0, later ? __ffs(later) - 1 : lane);
    __syncwarp();
    if (lastM >= 0) {
      const double lo = lane == __ffs(mask) - 1 ? -INF : c0, hi = later ? next : INF;
      int ip = ia;
      while (ip < ib && pts[ip] < lo) ip++;
      int ie = ip;
      while (ie < ib && pts[ie] < hi) ie++;
      double c = c0;
#pragma unroll
      for (int k = 0; k < 16; k++) {
        c += (double)e[k];
        while (ip < ie && pts[ip] < c) { hit[ip] = base + k; ip++; }
      }
      for (; ip < ie; ip++) hit[ip] = lastM;
    }
  }
  __syncthreads();
  /* 7. the distinct tokens in order (the points' tokens never decrease), with log q, at the offsets of a block scan */
  int done = 0;
  for (int i0 = 0; i0 < S; i0 += BLOCK) {
    const int i = i0 + threadIdx.x;
    const int f = any && i < S && (i == 0 || hit[i] != hit[i - 1]) ? 1 : 0;
    int count;
    const int off = blockScanI(f, &count);
    if (f) { ids[(long long)row * S + done + off] = hit[i]; logq[(long long)row * S + done + off] = (float)(((double)z[hit[i]] - (double)M) / DT - log(total)); }
    done += count;
  }
  for (int k = done + threadIdx.x; k < S; k += BLOCK) { ids[(long long)row * S + k] = -1; logq[(long long)row * S + k] = 0.0f; }
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
  int am = 0; /* a row without a finite logit: 0, as the float64 reference */
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
