/**
 * Causal grouped-query attention kernels: flash-style training forward (saves the log-sum-exp of each query row,
 * never probabilities), its backward (a D = rowsum(dout ∘ out) pass, then dQ per query tile and dK/dV per key
 * tile, recomputing P = exp(S − lse)). Baked: headDim (and
 * so the 1/sqrt(headDim) scale), block size, and the tile sizes derived from them (attnTile()). fp32 SIMT.
 *
 * Training kernels are tiled: a block owns TQ = (block/32)·RPW query rows of one (batch, head), or KT = 32 keys
 * of one (batch, kv head), and stages row tiles in dynamic shared memory (rows padded to HD+1 floats, so a warp
 * reading 32 rows' element d hits 32 banks). A warp owns RPW query rows; a lane owns one key (scores) or the head
 * dims d = lane + 32·c (products with V, K, Q or dout). Memory is linear in T: nothing [T, T] exists anywhere.
 * - attention_fwd (grid ceil(T/TQ) × nH × B): online softmax over key tiles [0, last row of the tile] (tiles
 *   above the diagonal are never visited): per tile, scores S = Q·Kᵀ·scale (lane = key), running max m and sum l
 *   per row, acc = acc·exp(m_old − m_new) + P·V with P broadcast by warp shuffles; out = acc / l,
 *   lse = m + log(l) (natural log). K and V share one tile buffer (K, barrier, V).
 * - attention_bwd_pre (grid-stride, a warp per row, or 256/HD rows a warp with bf16 operands): D[b, h, i] = Σ_d dout·out
 *   (scratch owned by the backend).
 * - attention_bwd (grid ceil(T/TQ) × nH × B): dQ += scale·Σ_j dS_ij k_j with dS = P ⊙ (dout·vᵀ − D), per key tile
 *   (V, barrier, K in one buffer); dS broadcast by warp shuffles.
 * - attention_bwd_dkv (grid ceil(T/32) × nKv·S × B): for the block's 32 keys, walks the query tiles from the
 *   diagonal down of each query head of its split of the GQA group, dK += Σ dS_ij q_i, dV += Σ P_ij dout_i in
 *   registers (a warp owns 32/NW keys, a lane owns head dims); S > 1 writes per-split partials that
 *   attention_dkv_reduce sums in split order. No atomics anywhere: the backward is bit-for-bit deterministic.
 * Every float operand of these SIMT kernels (q, k, v, out, dout, dq, dk, dv, the KV caches) is f32 or bf16, baked per
 * operand (DTYPE_DOMAIN params; ldf/stf from spec.ts): tiles are staged as float, math is fp32, a bf16 output is
 * rounded once (a gradient: read, add in float, round). lse and the D scratch are always f32.
 *
 * The bf16 tensor-core training kernels (FlashAttention-2 style, used whenever q, k, v and dout are bf16 and the head dim
 * fits) are in attention-bf16.ts; the experimental TF32 tensor-core forward in attention-tf32.ts. Both paths share
 * attention_dkv_reduce (below) and the D scratch layout. The KV-cache write and generation's cached attention (its two
 * kernels, their layouts and which a call launches) are in attention-cached.ts.
 */
import { BLOCK_DOMAIN, DTYPE_DOMAIN, LD8_HELPERS, ctype, defineFamily, dtypeHelpers, f32, reductionHelpers } from './spec.js';

/**
 * The training kernels' document rule (Backend DocPositions): `docPos` (an int per row of the B·T, or null) holds each
 * row's position in its document, so row i of sequence b attends to keys from i − docPos[b·T + i] on; without it (null),
 * from 0. Rows past T: 0. Starts never decrease along a sequence, so a tile's first row has its smallest start and its
 * last row its largest.
 */
export const DOC_START = `
/* the first key row i of sequence b attends to: its document's first row, or 0 without documents (docPos null) */
__device__ __forceinline__ int docStart(const int* __restrict__ docPos, int b, int T, int i) {
  return docPos != nullptr && i < T ? i - docPos[(long long)b * T + i] : 0;
}`;

