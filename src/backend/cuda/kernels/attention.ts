/**
 * Causal grouped-query attention kernels: flash-style training forward (saves the log-sum-exp of each query row,
 * never probabilities), its backward (a D = rowsum(dout ∘ out) pass, then dQ per query tile and dK/dV per key
 * tile, recomputing P = exp(S − lse)), the KV-cache write and cached (inference) attention. Baked: headDim (and
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
 * attention_dkv_reduce (below) and the D scratch layout. The KV-cache write and cached (inference) attention are below too.
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

type AttnP = { headDim: number; block: number };
/** An operand dtype ('f32' | 'bf16'): baked, so it is in the source and the cache key. */
type Dt = 'f32' | 'bf16';
const schema = { headDim: { kind: 'int', min: 1, max: 1024 }, block: BLOCK_DOMAIN } as const;
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

function prelude(p: Readonly<AttnP>): string {
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
    return `${prelude(p)}${rpw === 1 ? '' : LD8_HELPERS}
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

type BlockP = { block: number };

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

/**
 * Grid-stride over B·t·rowElems. cache[b, pos0+tt, :] = src[b, tt, :] with rowElems = nKv·hd; with `seqPos`, sequence b
 * starts at seqPos[b] (batched generation of prompts of different lengths) instead of pos0.
 */
export const kvCacheWrite = defineFamily<BlockP & { cache: Dt; src: Dt; seqPos: boolean }>({
  name: 'kv_cache_write', schema: { block: BLOCK_DOMAIN, cache: DTYPE_DOMAIN, src: DTYPE_DOMAIN, seqPos: { kind: 'bool' } },
  example: { block: 256, cache: 'f32', src: 'f32', seqPos: false },
  generate: (p) => `#define BLOCK ${p.block}
${dtypeHelpers()}
extern "C" __global__ void kv_cache_write(${ctype(p.cache)}* cache, const ${ctype(p.src)}* src, int B, int t, int pos0, int tMax,
                                          int rowElems${p.seqPos ? ', const int* seqPos' : ''}) {
  long long total = (long long)B * t * rowElems;
  for (long long idx = (long long)blockIdx.x * BLOCK + threadIdx.x; idx < total; idx += (long long)gridDim.x * BLOCK) {
    int e = (int)(idx % rowElems);
    long long bt = idx / rowElems;
    int tt = (int)(bt % t);
    long long b = bt / t;
    stf(cache, (b * tMax + ${p.seqPos ? 'seqPos[b]' : 'pos0'} + tt) * rowElems + e, ldf(src, idx));
  }
}
`,
});

/**
 * Grid (t, nH, B). Queries at positions pos0..pos0+t-1 attend to cache rows 0..pos0+i; with `seqPos`, sequence b's
 * queries are at seqPos[b]..seqPos[b]+t-1 (batched generation of prompts of different lengths). Each warp takes every
 * NW-th cache row (a row's head dims across the lanes, DCH a lane: the row read whole by the warp), UN rows a round
 * whose keys and values are all loaded before the first score is reduced (UN loads in flight, not one), with an online
 * softmax of its own; the warps' maxima, sums and weighted values are then merged, threads over the head dims. A decode
 * step is B·nH blocks: the backend gives them many warps (cachedAttentionBlock), each a short walk over the cache.
 */
export const attentionCached = defineFamily<AttnP & { out: Dt; q: Dt; kc: Dt; vc: Dt; seqPos: boolean }>({
  name: 'attention_cached', schema: { ...schema, out: DTYPE_DOMAIN, q: DTYPE_DOMAIN, kc: DTYPE_DOMAIN, vc: DTYPE_DOMAIN, seqPos: { kind: 'bool' } },
  example: { headDim: 64, block: 128, out: 'f32', q: 'f32', kc: 'f32', vc: 'f32', seqPos: false },
  generate: (p) => `${prelude(p)}
#define NW (BLOCK / 32)
#define DCH ((HD + 31) / 32)
#define UN 4
extern "C" __global__ void attention_cached(${ctype(p.out)}* out, const ${ctype(p.q)}* q, const ${ctype(p.kc)}* kc,
                                            const ${ctype(p.vc)}* vc, int t, int pos0, int tMax, int nH, int nKv${p.seqPos ? ', const int* seqPos' : ''}) {
  int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  int kvh = h / (nH / nKv);
  int L = ${p.seqPos ? 'seqPos[b]' : 'pos0'} + i + 1;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  __shared__ float wm[NW], wl[NW];
  __shared__ float wacc[NW][HD];
  const long long qoff = (((long long)b * t + i) * nH + h) * HD;
  float qv[DCH], acc[DCH];
  for (int c = 0; c < DCH; c++) {
    int d = lane + 32 * c;
    qv[c] = d < HD ? ldf(q, qoff + d) : 0.0f;
    acc[c] = 0.0f;
  }
  float m = NEG_INF, l = 0.0f;
  for (int j0 = w; j0 < L; j0 += NW * UN) {
    float s[UN], vr[UN][DCH];
    // the round's rows (warp-uniform: j depends on the warp alone): every load issued, then the reductions
    for (int u = 0; u < UN; u++) {
      int j = j0 + u * NW;
      float x = 0.0f;
      for (int c = 0; c < DCH; c++) vr[u][c] = 0.0f;
      if (j < L) {
        const long long kj = (((long long)b * tMax + j) * nKv + kvh) * HD;
        for (int c = 0; c < DCH; c++) {
          int d = lane + 32 * c;
          if (d < HD) { x += qv[c] * ldf(kc, kj + d); vr[u][c] = ldf(vc, kj + d); }
        }
      }
      s[u] = x;
    }
    float mn = m;
    for (int u = 0; u < UN; u++) {
      s[u] = warpSum(s[u]) * SCALE;
      if (j0 + u * NW < L) mn = fmaxf(mn, s[u]);
    }
    float corr = expf(m - mn);
    l *= corr;
    for (int c = 0; c < DCH; c++) acc[c] *= corr;
    for (int u = 0; u < UN; u++) {
      if (j0 + u * NW >= L) break;
      float pj = expf(s[u] - mn);
      l += pj;
      for (int c = 0; c < DCH; c++) acc[c] += pj * vr[u][c];
    }
    m = mn;
  }
  if (lane == 0) { wm[w] = m; wl[w] = l; }
  for (int c = 0; c < DCH; c++) {
    int d = lane + 32 * c;
    if (d < HD) wacc[w][d] = acc[c];
  }
  __syncthreads();
  float M = NEG_INF;
  for (int k = 0; k < NW; k++) M = fmaxf(M, wm[k]);
  float den = 0.0f;
  for (int k = 0; k < NW; k++) if (wl[k] != 0.0f) den += wl[k] * expf(wm[k] - M);
  for (int d = threadIdx.x; d < HD; d += BLOCK) {
    float a = 0.0f;
    for (int k = 0; k < NW; k++) if (wl[k] != 0.0f) a += wacc[k][d] * expf(wm[k] - M);
    stf(out, qoff + d, a / den);
  }
}
`,
});

/**
 * attention_cached's block: 16 warps for head dims up to 128 (a decode step has only B·nH blocks, and each warp's walk
 * over the cache is a chain of dependent rounds: more warps, shorter chains), else 4 (its shared sums are NW·HD floats).
 */
export function cachedAttentionBlock(headDim: number): number { return headDim <= 128 ? 512 : 128; }

/** How attention_cached_gqa is laid out for one head shape: baked (the source depends on each). See cachedAttentionPlan. */
export interface CachedAttnPlan {
  /** Threads a block (NW = block/32 warps). */
  block: number;
  /** Elements a lane loads at once: 8 (16-byte loads of bf16, two of f32) when the rows allow it, else 1. */
  vec: number;
  /** Cache rows a row slot loads before reducing any (loads in flight). */
  un: number;
}

/**
 * Floats a thread may keep for its query heads, accumulators and rows in flight (the rest of 255 registers is addressing).
 * Measured on an H200 with split grids (bench/attention-cached.ts, bf16, batch 64 at 256 / 1024 / 4096 rows): this budget
 * (1 row in flight a slot for Qwen2.5-0.5B's 14/2 heads and 1.5B's 12/2, 2 for Llama-3-8B's 32/8) took 16.8 / 38.1 /
 * 137 us, 22.7 / 68.2 / 242 and 44.0 / 151 (1024 rows); 4 rows everywhere took 22.2 / 45.6 / 159, 29.2 / 84.6 / 280 and
 * 68.3 / 237 (more registers, fewer blocks an SM). Grids of few blocks prefer 4: CACHED_SMALL_GRID.
 */
const CACHED_FLOATS = 128;
/**
 * A grid of at most this many blocks (fewer than an H100 SXM's or H200's 132 SMs; about one an SM on an A100's 108 or an
 * H100 PCIe's 114) is small: its SMs hold a block each, so a block's own rows in flight are what hides the loads, and its
 * threads may keep CACHED_FLOATS_SMALL floats. H200,
 * bench/attention-cached.ts --sweep, batch 1 (32 blocks for 2 KV heads split 16 ways, 128 for 8), us at 256 / 1024 / 4096
 * rows (docs/measurements/generation/gpu-2026-11-30-h200-s54-attention-cached-sweep.txt): Qwen2.5-1.5B's 12/2 heads
 * 12.6 / 15.6 / 32.4 with 1 row in flight a slot against 10.2 / 13.2 / 23.1 with 4, Qwen2.5-0.5B's 14/2 10.2 / 12.9 /
 * 22.1 against 9.9 / 12.6 / 16.7, Llama-3-8B's 32/8 9.0 / 11.5 / 20.8 (2 rows) against 8.5 / 11.2 / 18.6; at 256 blocks
 * and more the budget above wins (Qwen2.5-0.5B, batch 8: 14.8 / 25.6 us at 1024 / 4096 rows against 19.7 / 28.4).
 */
export const CACHED_SMALL_GRID = 128;
/** 255 registers less the 32 CACHED_FLOATS's budget leaves for addressing. */
const CACHED_FLOATS_SMALL = 255 - 32;
/** Shared memory of attention_cached_gqa's merge (each warp's maxima, sums and weighted values per query head). */
const CACHED_SMEM = 32 * 1024;

function cachedLanes(headDim: number, vec: number): { r: number; ch: number } {
  const nch = Math.ceil(headDim / vec);
  let r = 1;
  while (r < nch && r < 32) r *= 2;
  return { r, ch: Math.ceil(nch / r) };
}

/**
 * attention_cached_gqa's layout for head dim `headDim` and `group` query heads a KV head, its rows `aligned` to 16 bytes (q's
 * and the caches' offsets, so row offsets, multiples of 8 elements, stay aligned), launched over `gridBlocks` blocks: lanes
 * load 8 elements at once where they can; rows in flight (un) and warps (block) are as many as fit CACHED_FLOATS a thread
 * (CACHED_FLOATS_SMALL in a grid of at most CACHED_SMALL_GRID blocks), one block in a 64k register file and the merge in
 * CACHED_SMEM.
 */
export function cachedAttentionPlan(headDim: number, group: number, aligned: boolean, gridBlocks = Infinity): CachedAttnPlan {
  const vec = aligned && headDim % 8 === 0 ? 8 : 1;
  const { ch } = cachedLanes(headDim, vec);
  const cv = ch * vec, fixed = 2 * group * cv + 2 * group;
  const budget = gridBlocks <= CACHED_SMALL_GRID ? CACHED_FLOATS_SMALL : CACHED_FLOATS;
  let un = 4;
  while (un > 1 && fixed + un * (2 * cv + group) > budget) un /= 2;
  const regs = Math.min(255, fixed + un * (2 * cv + group) + 32);
  let nw = 16;
  while (nw > 1 && (nw * 32 * regs > 65536 || nw * group * (headDim + 2) * 4 > CACHED_SMEM)) nw /= 2;
  return { block: nw * 32, vec, un };
}

/**
 * Counters at the head of cached attention's split scratch (ints, zero between calls), one per block of an unsplit grid;
 * a grid of fewer blocks than this splits (cachedAttentionSplits), so every split call has a counter.
 */
export const CACHED_COUNTERS = 256;
/** Cache rows a split takes at least (of the cache's capacity; the rows are split by the length at run time). */
const CACHED_MIN_ROWS = 64;
/** The most splits a call takes (cachedAttentionSplits; the merge's shared arrays are sized by it). */
export const CACHED_MAX_SPLITS = 16;

/**
 * Into how many blocks attention_cached_gqa splits each (query row, KV head)'s cache rows: enough that the grid has about
 * CACHED_COUNTERS blocks (a decode step of few sequences and KV heads has a block or so per SM, each a long walk),
 * at most one per CACHED_MIN_ROWS of the cache's capacity tMax and CACHED_MAX_SPLITS. A function of the call's shape
 * alone: the cache's length is on the device (seqPos) and changes every step of a captured decode loop.
 */
export function cachedAttentionSplits(b: number, t: number, nKv: number, tMax: number): number {
  const blocks = b * t * nKv;
  if (blocks >= CACHED_COUNTERS) return 1;
  return Math.max(1, Math.min(Math.ceil(CACHED_COUNTERS / blocks), Math.ceil(tMax / CACHED_MIN_ROWS), CACHED_MAX_SPLITS));
}

/**
 * Which cached attention a call launches: attention_cached_gqa (each cache row read once for the GQA group; a short grid
 * split over blocks) when the call has CACHED_GQA_MIN_BLOCKS (query row, KV head) pairs or more, when a GQA group (2 or
 * more) reads a cache of CACHED_GQA_LONG_ROWS rows or more (tMax, the capacity: the length is on the device and runs from
 * the prompt's up to it), or of CACHED_GQA_SMALL_GROUP_ROWS at a group of 2 to CACHED_GQA_SMALL_GROUP; else
 * attention_cached (a block per query head, each reading its rows), as for groups past CACHED_GQA_MAX_GROUP. The
 * sequences and rows of a call change within a run (a last, shorter group of prompts), so a trace plans both kernels,
 * and both of the group kernel's layouts (cachedAttentionPlan), for every call (CudaBackend). Measured on an H200
 * (bench/attention-cached.ts, bf16, us a call at 256 / 512 / 1024 / 4096 cache rows;
 * docs/measurements/generation/gpu-2026-11-30-h200-s53-attention-cached-long.txt): Qwen2.5-0.5B's 14/2 heads at batch 8
 * (16 pairs), attention_cached 7.1 / 10.2 / 16.6 / 55.2 against attention_cached_gqa 10.5 / 11.6 / 15.3 / 25.9 (the
 * split kernel's fixed cost loses at short caches, its single read of each row wins at long ones); that model's decode
 * steps at batch 8 with a 1024-row cache took 1.27 ms against 1.19 (head / group kernel), with 384 rows 1.10 against 1.14;
 * at 64 pairs (Qwen3-0.6B at batch 8) 8.9 / - / 23.9 / 145 against 7.6 / 9.6 / 13.9 / 56.6.
 */
export const CACHED_GQA_MIN_BLOCKS = 64;
/** The cache capacity from which attention_cached_gqa runs at any number of pairs (see cachedAttentionKernel). */
export const CACHED_GQA_LONG_ROWS = 1024;
/** The largest GQA group attention_cached_gqa takes (its registers and merge grow with the group; past it, attention_cached). */
export const CACHED_GQA_MAX_GROUP = 16;
/**
 * GQA groups up to this one take attention_cached_gqa at any number of pairs from a cache of CACHED_GQA_SMALL_GROUP_ROWS
 * rows: its fixed cost grows with the group (the heads' chains of a row are a thread's), and at a group of 2 a block reads
 * each row once for two heads where attention_cached's block per head reads it twice. H200, bench/attention-cached.ts
 * --capacity=512 (docs/measurements/generation/gpu-2026-11-30-h200-s54-attention-cached-group2.txt), us at 64 / 128 /
 * 256 / 512 rows of a 512-row cache, batch 1: Qwen3-0.6B's 16/8 heads 4.7 / 6.0 / 8.7 / 13.5 against 5.9 / 6.2 / 6.4 /
 * 7.2 (attention_cached / the group kernel; batch 4 alike), Llama-3-8B's 32/8 (group 4) 4.8 / 6.0 / 8.6 / 13.6 against
 * 7.7 / 8.0 / 8.3 / 10.1, Qwen2.5-0.5B's 14/2 (group 7) 4.2 / 5.1 / 6.7 / 9.9 against 8.9 / 9.2 / 9.8 / 11.1.
 */
export const CACHED_GQA_SMALL_GROUP = 2;
/** The cache capacity from which a group up to CACHED_GQA_SMALL_GROUP takes attention_cached_gqa at any number of pairs. */
export const CACHED_GQA_SMALL_GROUP_ROWS = 256;
export function cachedAttentionKernel(b: number, t: number, nKv: number, group: number, tMax: number): 'head' | 'gqa' {
  if (group > CACHED_GQA_MAX_GROUP) return 'head';
  // the capacity rules for GQA groups only: at a group of 1 (no GQA) neither kernel was measured against the other there
  if (group >= 2 && tMax >= (group <= CACHED_GQA_SMALL_GROUP ? CACHED_GQA_SMALL_GROUP_ROWS : CACHED_GQA_LONG_ROWS)) return 'gqa';
  return b * t * nKv >= CACHED_GQA_MIN_BLOCKS ? 'gqa' : 'head';
}

/**
 * Static shared memory of attention_cached_gqa (bytes) for head dim `headDim`, `group` and `block` threads: the warps'
 * maxima, sums and weighted values, the split merge's maxima, sums (weights) and denominators, the last-block flag. The
 * backend launches it only within SMEM_DEFAULT (every plan of a head dim up to 256 is; larger ones take attention_cached).
 */
export function cachedAttentionGqaSmem(headDim: number, group: number, block: number): number {
  const nw = block / 32;
  return 4 * (2 * nw * group + nw * group * headDim + 2 * CACHED_MAX_SPLITS * group + group + 1);
}

/**
 * Grid (t·nsplit, nKv, B): a block per query row, KV head and split, for the group of G = nH/nKv query heads that share it (each cache
 * row is read once for all of them). Queries at positions pos0..pos0+t-1 attend to cache rows 0..pos0+i; with `seqPos`,
 * sequence b's queries are at seqPos[b]..seqPos[b]+t-1 (batched generation of prompts of different lengths). A row is
 * read by R lanes (a row slot), VEC elements a load (CH loads a lane), so a warp holds 32/R rows at once; the block's
 * NG = NW·32/R slots take every NG-th row, UN rows a round whose keys and values are all loaded before the first score
 * is reduced (across the slot's R lanes), each slot keeping an online softmax per query head. The slots of a warp are
 * then merged by shuffles and the warps through shared memory, threads over the group's head dims. With nsplit > 1 the
 * rows are split into nsplit equal runs, one a block: each block writes its maxima, sums and weighted values to `part`
 * (after CACHED_COUNTERS ints of counters), and the last block of a (row, KV head) to finish (an atomic counter, reset
 * by it) merges the splits in split order, so the result does not depend on the blocks' order. nsplit is at most
 * CACHED_MAX_SPLITS (the merge's shared arrays): cachedAttentionSplits' bound, and the backend launches no other.
 */
export const attentionCachedGqa = defineFamily<AttnP & { out: Dt; q: Dt; kc: Dt; vc: Dt; seqPos: boolean; group: number; vec: number; un: number }>({
  name: 'attention_cached_gqa',
  schema: {
    ...schema, out: DTYPE_DOMAIN, q: DTYPE_DOMAIN, kc: DTYPE_DOMAIN, vc: DTYPE_DOMAIN, seqPos: { kind: 'bool' },
    group: { kind: 'int', min: 1, max: 16 }, vec: { kind: 'pow2', min: 1, max: 8 }, un: { kind: 'pow2', min: 1, max: 4 },
  },
  example: { headDim: 64, block: 256, out: 'f32', q: 'f32', kc: 'f32', vc: 'f32', seqPos: false, group: 2, vec: 8, un: 4 },
  generate: (p) => {
    // a vec that does not divide the head dim (rows would be misaligned) loads one element at a time; the plan never asks
    const vec = p.headDim % p.vec === 0 ? p.vec : 1;
    const { r, ch } = cachedLanes(p.headDim, vec);
    return `${prelude(p)}${vec === 8 ? LD8_HELPERS : ''}
#define NW (BLOCK / 32)
#define G ${p.group}
#define VEC ${vec}
#define NCH (HD / VEC)
#define R ${r}
#define CH ${ch}
#define CV (CH * VEC)
#define RPW (32 / R)
#define NG (NW * RPW)
#define UN ${p.un}
#define CACHED_COUNTERS ${CACHED_COUNTERS}
#define CACHED_MAX_SPLITS ${CACHED_MAX_SPLITS}
/* the VEC elements of p from off on (off a multiple of VEC) */
template <typename T> __device__ __forceinline__ void ldv(const T* p, long long off, float* o) {
  ${vec === 8 ? 'ld8(p + off, 0, o);' : `for (int e = 0; e < VEC; e++) o[e] = ldf(p, off + e);`}
}
/* the CV elements lane r holds of the row at off: chunks c = r + R·k of VEC elements, zeros past the row */
template <typename T> __device__ __forceinline__ void ldrow(const T* p, long long off, int r, float* o) {
#pragma unroll
  for (int k = 0; k < CH; k++) {
    int c = r + R * k;
    if (c < NCH) ldv(p, off + (long long)c * VEC, o + k * VEC);
    else {
#pragma unroll
      for (int e = 0; e < VEC; e++) o[k * VEC + e] = 0.0f;
    }
  }
}
extern "C" __global__ void __launch_bounds__(BLOCK) attention_cached_gqa(${ctype(p.out)}* out, const ${ctype(p.q)}* q, const ${ctype(p.kc)}* kc,
                                            const ${ctype(p.vc)}* vc, int t, int pos0, int tMax, int nH, int nKv, float* part, int nsplit${p.seqPos ? ', const int* seqPos' : ''}) {
  int i = blockIdx.x / nsplit, s = blockIdx.x - i * nsplit, kvh = blockIdx.y, b = blockIdx.z;
  int L = ${p.seqPos ? 'seqPos[b]' : 'pos0'} + i + 1;
  /* this block's rows: split s of nsplit equal runs of the L */
  int chunk = (L + nsplit - 1) / nsplit, lo = s * chunk, hi = min(L, lo + chunk);
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, r = lane % R, g = lane / R;
  __shared__ float wm[NW][G], wl[NW][G];
  __shared__ float wacc[NW][G][HD];
  const long long qrow = ((long long)b * t + i) * nH + (long long)kvh * G; /* the group's first query head */
  float qv[G][CV], acc[G][CV], m[G], l[G];
#pragma unroll
  for (int hh = 0; hh < G; hh++) {
    ldrow(q, (qrow + hh) * HD, r, qv[hh]);
#pragma unroll
    for (int e = 0; e < CV; e++) acc[hh][e] = 0.0f;
    m[hh] = NEG_INF; l[hh] = 0.0f;
  }
  /* warp-uniform rounds (the shuffles need every lane): slot g's rows are jw + g + u·NG */
  for (int jw = lo + w * RPW; jw < hi; jw += NG * UN) {
    float kr[UN][CV], vr[UN][CV];
#pragma unroll
    for (int u = 0; u < UN; u++) {
      int j = jw + g + u * NG;
      if (j < hi) {
        const long long row = (((long long)b * tMax + j) * nKv + kvh) * HD;
        ldrow(kc, row, r, kr[u]); ldrow(vc, row, r, vr[u]);
      } else {
#pragma unroll
        for (int e = 0; e < CV; e++) { kr[u][e] = 0.0f; vr[u][e] = 0.0f; }
      }
    }
#pragma unroll
    for (int hh = 0; hh < G; hh++) {
      float sc[UN];
      float mn = m[hh];
#pragma unroll
      for (int u = 0; u < UN; u++) {
        float x = 0.0f;
#pragma unroll
        for (int e = 0; e < CV; e++) x += qv[hh][e] * kr[u][e];
#pragma unroll
        for (int o = R / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
        sc[u] = x * SCALE;
        if (jw + g + u * NG < hi) mn = fmaxf(mn, sc[u]);
      }
      if (mn == NEG_INF) continue; /* no row yet in this slot */
      float corr = expf(m[hh] - mn);
      l[hh] *= corr;
#pragma unroll
      for (int e = 0; e < CV; e++) acc[hh][e] *= corr;
#pragma unroll
      for (int u = 0; u < UN; u++) {
        if (jw + g + u * NG >= hi) break;
        float pj = expf(sc[u] - mn);
        l[hh] += pj;
#pragma unroll
        for (int e = 0; e < CV; e++) acc[hh][e] += pj * vr[u][e];
      }
      m[hh] = mn;
    }
  }
  /* the warp's slots merged (lanes r of every slot end with the warp's sums) */
#pragma unroll
  for (int hh = 0; hh < G; hh++) {
#pragma unroll
    for (int o = R; o < 32; o <<= 1) {
      float mo = __shfl_xor_sync(0xffffffffu, m[hh], o), lo = __shfl_xor_sync(0xffffffffu, l[hh], o);
      float M = fmaxf(m[hh], mo);
      float a = m[hh] == NEG_INF ? 0.0f : expf(m[hh] - M), c = mo == NEG_INF ? 0.0f : expf(mo - M);
      l[hh] = l[hh] * a + lo * c;
#pragma unroll
      for (int e = 0; e < CV; e++) { float ao = __shfl_xor_sync(0xffffffffu, acc[hh][e], o); acc[hh][e] = acc[hh][e] * a + ao * c; }
      m[hh] = M;
    }
  }
  if (g == 0) {
#pragma unroll
    for (int hh = 0; hh < G; hh++) {
      if (r == 0) { wm[w][hh] = m[hh]; wl[w][hh] = l[hh]; }
#pragma unroll
      for (int k = 0; k < CH; k++) {
        int c = r + R * k;
        if (c < NCH) {
#pragma unroll
          for (int e = 0; e < VEC; e++) wacc[w][hh][c * VEC + e] = acc[hh][k * VEC + e];
        }
      }
    }
  }
  __syncthreads();
  /* the split's partial of each (query head, dim): its max, sum and weighted values, at part[CACHED_COUNTERS..] */
  const long long pbase = CACHED_COUNTERS + ((((long long)b * t + i) * nKv + kvh) * nsplit) * G * (HD + 2);
  for (int x = threadIdx.x; x < G * HD; x += BLOCK) {
    int hh = x / HD, d = x - hh * HD;
    float M = NEG_INF;
    for (int k = 0; k < NW; k++) M = fmaxf(M, wm[k][hh]);
    float den = 0.0f, a = 0.0f;
    for (int k = 0; k < NW; k++) {
      if (wl[k][hh] == 0.0f) continue;
      float f = expf(wm[k][hh] - M);
      den += wl[k][hh] * f;
      a += wacc[k][hh][d] * f;
    }
    if (nsplit == 1) { stf(out, (qrow + hh) * HD + d, a / den); continue; }
    float* pp = part + pbase + ((long long)s * G + hh) * (HD + 2);
    if (d == 0) { pp[0] = M; pp[1] = den; }
    pp[2 + d] = a;
  }
  if (nsplit == 1) return;
  /* the last split to finish merges all of them, in split order (the result does not depend on which is last) */
  __shared__ int lastBlock;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* cnt = (int*)part + ((long long)b * t + i) * nKv + kvh;
    lastBlock = atomicAdd(cnt, 1) == nsplit - 1;
    if (lastBlock) *cnt = 0; /* ready for the next call */
  }
  __syncthreads();
  if (!lastBlock) return;
  __threadfence();
  /* the splits' maxima and sums, all loaded at once (L2: ld.cg, the other blocks wrote them), then each split's weight
     a query head in shared memory (0 for an empty split: its rows all past L), then every weighted value loaded
     unconditionally (an empty split wrote zeros) and summed in split order */
  __shared__ float hm[CACHED_MAX_SPLITS][G], hl[CACHED_MAX_SPLITS][G], hden[G];
  const float* pp0 = part + pbase;
  for (int x = threadIdx.x; x < nsplit * G; x += BLOCK) {
    int k = x / G, hh = x - k * G;
    hm[k][hh] = __ldcg(pp0 + (long long)x * (HD + 2));
    hl[k][hh] = __ldcg(pp0 + (long long)x * (HD + 2) + 1);
  }
  __syncthreads();
  if (threadIdx.x < G) {
    int hh = threadIdx.x;
    float M = NEG_INF;
    for (int k = 0; k < nsplit; k++) M = fmaxf(M, hm[k][hh]);
    float den = 0.0f;
    for (int k = 0; k < nsplit; k++) {
      float f = hl[k][hh] == 0.0f ? 0.0f : expf(hm[k][hh] - M);
      den += hl[k][hh] * f;
      hm[k][hh] = f;
    }
    hden[hh] = den;
  }
  __syncthreads();
  for (int x = threadIdx.x; x < G * HD; x += BLOCK) {
    int hh = x / HD, d = x - hh * HD;
    float a = 0.0f;
#pragma unroll 4
    for (int k = 0; k < nsplit; k++) a += __ldcg(pp0 + ((long long)k * G + hh) * (HD + 2) + 2 + d) * hm[k][hh];
    stf(out, (qrow + hh) * HD + d, a / hden[hh]);
  }
}
`;
  },
});
