/**
 * Causal grouped-query attention kernels: training forward (saves probs [B, nH, T, T]), backward, KV-cache
 * write and cached (inference) attention. Baked: headDim (and so the 1/sqrt(headDim) scale), block size.
 *
 * Training kernels are tiled: a block owns TQ = (block/32)·RPW query rows of one (batch, head) and walks the keys
 * in chunks of 32, staging Q/K/V/dout tiles in shared memory (rows padded to HD+1 floats, so a warp reading 32
 * keys' element d hits 32 banks). Inside a chunk a warp owns RPW query rows and a lane owns one key (scores), or
 * a lane owns head dims d = lane + 32·c (products with V or K). RPW is picked per headDim so the static shared
 * memory stays under 46 KiB (rowsPerWarp()).
 * - forward: scores → probs (the saved row doubles as score scratch), a warp-per-row softmax, out = P·V.
 * - backward, two deterministic kernels (no atomics): attention_bwd per query tile computes
 *   rowdot_i = Σ_j P_ij dP_ij (dP = dout·Vᵀ) into a preallocated scratch and dq += dS·K with
 *   dS = P ⊙ (dP − rowdot)·scale; attention_bwd_dkv per (key tile, kv head) walks every query row of the kv
 *   head's query heads (or, split S ways, 1/S of them, with partials summed in order by attention_dkv_reduce) and
 *   accumulates dk += dSᵀ·Q, dv += Pᵀ·dout in registers.
 */
import { BLOCK_DOMAIN, defineFamily, f32, reductionHelpers } from './spec.js';

type AttnP = { headDim: number; block: number };
const schema = { headDim: { kind: 'int', min: 1, max: 1024 }, block: BLOCK_DOMAIN } as const;
/** The tiled training kernels keep K/V tiles of 32 × (headDim + 1) floats in static shared memory: headDim ≤ 256. */
export const MAX_TRAIN_HEAD_DIM = 256;
const trainSchema = { headDim: { kind: 'int', min: 1, max: MAX_TRAIN_HEAD_DIM }, block: BLOCK_DOMAIN } as const;
/** Keys per chunk (one per lane). */
const KT = 32;
const SHARED_CAP = 46 * 1024;

/**
 * Query rows per warp of the tiled training kernels: the largest of 8, 4, 2, 1 whose shared-memory tiles fit.
 * 'dkv' (attention_bwd_dkv) stages two query-row tiles and two score tiles; 'rows' (attention_fwd, attention_bwd) one.
 */
export function rowsPerWarp(kind: 'rows' | 'dkv', headDim: number, block: number): number {
  const nw = block / 32, hdp = headDim + 1;
  for (const rpw of [8, 4, 2, 1]) {
    const tq = nw * rpw;
    const floats = kind === 'rows' ? tq * hdp + KT * hdp + tq * (KT + 1) : KT * hdp + 2 * tq * hdp + 2 * tq * (KT + 1);
    if (4 * floats <= SHARED_CAP) return rpw;
  }
  return 1;
}

/** Query rows per block of attention_fwd / attention_bwd (the grid's x is ceil(T / this)). */
export function attnQueryTile(headDim: number, block: number): number { return (block / 32) * rowsPerWarp('rows', headDim, block); }
/** Keys per block of attention_bwd_dkv (the grid's x is ceil(T / this)). */
export const ATTN_KEY_TILE = KT;

function prelude(p: Readonly<AttnP>): string {
  return `#define BLOCK ${p.block}
#define HD ${p.headDim}
#define SCALE ${f32(1 / Math.sqrt(p.headDim))}
#define PER_THREAD ${Math.ceil(p.headDim / p.block)}
${reductionHelpers()}`;
}