/** The parameters every attention family bakes (attention-cached.ts's too). */
export type AttnP = { headDim: number; block: number };
/** An operand dtype ('f32' | 'bf16'): baked, so it is in the source and the cache key. */
export type AttnDtype = 'f32' | 'bf16';
type Dt = AttnDtype;
/** The schema of headDim and block every SIMT attention family starts from (attention-cached.ts's too). */
export const attentionSchema = { headDim: { kind: 'int', min: 1, max: 1024 }, block: BLOCK_DOMAIN } as const;
const schema = attentionSchema;
/** Keys per tile (one per lane). */
const KT = 32;
/** Shared memory a block may use without opting in (cuFuncSetAttribute). */
export const SMEM_DEFAULT = 48 * 1024;
/** Opt-in cap: every sm_80+ target grants at least 99 KiB per block (sm_86/89/120); sm_80 and sm_90 grant more. */
export const SMEM_OPT_IN = 96 * 1024;
/** Accumulator registers per thread the row kernels may use (RPW · ceil(HD/32)). */
const ACC_REGS = 32;

export type AttnTileKind = 'fwd' | 'dq' | 'dkv';

function smemFloats(kind: AttnTileKind, hd: number, tq: number): number {
  const hdp = hd + 1;
  switch (kind) {
    case 'fwd': return (tq + KT) * hdp; // Q tile, K/V tile
    case 'dq': return (2 * tq + KT) * hdp; // Q and dout tiles, V/K tile
    case 'dkv': return (2 * KT + 2 * tq) * hdp + 2 * tq * (KT + 1); // K, V, Q, dout tiles, P and dS tiles
  }
}

export interface AttnTile {
  /** Query rows per warp. */
  rpw: number;
  /** Query rows per block (a query tile of attention_fwd / attention_bwd; the query step of attention_bwd_dkv). */
  tq: number;
  /** Dynamic shared memory per block, bytes (above SMEM_DEFAULT the backend opts in with cuFuncSetAttribute). */
  smem: number;
}

/**
 * The tile of one training kernel: the most query rows per warp (8, 4, 2, 1) whose shared memory fits 48 KiB
 * (no opt-in) and whose accumulators fit ACC_REGS registers; failing that, the most that fit SMEM_OPT_IN. Null when
 * even one row per warp does not fit (head dims beyond MAX_TRAIN_HEAD_DIM).
 */
export function attnTile(kind: AttnTileKind, headDim: number, block: number): AttnTile | null {
  const nw = block / 32, dch = Math.ceil(headDim / 32);
  for (const budget of [SMEM_DEFAULT, SMEM_OPT_IN]) {
    for (const rpw of [8, 4, 2, 1]) {
      if (kind !== 'dkv' && rpw > 1 && rpw * dch > ACC_REGS) continue;
      const tq = nw * rpw, smem = 4 * smemFloats(kind, headDim, tq);
      if (smem <= budget) return { rpw, tq, smem };
    }
  }
  return null;
}

function mustTile(kind: AttnTileKind, headDim: number, block: number): AttnTile {
  const t = attnTile(kind, headDim, block);
  if (!t) throw new Error(`attention ${kind}: head dim ${headDim} does not fit ${SMEM_OPT_IN} bytes of shared memory`);
  return t;
}

/** The largest head dim every training kernel fits (attention_bwd_dkv's K and V tiles bound it). */
export const MAX_TRAIN_HEAD_DIM = 256;
const trainSchema = { headDim: { kind: 'int', min: 1, max: MAX_TRAIN_HEAD_DIM }, block: BLOCK_DOMAIN } as const;

/** Query rows per block of attention_fwd / attention_bwd (the grid's x is ceil(T / this)). */
export function attnQueryTile(kind: 'fwd' | 'dq', headDim: number, block: number): number { return mustTile(kind, headDim, block).tq; }
/** Keys per block of attention_bwd_dkv (the grid's x is ceil(T / this)). */
export const ATTN_KEY_TILE = KT;

/** BLOCK, HD, SCALE (1/sqrt(HD)), PER_THREAD and the reduction and dtype helpers: the SIMT attention kernels' common start. */
export function attentionPrelude(p: Readonly<AttnP>): string {
  return `#define BLOCK ${p.block}
#define HD ${p.headDim}
#define SCALE ${f32(1 / Math.sqrt(p.headDim))}
#define PER_THREAD ${Math.ceil(p.headDim / p.block)}
${reductionHelpers()}${dtypeHelpers()}`;
}

