/**
 * The sparse rows of a teacher's logits on the GPU (the teacher-cache job): `sample_rows` turns each row of logits into
 * the distinct ids of S systematic draws at temperature T — the points p_i = (i + u) · Σ / S, i < S, of the cumulative
 * distribution Σ_{j' ≤ j} e^{(z_j' − M)/T} — with log q_t of each, and the row's argmax. One block per row:
 *   1. the row's maximum and argmax (first index on ties);
 *   2. each thread sums e_j over its contiguous chunk of the vocabulary, in double, and a block scan (double) gives
 *      every chunk's start; the starts are then made non-decreasing (a scan's per-lane addition order can otherwise
 *      put a start below its predecessor), so the chunks partition [0, Σ) and each point belongs to exactly one thread;
 *      the last chunk with mass also owns the points that rounding puts at or past its end, and chunks without mass own
 *      none;
 *   3. the threads that own points walk their chunk (the running sum in double: in float32, a token below half an ulp
 *      of the running sum, about 6e-8 of it at Qwen's 151936 tokens, could never be drawn) and emit the distinct ids the
 *      points land on, counted first, then written at the offsets of a second block scan (never past the S slots): the
 *      ids come out ascending, as on the CPU (src/backend/cpu/kernels/sparse-rows.ts, float64).
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
    for (int j = j0; j < j1 && i < ihi; j++) {
      const float e = expf((z[j] - M) * INV_T);
      c += (double)e;
      if (e > 0.0f) lastMass = j;
      bool hit = false;
      while (i < ihi && ((double)i + u) * step < c) { hit = true; i++; }
      if (hit && j != last) {
        ${onHit}
        last = j;
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
  /* 1. maximum and argmax */
  float m = NEG_INF;
  int am = V;
  for (int j = threadIdx.x; j < V; j += BLOCK) { const float x = z[j]; if (x > m) { m = x; am = j; } }
  const float M = blockMax(m);
  const int AM = blockArgMax(m, am);
  /* 2. chunk sums (double) and their ranges */
  const int C = (V + BLOCK - 1) / BLOCK;
  const int j0 = min(V, (int)threadIdx.x * C), j1 = min(V, j0 + C);
  double cs = 0.0;
  for (int j = j0; j < j1; j++) cs += (double)expf((z[j] - M) * INV_T);
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