function tiledPrelude(p: Readonly<AttnP>, kind: 'rows' | 'dkv'): string {
  return `#define BLOCK ${p.block}
#define NW (BLOCK / 32)
#define HD ${p.headDim}
#define HDP (HD + 1)
#define DCH ((HD + 31) / 32)
#define KT ${KT}
#define RPW ${rowsPerWarp(kind, p.headDim, p.block)}
#define TQ (NW * RPW)
#define SCALE ${f32(1 / Math.sqrt(p.headDim))}
${reductionHelpers()}
/* rows [r0, r0 + nrows) of a [*, stride]-strided matrix (row t at base + t·stride) into sh[nrows][HDP]; 0 past T */
__device__ __forceinline__ void loadRows(float (*sh)[HDP], const float* base, long long stride, int r0, int nrows, int T) {
  for (int x = threadIdx.x; x < nrows * HD; x += BLOCK) {
    int r = x / HD, d = x - r * HD;
    sh[r][d] = (r0 + r < T) ? base[(long long)(r0 + r) * stride + d] : 0.0f;
  }
}`;
}

/** Grid (ceil(T / attnQueryTile), nH, B), block = params.block. */
export const attentionForward = defineFamily<AttnP>({
  name: 'attention_fwd', schema: trainSchema, example: { headDim: 64, block: 128 },
  generate: (p) => `${tiledPrelude(p, 'rows')}
extern "C" __global__ void attention_fwd(float* out, float* probs, const float* q, const float* k, const float* v,
                                         int T, int nH, int nKv) {
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (nH / nKv);
  const int i0 = blockIdx.x * TQ, iEnd = min(T, i0 + TQ);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __shared__ float Qs[TQ][HDP];
  __shared__ float KV[KT][HDP];
  __shared__ float Ps[TQ][KT + 1];
  const long long qs = (long long)nH * HD, ks = (long long)nKv * HD;
  const float* qb = q + ((long long)b * T * nH + h) * HD;
  const float* kb = k + ((long long)b * T * nKv + kvh) * HD;
  const float* vb = v + ((long long)b * T * nKv + kvh) * HD;
  float* pb = probs + ((long long)b * nH + h) * T * T;
  loadRows(Qs, qb, qs, i0, TQ, T);
  /* scores: lane = key j0 + lane, the warp's RPW rows */
  for (int j0 = 0; j0 < iEnd; j0 += KT) {
    __syncthreads();
    loadRows(KV, kb, ks, j0, KT, T);
    __syncthreads();
    float acc[RPW];
    for (int rr = 0; rr < RPW; rr++) acc[rr] = 0.0f;
    for (int d = 0; d < HD; d++) {
      float kv = KV[lane][d];
      for (int rr = 0; rr < RPW; rr++) acc[rr] += Qs[warp * RPW + rr][d] * kv;
    }
    int j = j0 + lane;
    for (int rr = 0; rr < RPW; rr++) {
      int i = i0 + warp * RPW + rr;
      if (i < T && j <= i) pb[(long long)i * T + j] = acc[rr] * SCALE;
    }
  }
  __syncthreads();
  /* softmax: a warp per row (each lane reads back only what it wrote or another thread wrote before the barrier) */
  for (int rr = 0; rr < RPW; rr++) {
    int i = i0 + warp * RPW + rr;
    if (i >= T) break;
    float* prow = pb + (long long)i * T;
    float mx = NEG_INF;
    for (int j = lane; j <= i; j += 32) mx = fmaxf(mx, prow[j]);
    mx = warpMax(mx);
    float sum = 0.0f;
    for (int j = lane; j <= i; j += 32) { float e = expf(prow[j] - mx); prow[j] = e; sum += e; }
    sum = warpSum(sum);
    float inv = 1.0f / sum;
    for (int j = lane; j <= i; j += 32) prow[j] *= inv;
    for (int j = i + 1 + lane; j < T; j += 32) prow[j] = 0.0f;
  }
  /* out = P·V: lane owns d = lane + 32·c */
  float acc[RPW][DCH];
  for (int rr = 0; rr < RPW; rr++) for (int c = 0; c < DCH; c++) acc[rr][c] = 0.0f;
  for (int j0 = 0; j0 < iEnd; j0 += KT) {
    __syncthreads();
    loadRows(KV, vb, ks, j0, KT, T);
    for (int x = threadIdx.x; x < TQ * KT; x += BLOCK) {
      int r = x / KT, c = x - r * KT, i = i0 + r, j = j0 + c;
      Ps[r][c] = (i < T && j < T) ? pb[(long long)i * T + j] : 0.0f;
    }
    __syncthreads();
    for (int c = 0; c < KT; c++) {
      for (int rr = 0; rr < RPW; rr++) {
        float pv = Ps[warp * RPW + rr][c];
        for (int dc = 0; dc < DCH; dc++) {
          int d = lane + 32 * dc;
          if (d < HD) acc[rr][dc] += pv * KV[c][d];
        }
      }
    }
  }
  for (int rr = 0; rr < RPW; rr++) {
    int i = i0 + warp * RPW + rr;
    if (i >= T) break;
    float* oi = out + ((long long)b * T + i) * qs + (long long)h * HD;
    for (int dc = 0; dc < DCH; dc++) {
      int d = lane + 32 * dc;
      if (d < HD) oi[d] = acc[rr][dc];
    }
  }
}
`,
});