function tiledPrelude(p: Readonly<AttnP>, kind: AttnTileKind): string {
  const t = mustTile(kind, p.headDim, p.block);
  return `#define BLOCK ${p.block}
#define NW (BLOCK / 32)
#define HD ${p.headDim}
#define HDP (HD + 1)
#define DCH ((HD + 31) / 32)
#define KT ${KT}
#define RPW ${t.rpw}
#define TQ (NW * RPW)
/* dynamic shared memory the launch must pass: ${t.smem} bytes */
#define SMEM_BYTES ${t.smem}
#define SCALE ${f32(1 / Math.sqrt(p.headDim))}
#define FULL 0xffffffffu
${reductionHelpers()}${dtypeHelpers()}${DOC_START}
/* rows [r0, r0 + nrows) of a [*, stride]-strided matrix (row t at base + t·stride; float or bf16) into float
   sh[nrows][HDP]; 0 past T */
template <typename E>
__device__ __forceinline__ void loadRows(float* sh, const E* base, long long stride, int r0, int nrows, int T) {
  for (int x = threadIdx.x; x < nrows * HD; x += BLOCK) {
    int r = x / HD, d = x - r * HD;
    sh[r * HDP + d] = (r0 + r < T) ? ldf(base, (long long)(r0 + r) * stride + d) : 0.0f;
  }
}
/* out[rr] = Σ_d rows[warp·RPW + rr][d] · tile[lane][d]: the lane's key row of a [KT][HDP] tile against each of the
   warp's RPW rows of a [TQ][HDP] tile (S = Q·Kᵀ, dP = dO·Vᵀ) */
__device__ __forceinline__ void rowDots(float (&out)[RPW], const float* rows, const float* tile, int warp, int lane) {
#pragma unroll
  for (int rr = 0; rr < RPW; rr++) out[rr] = 0.0f;
  for (int d = 0; d < HD; d++) {
    float kv = tile[lane * HDP + d];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) out[rr] += rows[(warp * RPW + rr) * HDP + d] * kv;
  }
}
/* acc[rr][dc] += Σ_c coef[rr] of lane c · tile[c][lane + 32·dc]: each of the warp's rows' per-key coefficients (a lane
   holds its key's), broadcast by shuffles, times the [KT][HDP] tile's rows (O += P·V, dQ += dS·K) */
__device__ __forceinline__ void addShuffledRows(float (&acc)[RPW][DCH], const float (&coef)[RPW], const float* tile, int lane) {
#pragma unroll 4
  for (int c = 0; c < KT; c++) {
    float tr[DCH];
#pragma unroll
    for (int dc = 0; dc < DCH; dc++) { int d = lane + 32 * dc; tr[dc] = d < HD ? tile[c * HDP + d] : 0.0f; }
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
      const float cc = __shfl_sync(FULL, coef[rr], c);
#pragma unroll
      for (int dc = 0; dc < DCH; dc++) acc[rr][dc] += cc * tr[dc];
    }
  }
}`;
}

