/**
 * Causal grouped-query attention kernels: training forward (saves probs [B, nH, T, T]), backward, KV-cache
 * write and cached (inference) attention. Baked: headDim (and so the 1/sqrt(headDim) scale), block size.
 *
 * Simple, correct kernels: one block per (query row, head, batch). The forward uses the saved probs row as its
 * score scratch; the backward recomputes dP = dout·Vᵀ per key chunk and accumulates dK/dV with atomicAdd
 * (so dK/dV are not bit-reproducible; tests use a looser bound there).
 */
import { BLOCK_DOMAIN, defineFamily, f32, reductionHelpers } from './spec.js';

type AttnP = { headDim: number; block: number };
const schema = { headDim: { kind: 'int', min: 1, max: 1024 }, block: BLOCK_DOMAIN } as const;

function prelude(p: Readonly<AttnP>): string {
  return `#define BLOCK ${p.block}
#define HD ${p.headDim}
#define SCALE ${f32(1 / Math.sqrt(p.headDim))}
#define PER_THREAD ${Math.ceil(p.headDim / p.block)}
${reductionHelpers()}`;
}

/** Grid (T, nH, B), block = params.block. */
export const attentionForward = defineFamily<AttnP>({
  name: 'attention_fwd', schema, example: { headDim: 64, block: 128 },
  generate: (p) => `${prelude(p)}
extern "C" __global__ void attention_fwd(float* out, float* probs, const float* q, const float* k, const float* v,
                                         int T, int nH, int nKv) {
  int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int kvh = h / (nH / nKv);
  __shared__ float qs[HD];
  const float* qi = q + (((long long)b * T + i) * nH + h) * HD;
  for (int d = threadIdx.x; d < HD; d += BLOCK) qs[d] = qi[d];
  __syncthreads();
  float* prow = probs + (((long long)b * nH + h) * T + i) * T;
  float mx = NEG_INF;
  for (int j = threadIdx.x; j <= i; j += BLOCK) {
    const float* kj = k + (((long long)b * T + j) * nKv + kvh) * HD;
    float s = 0.0f;
    for (int d = 0; d < HD; d++) s += qs[d] * kj[d];
    s *= SCALE;
    prow[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = blockMax(mx);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= i; j += BLOCK) { float e = expf(prow[j] - mx); prow[j] = e; sum += e; }
  sum = blockSum(sum);
  float inv = 1.0f / sum;
  for (int j = threadIdx.x; j <= i; j += BLOCK) prow[j] *= inv;
  for (int j = i + 1 + threadIdx.x; j < T; j += BLOCK) prow[j] = 0.0f;
  __syncthreads();
  float* oi = out + (((long long)b * T + i) * nH + h) * HD;
  for (int d = threadIdx.x; d < HD; d += BLOCK) {
    float acc = 0.0f;
    for (int j = 0; j <= i; j++) acc += prow[j] * v[(((long long)b * T + j) * nKv + kvh) * HD + d];
    oi[d] = acc;
  }
}
`,
});

/** Grid (T, nH, B). dq += ..., dk += ... (atomic), dv += ... (atomic). */
export const attentionBackward = defineFamily<AttnP>({
  name: 'attention_bwd', schema, example: { headDim: 64, block: 128 },
  generate: (p) => `${prelude(p)}
extern "C" __global__ void attention_bwd(float* dq, float* dk, float* dv, const float* dout, const float* q,
                                         const float* k, const float* v, const float* probs,
                                         int T, int nH, int nKv) {
  int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int kvh = h / (nH / nKv);
  __shared__ float qs[HD];
  __shared__ float dos[HD];
  __shared__ float dsh[BLOCK];
  __shared__ float psh[BLOCK];
  const long long qoff = (((long long)b * T + i) * nH + h) * HD;
  for (int d = threadIdx.x; d < HD; d += BLOCK) { qs[d] = q[qoff + d]; dos[d] = dout[qoff + d]; }
  __syncthreads();
  const float* prow = probs + (((long long)b * nH + h) * T + i) * T;
  /* rowdot = sum_j P_ij * dP_ij with dP_ij = dout_i . v_j */
  float part = 0.0f;
  for (int j = threadIdx.x; j <= i; j += BLOCK) {
    const float* vj = v + (((long long)b * T + j) * nKv + kvh) * HD;
    float dp = 0.0f;
    for (int d = 0; d < HD; d++) dp += dos[d] * vj[d];
    part += prow[j] * dp;
  }
  float rowdot = blockSum(part);
  float dqacc[PER_THREAD];
  for (int r = 0; r < PER_THREAD; r++) dqacc[r] = 0.0f;
  for (int j0 = 0; j0 <= i; j0 += BLOCK) {
    int j = j0 + threadIdx.x;
    float dsv = 0.0f, pv = 0.0f;
    if (j <= i) {
      const float* vj = v + (((long long)b * T + j) * nKv + kvh) * HD;
      float dp = 0.0f;
      for (int d = 0; d < HD; d++) dp += dos[d] * vj[d];
      pv = prow[j];
      dsv = pv * (dp - rowdot) * SCALE;
    }
    dsh[threadIdx.x] = dsv;
    psh[threadIdx.x] = pv;
    __syncthreads();
    int cnt = min(BLOCK, i + 1 - j0);
    for (int r = 0; r < PER_THREAD; r++) {
      int d = threadIdx.x + r * BLOCK;
      if (d < HD) {
        float acc = 0.0f;
        for (int jj = 0; jj < cnt; jj++) acc += dsh[jj] * k[(((long long)b * T + j0 + jj) * nKv + kvh) * HD + d];
        dqacc[r] += acc;
      }
    }
    for (int idx = threadIdx.x; idx < cnt * HD; idx += BLOCK) {
      int jj = idx / HD, d = idx % HD;
      long long off = (((long long)b * T + j0 + jj) * nKv + kvh) * HD + d;
      atomicAdd(&dk[off], dsh[jj] * qs[d]);
      atomicAdd(&dv[off], psh[jj] * dos[d]);
    }
    __syncthreads();
  }
  for (int r = 0; r < PER_THREAD; r++) {
    int d = threadIdx.x + r * BLOCK;
    if (d < HD) dq[qoff + d] += dqacc[r];
  }
}
`,
});