/**
 * Grid (ceil(T / attnQueryTile), nH, B). dq += dS·K; rowdot[(b·nH + h)·T + i] = Σ_j P_ij dP_ij (scratch for
 * attention_bwd_dkv, launched next).
 */
export const attentionBackward = defineFamily<AttnP>({
  name: 'attention_bwd', schema: trainSchema, example: { headDim: 64, block: 128 },
  generate: (p) => `${tiledPrelude(p, 'rows')}
extern "C" __global__ void attention_bwd(float* dq, float* rowdot, const float* dout, const float* k, const float* v,
                                         const float* probs, int T, int nH, int nKv) {
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (nH / nKv);
  const int i0 = blockIdx.x * TQ, iEnd = min(T, i0 + TQ);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __shared__ float Ds[TQ][HDP];
  __shared__ float KV[KT][HDP];
  __shared__ float Ss[TQ][KT + 1];
  const long long qs = (long long)nH * HD, ks = (long long)nKv * HD;
  const float* kb = k + ((long long)b * T * nKv + kvh) * HD;
  const float* vb = v + ((long long)b * T * nKv + kvh) * HD;
  const float* pb = probs + ((long long)b * nH + h) * T * T;
  loadRows(Ds, dout + ((long long)b * T * nH + h) * HD, qs, i0, TQ, T);
  /* pass 1: rowdot */
  float part[RPW];
  for (int rr = 0; rr < RPW; rr++) part[rr] = 0.0f;
  for (int j0 = 0; j0 < iEnd; j0 += KT) {
    __syncthreads();
    loadRows(KV, vb, ks, j0, KT, T);
    __syncthreads();
    float dp[RPW];
    for (int rr = 0; rr < RPW; rr++) dp[rr] = 0.0f;
    for (int d = 0; d < HD; d++) {
      float vv = KV[lane][d];
      for (int rr = 0; rr < RPW; rr++) dp[rr] += Ds[warp * RPW + rr][d] * vv;
    }
    int j = j0 + lane;
    for (int rr = 0; rr < RPW; rr++) {
      int i = i0 + warp * RPW + rr;
      if (i < T && j <= i) part[rr] += pb[(long long)i * T + j] * dp[rr];
    }
  }
  float rd[RPW];
  for (int rr = 0; rr < RPW; rr++) {
    rd[rr] = warpSum(part[rr]);
    int i = i0 + warp * RPW + rr;
    if (lane == 0 && i < T) rowdot[((long long)b * nH + h) * T + i] = rd[rr];
  }
  /* pass 2: dS, then dq += dS·K */
  float acc[RPW][DCH];
  for (int rr = 0; rr < RPW; rr++) for (int c = 0; c < DCH; c++) acc[rr][c] = 0.0f;
  for (int j0 = 0; j0 < iEnd; j0 += KT) {
    __syncthreads();
    loadRows(KV, vb, ks, j0, KT, T);
    __syncthreads();
    float dp[RPW];
    for (int rr = 0; rr < RPW; rr++) dp[rr] = 0.0f;
    for (int d = 0; d < HD; d++) {
      float vv = KV[lane][d];
      for (int rr = 0; rr < RPW; rr++) dp[rr] += Ds[warp * RPW + rr][d] * vv;
    }
    int j = j0 + lane;
    for (int rr = 0; rr < RPW; rr++) {
      int i = i0 + warp * RPW + rr;
      float pv = (i < T && j <= i) ? pb[(long long)i * T + j] : 0.0f;
      Ss[warp * RPW + rr][lane] = pv * (dp[rr] - rd[rr]) * SCALE;
    }
    __syncthreads();
    loadRows(KV, kb, ks, j0, KT, T);
    __syncthreads();
    for (int c = 0; c < KT; c++) {
      for (int rr = 0; rr < RPW; rr++) {
        float sv = Ss[warp * RPW + rr][c];
        for (int dc = 0; dc < DCH; dc++) {
          int d = lane + 32 * dc;
          if (d < HD) acc[rr][dc] += sv * KV[c][d];
        }
      }
    }
  }
  for (int rr = 0; rr < RPW; rr++) {
    int i = i0 + warp * RPW + rr;
    if (i >= T) break;
    float* dqi = dq + ((long long)b * T + i) * qs + (long long)h * HD;
    for (int dc = 0; dc < DCH; dc++) {
      int d = lane + 32 * dc;
      if (d < HD) dqi[d] += acc[rr][dc];
    }
  }
}
`,
});