/** Grid (ceil(T / attnQueryTile('fwd')), nH, B), block = params.block, dynamic shared memory attnTile('fwd').smem. */
export const attentionForward = defineFamily<AttnP & { out: Dt; q: Dt; k: Dt; v: Dt }>({
  name: 'attention_fwd', schema: { ...trainSchema, out: DTYPE_DOMAIN, q: DTYPE_DOMAIN, k: DTYPE_DOMAIN, v: DTYPE_DOMAIN },
  example: { headDim: 64, block: 128, out: 'f32', q: 'f32', k: 'f32', v: 'f32' },
  generate: (p) => `${tiledPrelude(p, 'fwd')}
extern "C" __global__ void attention_fwd(${ctype(p.out)}* out, float* lse, const ${ctype(p.q)}* q, const ${ctype(p.k)}* k,
                                         const ${ctype(p.v)}* v, int T, int nH, int nKv, const int* docPos) {
  extern __shared__ float smem[];
  float* Qs = smem;            /* [TQ][HDP] */
  float* KV = smem + TQ * HDP; /* [KT][HDP]: the K tile, then the V tile */
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (nH / nKv);
  const int i0 = blockIdx.x * TQ, iEnd = min(T, i0 + TQ);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long qs = (long long)nH * HD, ks = (long long)nKv * HD;
  const ${ctype(p.q)}* qb = q + ((long long)b * T * nH + h) * HD;
  const ${ctype(p.k)}* kb = k + ((long long)b * T * nKv + kvh) * HD;
  const ${ctype(p.v)}* vb = v + ((long long)b * T * nKv + kvh) * HD;
  loadRows(Qs, qb, qs, i0, TQ, T);
  float m[RPW], l[RPW], acc[RPW][DCH];
#pragma unroll
  for (int rr = 0; rr < RPW; rr++) {
    m[rr] = NEG_INF; l[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < DCH; c++) acc[rr][c] = 0.0f;
  }
  int st[RPW]; /* each row's first key (its document's first row; 0 without documents) */
#pragma unroll
  for (int rr = 0; rr < RPW; rr++) st[rr] = docStart(docPos, b, T, i0 + warp * RPW + rr);
  /* key tiles from the one holding the tile's first row's first key (the smallest) up to the tile's last row only
     (causal: tiles above the diagonal are skipped) */
  for (int j0 = docStart(docPos, b, T, i0) / KT * KT; j0 < iEnd; j0 += KT) {
    __syncthreads(); /* the Q tile is loaded; the previous V tile is no longer read */
    loadRows(KV, kb, ks, j0, KT, T);
    __syncthreads();
    float s[RPW];
    rowDots(s, Qs, KV, warp, lane);
    const int j = j0 + lane;
    float pr[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
      const int i = i0 + warp * RPW + rr;
      const bool ok = j <= i && j < T && j >= st[rr];
      const float sc = ok ? s[rr] * SCALE : NEG_INF;
      /* a row's first tile may hold none of its keys (documents): its max stays -inf until one does */
      const float mn = fmaxf(m[rr], warpMax(sc));
      const float alpha = mn == NEG_INF ? 1.0f : expf(m[rr] - mn); /* exp(-inf) = 0 on a row's first tile with a key */
      pr[rr] = ok ? expf(sc - mn) : 0.0f;
      l[rr] = l[rr] * alpha + warpSum(pr[rr]);
      m[rr] = mn;
#pragma unroll
      for (int c = 0; c < DCH; c++) acc[rr][c] *= alpha;
    }
    __syncthreads(); /* every warp is done with the K tile */
    loadRows(KV, vb, ks, j0, KT, T);
    __syncthreads();
    addShuffledRows(acc, pr, KV, lane);
  }
  float* lb = lse + ((long long)b * nH + h) * T;
#pragma unroll
  for (int rr = 0; rr < RPW; rr++) {
    const int i = i0 + warp * RPW + rr;
    if (i < T) {
      const float inv = 1.0f / l[rr];
      const long long oi = ((long long)b * T + i) * qs + (long long)h * HD;
#pragma unroll
      for (int dc = 0; dc < DCH; dc++) {
        int d = lane + 32 * dc;
        if (d < HD) stf(out, oi + d, acc[rr][dc] * inv);
      }
      if (lane == 0) lb[i] = m[rr] + logf(l[rr]);
    }
  }
}
`,
});

/**
 * Rows of attention_bwd_pre one warp takes at a time: with bf16 dout and out and a head dim of 8·2^k (8 to 256), a row is
 * HD/8 lanes each loading 16 bytes of both, so 256/HD rows a warp; else 1 (a warp per row, lane d taking d, d + 32, ...).
 * The launch sizes its grid by it: blocksFor(ceil(rows / this)·32, block).
 */
export function attnPreRowsPerWarp(p: { headDim: number; dout: Dt; out: Dt }): number {
  const lanes = p.headDim / 8;
  const pow2 = Number.isInteger(lanes) && lanes >= 1 && lanes <= 32 && (lanes & (lanes - 1)) === 0;
  return p.dout === 'bf16' && p.out === 'bf16' && pow2 ? 32 / lanes : 1;
}

/**
 * Grid-stride over the rows' (b, t, h) index: D[(b·nH + h)·T + t] = Σ_d dout·out over the row's head dims. The first
 * stage of the backward. A warp per row (grid blocksFor(rows·32, block)): lane d sums d, d + 32, ..., then a fixed-order
 * warp sum. Where attnPreRowsPerWarp > 1 (bf16 operands, HD = 8·2^k) and both operands are 16-byte aligned (checked at
 * run time, uniform over the grid): HD/8 lanes a row, each summing its 8 consecutive products in order, then a
 * fixed-order shuffle sum over the row's lanes (grid blocksFor(ceil(rows / RPW)·32, block)). Both deterministic; the two
 * orders round differently. The one-warp-a-row form moved 29 MB in 24.9 us at the 0.5B student's 8 x 1024 on an H100
 * (1.2 TB/s: 2-byte loads, one row a warp).
 */
