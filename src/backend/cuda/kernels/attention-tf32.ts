/**
 * EXPERIMENTAL training forward on TF32 tensor cores (attention_fwd_mma): not launched unless the CUDA backend is created
 * with `attention: 'mma'` (tests); still compile-gated and mutation-tested (index.ts EXPERIMENTAL_FAMILIES).
 */
import { defineFamily, f32 } from './spec.js';
import { DOC_START } from './attention.js';

/** Head dims the tensor-core forward supports: multiples of 8 (mma k and n steps) up to 128 (Q and O stay in registers). */
export const MMA_MAX_HEAD_DIM = 128;
const mmaSchema = { headDim: { kind: 'int', min: 8, max: MMA_MAX_HEAD_DIM, step: 8 } } as const;
/** Query rows per block of attention_fwd_mma: 4 warps × 16 rows. */
export const MMA_QUERY_TILE = 64;
/** Keys per tile of attention_fwd_mma. */
export const MMA_KEY_TILE = 32;
/** Dynamic shared memory of attention_fwd_mma: a K tile [32][HD+4] and a V tile [32][HD+8] (the Q tile is staged there first). */
export function mmaForwardSmem(headDim: number): number { return 4 * (MMA_KEY_TILE * (headDim + 4) + MMA_KEY_TILE * (headDim + 8)); }

/**
 * EXPERIMENTAL, not used by the backend unless it is created with `attention: 'mma'` (tests): the training forward
 * on tensor cores, TF32 mma.sync.m16n8k8 with fp32 accumulation, same contract as attention_fwd (out, lse), so it is
 * about 1e-3 relative from fp32. Grid (ceil(T / 64), nH, B), block 128 (4 warps × 16 query rows), dynamic shared
 * memory mmaForwardSmem(headDim). A warp keeps its Q rows as A fragments and its O rows as accumulators in
 * registers; per key tile of 32: S = Q·Kᵀ (4 n-atoms × HD/8 k-steps), online softmax on the accumulator rows (a row's
 * 32 scores live in the 4 lanes of a quad: 8 each, reduced with two xor-shuffles), P re-laid from accumulator to A
 * fragments with quad shuffles, O += P·V (HD/8 n-atoms × 4 k-steps). Fragment layouts (PTX ISA, m16n8k8 .tf32;
 * g = lane / 4, t = lane % 4): A a0 (g, t) a1 (g+8, t) a2 (g, t+4) a3 (g+8, t+4); B b0 (k t, n g) b1 (k t+4, n g);
 * C c0 (g, 2t) c1 (g, 2t+1) c2 (g+8, 2t) c3 (g+8, 2t+1). Rows padded by 4 (K) and 8 (V) floats: fragment loads hit
 * 32 distinct banks.
 */