/**
 * Grid (ceil(T / ATTN_KEY_TILE), nKv·S, B). For the block's 32 keys of one kv head: dk += Σ_{h in group, i ≥ j} dS_ij q_i,
 * dv += Σ P_ij dout_i, with dS recomputed from probs, dout·vᵀ and attention_bwd's rowdot. S splits the kv head's
 * query-head group across blocks (more blocks): S = 1 adds into dk/dv directly; S > 1 writes per-split partials to
 * `part` and attention_dkv_reduce adds them in split order. Deterministic either way (no atomics).
 */
export const attentionBackwardKv = defineFamily<AttnP>({
  name: 'attention_bwd_dkv', schema: trainSchema, example: { headDim: 64, block: 128 },
  generate: (p) => `${tiledPrelude(p, 'dkv')}
#define KPW (KT / NW)
extern "C" __global__ void attention_bwd_dkv(float* dk, float* dv, float* part, const float* rowdot, const float* dout,
                                             const float* q, const float* v, const float* probs, int T, int nH, int nKv) {
  /* blockIdx.y = kvh·S + s: split s of S walks query heads [g0, g1) of the kv head's group */
  const int G = nH / nKv, S = gridDim.y / nKv, kvh = blockIdx.y / S, s = blockIdx.y - kvh * S, b = blockIdx.z;
  const int g0 = s * G / S, g1 = (s + 1) * G / S;
  const int j0 = blockIdx.x * KT;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __shared__ float Vs[KT][HDP];
  __shared__ float Qs[TQ][HDP];
  __shared__ float Ds[TQ][HDP];
  __shared__ float Ps[TQ][KT + 1];
  __shared__ float Ss[TQ][KT + 1];
  const long long qs = (long long)nH * HD, ks = (long long)nKv * HD;
  loadRows(Vs, v + ((long long)b * T * nKv + kvh) * HD, ks, j0, KT, T);
  float adk[KPW][DCH], adv[KPW][DCH];
  for (int kk = 0; kk < KPW; kk++) for (int c = 0; c < DCH; c++) { adk[kk][c] = 0.0f; adv[kk][c] = 0.0f; }
  for (int g = g0; g < g1; g++) {
    const int h = kvh * G + g;
    const float* qb = q + ((long long)b * T * nH + h) * HD;
    const float* db = dout + ((long long)b * T * nH + h) * HD;
    const float* pb = probs + ((long long)b * nH + h) * T * T;
    const float* rdb = rowdot + ((long long)b * nH + h) * T;
    for (int i0 = j0; i0 < T; i0 += TQ) {
      __syncthreads();
      loadRows(Qs, qb, qs, i0, TQ, T);
      loadRows(Ds, db, qs, i0, TQ, T);
      __syncthreads();
      /* scores: the warp's RPW query rows, lane = key j0 + lane */
      float dp[RPW];
      for (int rr = 0; rr < RPW; rr++) dp[rr] = 0.0f;
      for (int d = 0; d < HD; d++) {
        float vv = Vs[lane][d];
        for (int rr = 0; rr < RPW; rr++) dp[rr] += Ds[warp * RPW + rr][d] * vv;
      }
      int j = j0 + lane;
      for (int rr = 0; rr < RPW; rr++) {
        int r = warp * RPW + rr, i = i0 + r;
        bool ok = i < T && j <= i;
        float pv = ok ? pb[(long long)i * T + j] : 0.0f;
        float rdv = i < T ? rdb[i] : 0.0f;
        Ps[r][lane] = pv;
        Ss[r][lane] = ok ? pv * (dp[rr] - rdv) * SCALE : 0.0f;
      }
      __syncthreads();
      /* dk, dv: the warp's KPW keys, lane owns d = lane + 32·c */
      for (int r = 0; r < TQ; r++) {
        for (int dc = 0; dc < DCH; dc++) {
          int d = lane + 32 * dc;
          if (d < HD) {
            float dov = Ds[r][d], qv = Qs[r][d];
            for (int kk = 0; kk < KPW; kk++) {
              adv[kk][dc] += Ps[r][warp * KPW + kk] * dov;
              adk[kk][dc] += Ss[r][warp * KPW + kk] * qv;
            }
          }
        }
      }
    }
  }
  for (int kk = 0; kk < KPW; kk++) {
    int j = j0 + warp * KPW + kk;
    if (j >= T) break;
    if (S == 1) {
      long long off = ((long long)b * T + j) * ks + (long long)kvh * HD;
      for (int dc = 0; dc < DCH; dc++) {
        int d = lane + 32 * dc;
        if (d < HD) { dk[off + d] += adk[kk][dc]; dv[off + d] += adv[kk][dc]; }
      }
    } else {
      /* partials [b][kvh][s][j][HD] (dk), then the same again for dv; attention_dkv_reduce sums s in order */
      const long long half = (long long)gridDim.z * gridDim.y * T * HD;
      long long po = ((((long long)b * nKv + kvh) * S + s) * T + j) * HD;
      for (int dc = 0; dc < DCH; dc++) {
        int d = lane + 32 * dc;
        if (d < HD) { part[po + d] = adk[kk][dc]; part[half + po + d] = adv[kk][dc]; }
      }
    }
  }
}
`,
});