export const attentionBackwardPre = defineFamily<AttnP & { dout: Dt; out: Dt }>({
  name: 'attention_bwd_pre', schema: { ...schema, dout: DTYPE_DOMAIN, out: DTYPE_DOMAIN },
  example: { headDim: 64, block: 256, dout: 'f32', out: 'f32' },
  generate: (p) => {
    const rpw = attnPreRowsPerWarp(p);
    const vec = rpw === 1 ? '' : `
  /* ${rpw} rows a warp: ${32 / rpw} lanes a row, 8 bf16 of dout and of out each (16-byte loads) */
  if (((reinterpret_cast<unsigned long long>(dout) | reinterpret_cast<unsigned long long>(out)) & 15) == 0) {
    const int sub = lane % ${32 / rpw}, slot = lane / ${32 / rpw};
    const long long warps = ((long long)gridDim.x * BLOCK) >> 5;
    for (long long r0 = (((long long)blockIdx.x * BLOCK + threadIdx.x) >> 5) * ${rpw}; r0 < rows; r0 += warps * ${rpw}) {
      const long long r = r0 + slot;
      float s = 0.0f;
      if (r < rows) {
        float a[8], c[8];
        ld8(dout + r * HD, sub, a);
        ld8(out + r * HD, sub, c);
#pragma unroll
        for (int e = 0; e < 8; e++) s += a[e] * c[e];
      }
      /* r0 is the same for the warp's lanes, so every lane reaches the shuffles */
#pragma unroll
      for (int o = ${32 / rpw / 2}; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (sub == 0 && r < rows) dsum[dsumIndex(r, T, nH)] = s;
    }
    return;
  }`;
    return `${attentionPrelude(p)}${rpw === 1 ? '' : LD8_HELPERS}
/* the D scratch's slot [b][h][t] of row r, whose rows are (b, t, h) in order */
__device__ __forceinline__ long long dsumIndex(long long r, int T, int nH) {
  const int h = (int)(r % nH);
  const long long bt = r / nH;
  return ((bt / T) * nH + h) * T + (int)(bt % T);
}
extern "C" __global__ void attention_bwd_pre(float* dsum, const ${ctype(p.dout)}* dout, const ${ctype(p.out)}* out, long long rows,
                                             int T, int nH) {
  const int lane = threadIdx.x & 31;${vec}
  const long long step = ((long long)gridDim.x * BLOCK) >> 5;
  /* r is the same for the 32 lanes of a warp (BLOCK is a multiple of 32), so the loop is warp-uniform */
  for (long long r = ((long long)blockIdx.x * BLOCK + threadIdx.x) >> 5; r < rows; r += step) {
    float s = 0.0f;
    for (int d = lane; d < HD; d += 32) s += ldf(dout, r * HD + d) * ldf(out, r * HD + d);
    s = warpSum(s);
    if (lane == 0) dsum[dsumIndex(r, T, nH)] = s;
  }
}
`;
  },
});

/**
 * Grid (ceil(T / attnQueryTile('dq')), nH, B), dynamic shared memory attnTile('dq').smem.
 * dq += scale · Σ_j dS_ij k_j with P_ij = exp(scale·q_i·k_j − lse_i), dS_ij = P_ij (dout_i·v_j − D_i).
 */
