/**
 * The sparse rows of a teacher's logits on the GPU (the teacher-cache job): `sample_rows` turns each row of logits into
 * the distinct ids of S systematic draws at temperature T — the points p_i = (i + u) · Σ / S, i < S, of the cumulative
 * distribution Σ_{j' ≤ j} e^{(z_j' − M)/T} — with log q_t of each, and the row's argmax. One block per row:
 *   1. the row's maximum and argmax (first index on ties);
 *   2. each thread sums e_j over its contiguous chunk of the vocabulary; a block scan gives every chunk's start, so the
 *      chunks partition [0, Σ) and each point belongs to exactly one thread (boundaries read from the scan, not
 *      recomputed, so no point falls between two threads);
 *   3. the threads that own points walk their chunk and emit the distinct ids the points land on (a point past the
 *      last chunk's end goes to that chunk's last token with mass), counted first, then written at the offsets of a
 *      second block scan: the ids come out ascending, as on the CPU (src/backend/cpu/kernels/sparse-rows.ts, float64).
 * Baked: block size. Runtime: T, S, the row uniforms.
 */
import { BLOCK_DOMAIN, defineFamily, reductionHelpers } from './spec.js';

export type SampleRowsP = { block: number };

/** Block-wide exclusive prefix sums (float and int) in thread order; every thread also gets the block's total. */
export function scanHelpers(): string {
  return `/* Exclusive prefix sums over the block (thread order); every thread gets the block's total. */
__device__ float blockScanF(float v, float* total) {
  __shared__ float ws[BLOCK / 32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  float x = v;
  for (int o = 1; o < 32; o <<= 1) { const float y = __shfl_up_sync(0xffffffffu, x, o); if (lane >= o) x += y; }
  float ex = __shfl_up_sync(0xffffffffu, x, 1);
  if (lane == 0) ex = 0.0f;
  __syncthreads();
  if (lane == 31) ws[w] = x;
  __syncthreads();
  float before = 0.0f, tot = 0.0f;
  for (int i = 0; i < BLOCK / 32; i++) { if (i < w) before += ws[i]; tot += ws[i]; }
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
`;
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
  /* 2. chunk sums and their starts */
  const int C = (V + BLOCK - 1) / BLOCK;
  const int j0 = min(V, (int)threadIdx.x * C), j1 = min(V, j0 + C);
  float cs = 0.0f;
  for (int j = j0; j < j1; j++) cs += expf((z[j] - M) * INV_T);
  float total;
  const float start = blockScanF(cs, &total);
  __shared__ float starts[BLOCK + 1];
  if (threadIdx.x == 0) starts[BLOCK] = total;
  starts[threadIdx.x] = start;
  __syncthreads();
  /* the last non-empty chunk also owns points that rounding put at or past the total; empty chunks own none */
  const int lastChunk = (V - 1) / C;
  const float end = (int)threadIdx.x == lastChunk ? INFINITY : starts[threadIdx.x + 1];
  const float lse = M * INV_T + logf(total);
  /* 3. this thread's points: start <= p_i < end */
  const float u = uniforms[row], step = total / (float)S;
  int ilo = S, ihi = S;
  for (int i = 0; i < S && j0 < j1; i++) { const float pt = ((float)i + u) * step; if (pt >= start) { ilo = i; break; } }
  for (int i = ilo; i < S; i++) { const float pt = ((float)i + u) * step; if (pt >= end) { ihi = i; break; } }
  int cnt = 0;
  if (ilo < ihi) {
    float c = start;
    int i = ilo, last = -1, lastMass = j0;
    for (int j = j0; j < j1 && i < ihi; j++) {
      const float e = expf((z[j] - M) * INV_T);
      c += e;
      if (e > 0.0f) lastMass = j;
      bool hit = false;
      while (i < ihi && ((float)i + u) * step < c) { hit = true; i++; }
      if (hit && j != last) { cnt++; last = j; }
    }
    if (i < ihi && lastMass != last) cnt++;
  }
  int distinct;
  const int off = blockScanI(cnt, &distinct);
  if (ilo < ihi) {
    float c = start;
    int i = ilo, last = -1, lastMass = j0, k = off;
    for (int j = j0; j < j1 && i < ihi; j++) {
      const float e = expf((z[j] - M) * INV_T);
      c += e;
      if (e > 0.0f) lastMass = j;
      bool hit = false;
      while (i < ihi && ((float)i + u) * step < c) { hit = true; i++; }
      if (hit && j != last) { ids[(long long)row * S + k] = j; logq[(long long)row * S + k] = z[j] * INV_T - lse; k++; last = j; }
    }
    if (i < ihi && lastMass != last) { ids[(long long)row * S + k] = lastMass; logq[(long long)row * S + k] = z[lastMass] * INV_T - lse; }
  }
  for (int k = distinct + threadIdx.x; k < S; k += BLOCK) { ids[(long long)row * S + k] = -1; logq[(long long)row * S + k] = 0.0f; }
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