type BlockP = { block: number };

/**
 * Grid-stride over n = B·T·nKv·hd elements of dk/dv ([b][j][kvh][d]): dk += Σ_{s<S} part_dk[b][kvh][s][j][d],
 * dv likewise (part_dv follows part_dk), s in order: the fixed-order second stage of attention_bwd_dkv with S > 1.
 */
export const attentionDkvReduce = defineFamily<BlockP>({
  name: 'attention_dkv_reduce', schema: { block: BLOCK_DOMAIN }, example: { block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
extern "C" __global__ void attention_dkv_reduce(float* dk, float* dv, const float* part, long long n, int T, int nKv, int S, int hd) {
  const long long half = n * S;
  for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (long long)gridDim.x * BLOCK) {
    int d = (int)(i % hd);
    long long r = i / hd;
    int kvh = (int)(r % nKv);
    r /= nKv;
    int j = (int)(r % T);
    long long b = r / T;
    long long base = (((b * nKv + kvh) * S) * T + j) * hd + d, st = (long long)T * hd;
    float sk = 0.0f, sv = 0.0f;
    for (int s = 0; s < S; s++) { sk += part[base + s * st]; sv += part[half + base + s * st]; }
    dk[i] += sk;
    dv[i] += sv;
  }
}
`,
});

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