export const attentionBackward = defineFamily<AttnP & { dq: Dt; dout: Dt; q: Dt; k: Dt; v: Dt }>({
  name: 'attention_bwd',
  schema: { ...trainSchema, dq: DTYPE_DOMAIN, dout: DTYPE_DOMAIN, q: DTYPE_DOMAIN, k: DTYPE_DOMAIN, v: DTYPE_DOMAIN },
  example: { headDim: 64, block: 128, dq: 'f32', dout: 'f32', q: 'f32', k: 'f32', v: 'f32' },
  generate: (p) => `${tiledPrelude(p, 'dq')}
extern "C" __global__ void attention_bwd(${ctype(p.dq)}* dq, const float* dsum, const float* lse, const ${ctype(p.dout)}* dout,
    const ${ctype(p.q)}* q, const ${ctype(p.k)}* k, const ${ctype(p.v)}* v, int T, int nH, int nKv, const int* docPos) {
  extern __shared__ float smem[];
  float* Qs = smem;            /* [TQ][HDP] */
  float* Ds = Qs + TQ * HDP;   /* [TQ][HDP] dout rows */
  float* KV = Ds + TQ * HDP;   /* [KT][HDP]: the V tile, then the K tile */
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (nH / nKv);
  const int i0 = blockIdx.x * TQ, iEnd = min(T, i0 + TQ);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long qs = (long long)nH * HD, ks = (long long)nKv * HD;
  const ${ctype(p.k)}* kb = k + ((long long)b * T * nKv + kvh) * HD;
  const ${ctype(p.v)}* vb = v + ((long long)b * T * nKv + kvh) * HD;
  const float* lb = lse + ((long long)b * nH + h) * T;
  const float* db = dsum + ((long long)b * nH + h) * T;
  loadRows(Qs, q + ((long long)b * T * nH + h) * HD, qs, i0, TQ, T);
  loadRows(Ds, dout + ((long long)b * T * nH + h) * HD, qs, i0, TQ, T);
  float lr[RPW], dr[RPW], acc[RPW][DCH];
  int st[RPW];
#pragma unroll
  for (int rr = 0; rr < RPW; rr++) {
    const int i = i0 + warp * RPW + rr;
    lr[rr] = i < T ? lb[i] : 0.0f;
    dr[rr] = i < T ? db[i] : 0.0f;
    st[rr] = docStart(docPos, b, T, i);
#pragma unroll
    for (int c = 0; c < DCH; c++) acc[rr][c] = 0.0f;
  }
  for (int j0 = docStart(docPos, b, T, i0) / KT * KT; j0 < iEnd; j0 += KT) {
    __syncthreads(); /* Q and dout tiles loaded; the previous K tile is no longer read */
    loadRows(KV, vb, ks, j0, KT, T);
    __syncthreads();
    float dp[RPW];
    rowDots(dp, Ds, KV, warp, lane);
    __syncthreads(); /* every warp is done with the V tile */
    loadRows(KV, kb, ks, j0, KT, T);
    __syncthreads();
    float s[RPW];
    rowDots(s, Qs, KV, warp, lane);
    const int j = j0 + lane;
    float ds[RPW];
#pragma unroll
    for (int rr = 0; rr < RPW; rr++) {
      const int i = i0 + warp * RPW + rr;
      const float pv = (i < T && j <= i && j >= st[rr]) ? expf(s[rr] * SCALE - lr[rr]) : 0.0f;
      ds[rr] = pv * (dp[rr] - dr[rr]) * SCALE;
    }
    addShuffledRows(acc, ds, KV, lane);
  }
#pragma unroll
  for (int rr = 0; rr < RPW; rr++) {
    const int i = i0 + warp * RPW + rr;
    if (i < T) {
      const long long qi = ((long long)b * T + i) * qs + (long long)h * HD;
#pragma unroll
      for (int dc = 0; dc < DCH; dc++) {
        int d = lane + 32 * dc;
        if (d < HD) stf(dq, qi + d, ldf(dq, qi + d) + acc[rr][dc]);
      }
    }
  }
}
`,
});

/**
 * Grid (ceil(T / ATTN_KEY_TILE), nKv·S, B), dynamic shared memory attnTile('dkv').smem. For the block's 32 keys of
 * one kv head: dk += Σ_{h in its split of the group, i ≥ j} dS_ij q_i, dv += Σ P_ij dout_i, with P recomputed from
 * q·k and lse and dS from dout·v and D. S splits the kv head's query-head group across blocks: S = 1 adds into
 * dk/dv directly; S > 1 writes per-split partials to `part` and attention_dkv_reduce adds them in split order.
 */