export const attentionForwardMma = defineFamily<{ headDim: number }>({
  name: 'attention_fwd_mma', schema: mmaSchema, example: { headDim: 64 },
  generate: (p) => `#define HD ${p.headDim}
#define KS (HD / 8)
#define KSTR (HD + 4)
#define VSTR (HD + 8)
#define BQ ${MMA_QUERY_TILE}
#define BK ${MMA_KEY_TILE}
#define SCALE ${f32(1 / Math.sqrt(p.headDim))}
#define NEG_INF __int_as_float(0xff800000)
#define FULL 0xffffffffu
${DOC_START}
__device__ __forceinline__ unsigned toTf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
/* c += a · b on one m16n8k8 tile */
__device__ __forceinline__ void mma8(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
extern "C" __global__ void attention_fwd_mma(float* out, float* lse, const float* q, const float* k, const float* v,
                                             int T, int nH, int nKv, const int* docPos) {
  extern __shared__ float smem[];
  float* Ks = smem;               /* [BK][KSTR] */
  float* Vs = smem + BK * KSTR;   /* [BK][VSTR] */
  float* Qst = smem;              /* [BQ][KSTR] staging, before the key loop */
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (nH / nKv);
  const int i0 = blockIdx.x * BQ, iEnd = min(T, i0 + BQ);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const long long qs = (long long)nH * HD, ks = (long long)nKv * HD;
  const float* qb = q + ((long long)b * T * nH + h) * HD;
  const float* kb = k + ((long long)b * T * nKv + kvh) * HD;
  const float* vb = v + ((long long)b * T * nKv + kvh) * HD;
  for (int x = threadIdx.x; x < BQ * HD; x += 128) {
    const int r = x / HD, d = x - r * HD;
    Qst[r * KSTR + d] = (i0 + r < T) ? qb[(long long)(i0 + r) * qs + d] : 0.0f;
  }
  __syncthreads();
  const int rw = warp * 16; /* the warp's first row in the tile */
  unsigned qa[KS][4];
#pragma unroll
  for (int s = 0; s < KS; s++) {
    qa[s][0] = toTf32(Qst[(rw + g) * KSTR + 8 * s + t]);
    qa[s][1] = toTf32(Qst[(rw + g + 8) * KSTR + 8 * s + t]);
    qa[s][2] = toTf32(Qst[(rw + g) * KSTR + 8 * s + t + 4]);
    qa[s][3] = toTf32(Qst[(rw + g + 8) * KSTR + 8 * s + t + 4]);
  }
  const int iA = i0 + rw + g, iB = iA + 8; /* the two query rows this lane's accumulators belong to */
  const int stA = docStart(docPos, b, T, iA), stB = docStart(docPos, b, T, iB); /* their first keys */
  float o[KS][4];
#pragma unroll
  for (int n = 0; n < KS; n++) { o[n][0] = 0.0f; o[n][1] = 0.0f; o[n][2] = 0.0f; o[n][3] = 0.0f; }
  float mA = NEG_INF, mB = NEG_INF, lA = 0.0f, lB = 0.0f;
  const int srcLo = (lane & ~3) | (t >> 1), srcHi = srcLo + 2; /* quad lanes holding P columns t and t + 4 */
  /* key tiles from the one holding the tile's first row's first key (its document's start, the tile's smallest) */
  for (int j0 = docStart(docPos, b, T, i0) / BK * BK; j0 < iEnd; j0 += BK) {
    __syncthreads(); /* the Q staging / previous K and V tiles are no longer read */
    for (int x = threadIdx.x; x < BK * HD; x += 128) {
      const int r = x / HD, d = x - r * HD;
      const bool in = j0 + r < T;
      Ks[r * KSTR + d] = in ? kb[(long long)(j0 + r) * ks + d] : 0.0f;
      Vs[r * VSTR + d] = in ? vb[(long long)(j0 + r) * ks + d] : 0.0f;
    }
    __syncthreads();
    /* S = Q·Kᵀ: n-atom n covers keys j0 + 8n .. j0 + 8n + 7 */
    float sc[4][4];
#pragma unroll
    for (int n = 0; n < 4; n++) {
      sc[n][0] = 0.0f; sc[n][1] = 0.0f; sc[n][2] = 0.0f; sc[n][3] = 0.0f;
#pragma unroll
      for (int s = 0; s < KS; s++) {
        mma8(sc[n], qa[s], toTf32(Ks[(8 * n + g) * KSTR + 8 * s + t]), toTf32(Ks[(8 * n + g) * KSTR + 8 * s + t + 4]));
      }
    }
    /* mask and scale: element e of atom n is (row e < 2 ? iA : iB, key j0 + 8n + 2t + (e & 1)) */
    float mxA = NEG_INF, mxB = NEG_INF;
#pragma unroll
    for (int n = 0; n < 4; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int j = j0 + 8 * n + 2 * t + (e & 1), i = e < 2 ? iA : iB;
        const float x = (j <= i && j < T && j >= (e < 2 ? stA : stB)) ? sc[n][e] * SCALE : NEG_INF;
        sc[n][e] = x;
        if (e < 2) mxA = fmaxf(mxA, x); else mxB = fmaxf(mxB, x);
      }
    }
    mxA = fmaxf(mxA, __shfl_xor_sync(FULL, mxA, 1)); mxA = fmaxf(mxA, __shfl_xor_sync(FULL, mxA, 2));
    mxB = fmaxf(mxB, __shfl_xor_sync(FULL, mxB, 1)); mxB = fmaxf(mxB, __shfl_xor_sync(FULL, mxB, 2));
    /* the new maxima: -inf while a row has met none of its keys (documents), where 0 stands in below (exp gives 0, not NaN) */
    const float nA = fmaxf(mA, mxA), nB = fmaxf(mB, mxB);
    const float zA = nA == NEG_INF ? 0.0f : nA, zB = nB == NEG_INF ? 0.0f : nB;
    const float aA = expf(mA - zA), aB = expf(mB - zB);
    float sA = 0.0f, sB = 0.0f;
#pragma unroll
    for (int n = 0; n < 4; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float pe = expf(sc[n][e] - (e < 2 ? zA : zB)); /* exp(-inf) = 0 for masked keys */
        sc[n][e] = pe;
        if (e < 2) sA += pe; else sB += pe;
      }
    }
    sA += __shfl_xor_sync(FULL, sA, 1); sA += __shfl_xor_sync(FULL, sA, 2);
    sB += __shfl_xor_sync(FULL, sB, 1); sB += __shfl_xor_sync(FULL, sB, 2);
    lA = lA * aA + sA; lB = lB * aB + sB; mA = nA; mB = nB;
#pragma unroll
    for (int n = 0; n < KS; n++) { o[n][0] *= aA; o[n][1] *= aA; o[n][2] *= aB; o[n][3] *= aB; }
    /* O += P·V: k-step kk covers keys j0 + 8kk ..; P's A fragment from the accumulator layout by quad shuffles */
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
      const float x0 = __shfl_sync(FULL, sc[kk][0], srcLo), x1 = __shfl_sync(FULL, sc[kk][1], srcLo);
      const float y0 = __shfl_sync(FULL, sc[kk][0], srcHi), y1 = __shfl_sync(FULL, sc[kk][1], srcHi);
      const float z0 = __shfl_sync(FULL, sc[kk][2], srcLo), z1 = __shfl_sync(FULL, sc[kk][3], srcLo);
      const float w0 = __shfl_sync(FULL, sc[kk][2], srcHi), w1 = __shfl_sync(FULL, sc[kk][3], srcHi);
      unsigned pa[4];
      pa[0] = toTf32((t & 1) ? x1 : x0); /* (g, t) */
      pa[1] = toTf32((t & 1) ? z1 : z0); /* (g + 8, t) */
      pa[2] = toTf32((t & 1) ? y1 : y0); /* (g, t + 4) */
      pa[3] = toTf32((t & 1) ? w1 : w0); /* (g + 8, t + 4) */
#pragma unroll
      for (int n = 0; n < KS; n++) {
        mma8(o[n], pa, toTf32(Vs[(8 * kk + t) * VSTR + 8 * n + g]), toTf32(Vs[(8 * kk + t + 4) * VSTR + 8 * n + g]));
      }
    }
  }
  const float invA = 1.0f / lA, invB = 1.0f / lB;
  if (iA < T) {
    float* oa = out + ((long long)b * T + iA) * qs + (long long)h * HD;
#pragma unroll
    for (int n = 0; n < KS; n++) { oa[8 * n + 2 * t] = o[n][0] * invA; oa[8 * n + 2 * t + 1] = o[n][1] * invA; }
    if (t == 0) lse[((long long)b * nH + h) * T + iA] = mA + logf(lA);
  }
  if (iB < T) {
    float* ob = out + ((long long)b * T + iB) * qs + (long long)h * HD;
#pragma unroll
    for (int n = 0; n < KS; n++) { ob[8 * n + 2 * t] = o[n][2] * invB; ob[8 * n + 2 * t + 1] = o[n][3] * invB; }
    if (t == 0) lse[((long long)b * nH + h) * T + iB] = mB + logf(lB);
  }
}
`,
});

// ---- bf16 tensor-core flash attention (training) ------------------------------------------------------------------