type BlockP = { block: number };

/** Grid-stride over B·t·rowElems. cache[b, pos0+tt, :] = src[b, tt, :] with rowElems = nKv·hd. */
export const kvCacheWrite = defineFamily<BlockP>({
  name: 'kv_cache_write', schema: { block: BLOCK_DOMAIN }, example: { block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
extern "C" __global__ void kv_cache_write(float* cache, const float* src, int B, int t, int pos0, int tMax, int rowElems) {
  long long total = (long long)B * t * rowElems;
  for (long long idx = (long long)blockIdx.x * BLOCK + threadIdx.x; idx < total; idx += (long long)gridDim.x * BLOCK) {
    int e = (int)(idx % rowElems);
    long long bt = idx / rowElems;
    int tt = (int)(bt % t);
    long long b = bt / t;
    cache[(b * tMax + pos0 + tt) * rowElems + e] = src[idx];
  }
}
`,
});

/** Grid (t, nH, B). Queries at positions pos0..pos0+t-1 attend to cache rows 0..pos0+i. */
export const attentionCached = defineFamily<AttnP>({
  name: 'attention_cached', schema, example: { headDim: 64, block: 128 },
  generate: (p) => `${prelude(p)}
extern "C" __global__ void attention_cached(float* out, const float* q, const float* kc, const float* vc,
                                            int t, int pos0, int tMax, int nH, int nKv) {
  int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int kvh = h / (nH / nKv);
  int L = pos0 + i + 1;
  __shared__ float qs[HD];
  __shared__ float ws[BLOCK];
  const long long qoff = (((long long)b * t + i) * nH + h) * HD;
  for (int d = threadIdx.x; d < HD; d += BLOCK) qs[d] = q[qoff + d];
  __syncthreads();
  float mx = NEG_INF;
  for (int j = threadIdx.x; j < L; j += BLOCK) {
    const float* kj = kc + (((long long)b * tMax + j) * nKv + kvh) * HD;
    float s = 0.0f;
    for (int d = 0; d < HD; d++) s += qs[d] * kj[d];
    mx = fmaxf(mx, s * SCALE);
  }
  mx = blockMax(mx);
  float acc[PER_THREAD];
  for (int r = 0; r < PER_THREAD; r++) acc[r] = 0.0f;
  float sum = 0.0f;
  for (int j0 = 0; j0 < L; j0 += BLOCK) {
    int j = j0 + threadIdx.x;
    float w = 0.0f;
    if (j < L) {
      const float* kj = kc + (((long long)b * tMax + j) * nKv + kvh) * HD;
      float s = 0.0f;
      for (int d = 0; d < HD; d++) s += qs[d] * kj[d];
      w = expf(s * SCALE - mx);
    }
    sum += w;
    ws[threadIdx.x] = w;
    __syncthreads();
    int cnt = min(BLOCK, L - j0);
    for (int r = 0; r < PER_THREAD; r++) {
      int d = threadIdx.x + r * BLOCK;
      if (d < HD) {
        float a = 0.0f;
        for (int jj = 0; jj < cnt; jj++) a += ws[jj] * vc[(((long long)b * tMax + j0 + jj) * nKv + kvh) * HD + d];
        acc[r] += a;
      }
    }
    __syncthreads();
  }
  sum = blockSum(sum);
  float inv = 1.0f / sum;
  for (int r = 0; r < PER_THREAD; r++) {
    int d = threadIdx.x + r * BLOCK;
    if (d < HD) out[qoff + d] = acc[r] * inv;
  }
}
`,
});