export const attentionBackwardKv = defineFamily<AttnP & { dk: Dt; dv: Dt; dout: Dt; q: Dt; k: Dt; v: Dt }>({
  name: 'attention_bwd_dkv',
  schema: { ...trainSchema, dk: DTYPE_DOMAIN, dv: DTYPE_DOMAIN, dout: DTYPE_DOMAIN, q: DTYPE_DOMAIN, k: DTYPE_DOMAIN, v: DTYPE_DOMAIN },
  example: { headDim: 64, block: 128, dk: 'f32', dv: 'f32', dout: 'f32', q: 'f32', k: 'f32', v: 'f32' },
  generate: (p) => `${tiledPrelude(p, 'dkv')}
#define KPW (KT / NW)
extern "C" __global__ void attention_bwd_dkv(${ctype(p.dk)}* dk, ${ctype(p.dv)}* dv, float* part, const float* dsum,
    const float* lse, const ${ctype(p.dout)}* dout, const ${ctype(p.q)}* q, const ${ctype(p.k)}* k, const ${ctype(p.v)}* v,
    int T, int nH, int nKv, const int* docPos) {
  extern __shared__ float smem[];
  float* Ks = smem;               /* [KT][HDP] */
  float* Vs = Ks + KT * HDP;      /* [KT][HDP] */
  float* Qs = Vs + KT * HDP;      /* [TQ][HDP] */
  float* Ds = Qs + TQ * HDP;      /* [TQ][HDP] dout rows */
  float* Ps = Ds + TQ * HDP;      /* [TQ][KT + 1] */
  float* Ss = Ps + TQ * (KT + 1); /* [TQ][KT + 1] dS */
  /* blockIdx.y = kvh·S + s: split s of S walks query heads [g0, g1) of the kv head's group */
  const int G = nH / nKv, S = gridDim.y / nKv, kvh = blockIdx.y / S, s = blockIdx.y - kvh * S, b = blockIdx.z;
  const int g0 = s * G / S, g1 = (s + 1) * G / S;
  const int j0 = blockIdx.x * KT;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const long long qs = (long long)nH * HD, ks = (long long)nKv * HD;
  loadRows(Ks, k + ((long long)b * T * nKv + kvh) * HD, ks, j0, KT, T);
  loadRows(Vs, v + ((long long)b * T * nKv + kvh) * HD, ks, j0, KT, T);
  float adk[KPW][DCH], adv[KPW][DCH];
#pragma unroll
  for (int kk = 0; kk < KPW; kk++) {
#pragma unroll
    for (int c = 0; c < DCH; c++) { adk[kk][c] = 0.0f; adv[kk][c] = 0.0f; }
  }
  const int j = j0 + lane;
  for (int g = g0; g < g1; g++) {
    const int h = kvh * G + g;
    const ${ctype(p.q)}* qb = q + ((long long)b * T * nH + h) * HD;
    const ${ctype(p.dout)}* db = dout + ((long long)b * T * nH + h) * HD;
    const float* lb = lse + ((long long)b * nH + h) * T;
    const float* sb = dsum + ((long long)b * nH + h) * T;
    /* only query rows i >= j0 see any of the block's keys; with documents, none past the rows whose document starts
       after the block's last key (a tile's first row has its smallest start) */
    for (int i0 = j0; i0 < T && docStart(docPos, b, T, i0) <= j0 + KT - 1; i0 += TQ) {
      __syncthreads(); /* K and V tiles loaded; the previous Q, dout, P and dS tiles are no longer read */
      loadRows(Qs, qb, qs, i0, TQ, T);
      loadRows(Ds, db, qs, i0, TQ, T);
      __syncthreads();
      float dp[RPW], sc[RPW];
#pragma unroll
      for (int rr = 0; rr < RPW; rr++) { dp[rr] = 0.0f; sc[rr] = 0.0f; }
      for (int d = 0; d < HD; d++) {
        const float vv = Vs[lane * HDP + d], kv = Ks[lane * HDP + d];
#pragma unroll
        for (int rr = 0; rr < RPW; rr++) {
          const int r = warp * RPW + rr;
          dp[rr] += Ds[r * HDP + d] * vv;
          sc[rr] += Qs[r * HDP + d] * kv;
        }
      }
#pragma unroll
      for (int rr = 0; rr < RPW; rr++) {
        const int r = warp * RPW + rr, i = i0 + r;
        const bool ok = i < T && j <= i && j >= docStart(docPos, b, T, i);
        const float pv = ok ? expf(sc[rr] * SCALE - lb[i]) : 0.0f;
        Ps[r * (KT + 1) + lane] = pv;
        Ss[r * (KT + 1) + lane] = ok ? pv * (dp[rr] - sb[i]) * SCALE : 0.0f;
      }
      __syncthreads();
      /* dk, dv: the warp's KPW keys, lane owns d = lane + 32·c; query rows in order */
      for (int r = 0; r < TQ; r++) {
#pragma unroll
        for (int dc = 0; dc < DCH; dc++) {
          const int d = lane + 32 * dc;
          if (d < HD) {
            const float dov = Ds[r * HDP + d], qv = Qs[r * HDP + d];
#pragma unroll
            for (int kk = 0; kk < KPW; kk++) {
              adv[kk][dc] += Ps[r * (KT + 1) + warp * KPW + kk] * dov;
              adk[kk][dc] += Ss[r * (KT + 1) + warp * KPW + kk] * qv;
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int kk = 0; kk < KPW; kk++) {
    const int jj = j0 + warp * KPW + kk;
    if (jj < T) {
      if (S == 1) {
        const long long off = ((long long)b * T + jj) * ks + (long long)kvh * HD;
#pragma unroll
        for (int dc = 0; dc < DCH; dc++) {
          const int d = lane + 32 * dc;
          if (d < HD) { stf(dk, off + d, ldf(dk, off + d) + adk[kk][dc]); stf(dv, off + d, ldf(dv, off + d) + adv[kk][dc]); }
        }
      } else {
        /* partials [b][kvh][s][j][HD] (dk), then the same again for dv; attention_dkv_reduce sums s in order */
        const long long half = (long long)gridDim.z * gridDim.y * T * HD;
        const long long po = ((((long long)b * nKv + kvh) * S + s) * T + jj) * HD;
#pragma unroll
        for (int dc = 0; dc < DCH; dc++) {
          const int d = lane + 32 * dc;
          if (d < HD) { part[po + d] = adk[kk][dc]; part[half + po + d] = adv[kk][dc]; }
        }
      }
    }
  }
}
`,
});

/** A family that bakes only its block (and dtypes). */
export type AttnBlockP = { block: number };
type BlockP = AttnBlockP;

/**
 * Grid-stride over n = B·T·nKv·hd elements of dk/dv ([b][j][kvh][d]): dk += Σ_{s<S} part_dk[b][kvh][s][j][d],
 * dv likewise (part_dv follows part_dk), s in order: the fixed-order second stage of attention_bwd_dkv with S > 1.
 * With hd a multiple of 4 (a runtime branch, uniform over the grid), a thread takes four consecutive head dims with
 * 16-byte loads (the partials scratch is 16-byte aligned); each element's sum is the same either way.
 * Baked `accumulate` false: dk = Σ ..., dv = Σ ... (overwritten, the old values never read).
 */
export const attentionDkvReduce = defineFamily<BlockP & { dk: Dt; dv: Dt; accumulate: boolean }>({
  name: 'attention_dkv_reduce', schema: { block: BLOCK_DOMAIN, dk: DTYPE_DOMAIN, dv: DTYPE_DOMAIN, accumulate: { kind: 'bool' } },
  example: { block: 256, dk: 'f32', dv: 'f32', accumulate: true },
  generate: (p) => `#define BLOCK ${p.block}
${dtypeHelpers()}
extern "C" __global__ void attention_dkv_reduce(${ctype(p.dk)}* dk, ${ctype(p.dv)}* dv, const float* part, long long n, int T, int nKv,
                                                int S, int hd) {
  const long long half = n * S;
  if ((hd & 3) == 0) {
    /* four head dims a thread (16-byte loads of each split's partials; hd, and so every row, a multiple of 4), each
       summed over s in the same order as one at a time: the same values */
    const int hd4 = hd >> 2;
    const long long st4 = (long long)T * hd4;
    const float4* p4 = (const float4*)part;
    const float4* q4 = (const float4*)(part + half);
    for (long long i4 = (long long)blockIdx.x * BLOCK + threadIdx.x; i4 < (n >> 2); i4 += (long long)gridDim.x * BLOCK) {
      const int d4 = (int)(i4 % hd4);
      long long r = i4 / hd4;
      const int kvh = (int)(r % nKv);
      r /= nKv;
      const int j = (int)(r % T);
      const long long b = r / T;
      const long long base = (((b * nKv + kvh) * S) * T + j) * hd4 + d4;
      float4 sk = make_float4(0.0f, 0.0f, 0.0f, 0.0f), sv = sk;
      for (int s = 0; s < S; s++) {
        const float4 x = p4[base + s * st4], y = q4[base + s * st4];
        sk.x += x.x; sk.y += x.y; sk.z += x.z; sk.w += x.w;
        sv.x += y.x; sv.y += y.y; sv.z += y.z; sv.w += y.w;
      }
      const long long i = 4 * i4;
      stf(dk, i, ${p.accumulate ? 'ldf(dk, i) + ' : ''}sk.x); stf(dk, i + 1, ${p.accumulate ? 'ldf(dk, i + 1) + ' : ''}sk.y);
      stf(dk, i + 2, ${p.accumulate ? 'ldf(dk, i + 2) + ' : ''}sk.z); stf(dk, i + 3, ${p.accumulate ? 'ldf(dk, i + 3) + ' : ''}sk.w);
      stf(dv, i, ${p.accumulate ? 'ldf(dv, i) + ' : ''}sv.x); stf(dv, i + 1, ${p.accumulate ? 'ldf(dv, i + 1) + ' : ''}sv.y);
      stf(dv, i + 2, ${p.accumulate ? 'ldf(dv, i + 2) + ' : ''}sv.z); stf(dv, i + 3, ${p.accumulate ? 'ldf(dv, i + 3) + ' : ''}sv.w);
    }
    return;
  }
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
    stf(dk, i, ${p.accumulate ? 'ldf(dk, i) + ' : ''}sk);
    stf(dv, i, ${p.accumulate ? 'ldf(dv, i) + ' : ''}sv);
  }
}
`,
});
