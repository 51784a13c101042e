/**
 * attention_cached_mma: generation's attention over a bf16 KV cache on the tensor cores, for a GQA group (or one head),
 * FlashDecoding style: the group's query heads are the 16 rows of an m16n8k16 tile (zero past the group), so S = Q·Kᵀ
 * and O += P·V are mma.sync products over 16 keys at a time, where attention_cached_gqa's lanes compute each head's dot
 * products with FMAs and shuffles (its cost grows with the group: Qwen2.5's 7 and 6 heads a KV head ran at about a
 * third of the H200's bandwidth). The same grid, arguments, split scratch and merge as attention_cached_gqa
 * (cached_finish); its splits take CACHED_MMA_MIN_ROWS rows at least (the SIMT kernel's 64), and the backend launches it
 * for every call whose operands it takes.
 *
 * A block of 4 warps per (query row, KV head, split); warp w takes the split's keys 16 at a time, tiles w, w + 4, ...,
 * with an online softmax in the log2 domain per query head, and the warps merge through shared memory. No shared memory
 * staging and no shuffles of operands: each lane loads the bf16 words its fragments need straight from global memory,
 * 16 bytes at a time, because the k index of S's product may run over the head dims in any order that Q and K share:
 * lane (g, t) (g = lane / 4, t = lane % 4) holds head dims t·HD/4 .. t·HD/4 + HD/4 − 1 of query heads g and g + 8 and of
 * keys g and 8 + g (its A and B fragments of every k-step), and for P·V head dims g·HD/8 .. g·HD/8 + HD/8 − 1 of keys
 * 2t, 2t + 1, 2t + 8, 2t + 9 (B's n index g names that run of dims, one element of it an n-atom; a byte permute pairs two
 * keys' elements). Its output accumulators are then head dims 2t·HD/8 .. 2t·HD/8 + HD/4 − 1 of heads g and g + 8.
 * P goes from S's accumulators to P·V's A fragment as in attention_fwd_bf16 (bf16, fp32 accumulation throughout).
 * Head dims that are multiples of 64 up to 128 (16-byte loads of both runs; the backend checks the 16-byte alignment of
 * q and the caches), groups up to 16.
 */
import { DTYPE_DOMAIN, ctype, defineFamily, f32 } from './spec.js';
import { attentionPrelude as prelude, type AttnDtype as Dt } from './attention.js';
import { CACHED_COUNTERS, CACHED_FINISH, CACHED_MAX_SPLITS, gridWaves } from './attention-cached.js';
import { MMA16 } from './attention-bf16.js';

/** Threads a block of attention_cached_mma: 4 warps. */
export const CACHED_MMA_THREADS = 128;
/** The largest GQA group attention_cached_mma takes (the 16 rows of an mma tile). */
export const CACHED_MMA_MAX_GROUP = 16;

/** Whether attention_cached_mma takes a head dim (a multiple of 64 up to 128) and a group (1 to 16). */
export function cachedMmaShape(headDim: number, group: number): boolean {
  return Number.isInteger(headDim) && headDim % 64 === 0 && headDim >= 64 && headDim <= 128 && Number.isInteger(group) && group >= 1 && group <= CACHED_MMA_MAX_GROUP;
}

/**
 * The variants of attention_cached_mma a call may launch, by the blocks an SM must hold at least (0: as many as the
 * registers ptxas chooses allow; 4: at most 128 registers a thread). The backend launches the one cachedMmaPickVariant
 * picks by their compiled occupancy and registers; a trace plans both.
 */
export const CACHED_MMA_MIN_BLOCKS = [0, 4] as const;

/** A compiled variant of attention_cached_mma as the driver reports it: blocks an SM holds, registers and local memory a thread. */
export interface CachedMmaVariant { blocksPerSm: number; registers: number; localBytes: number }

/**
 * Which of `variants` (CACHED_MMA_MIN_BLOCKS' compiled) a grid of `blocks` blocks on `sms` SMs launches: of those that
 * run it in the fewest waves, one that spills nothing (no local memory), then the one with the most registers (more
 * loads in flight a thread), then the first. H200 (docs/measurements/generation/gpu-2026-11-30-h200-s56-attention-cached-mma.txt,
 * call 4, µs): at head dim 128 bounding to 4 blocks an SM spills (ptxas: 152 registers unbounded, 3 an SM; bounded, 128
 * registers and 72 bytes of spill), so where both run a grid in one wave the unbounded wins (Qwen3-0.6B's 16/8 heads at batch 48,
 * 384 blocks: 193.1 against 204.6 at 4096 rows), and at batch 64 (512 blocks: two waves at 3 an SM, one at 4) the
 * bounded (268.2 against 326.4); at head dim 64 the bounded variant spills nothing and keeps more registers (120 against
 * 91) and wins at one wave each (Qwen2.5-0.5B's 14/2 heads, batch 8, 4096 rows unsplit: 38.2 against 45.5).
 */
export function cachedMmaPickVariant(blocks: number, sms: number, variants: readonly CachedMmaVariant[]): number {
  // ordered by waves, then spills, then registers (most first); a tie keeps the earlier variant
  const rank = (v: CachedMmaVariant): number[] => [gridWaves(blocks, v.blocksPerSm, sms), v.localBytes > 0 ? 1 : 0, -v.registers];
  const before = (a: number[], b: number[]): boolean => { const k = a.findIndex((x, i) => x !== b[i]); return k >= 0 && a[k]! < b[k]!; };
  let best = 0;
  variants.forEach((v, i) => { if (before(rank(v), rank(variants[best]!))) best = i; });
  return best;
}

/**
 * Cache rows a split of attention_cached_mma takes at least (cachedAttentionSplits' minRows): its 4 warps take 64 rows a
 * round, and a split's fixed cost (the query's fragments, the warps' and the splits' merges) weighs more than on the
 * SIMT kernel. H200, call 3 (`--kernels`), µs at 256 rows, unsplit against 4 splits (64 rows each, the SIMT kernel's
 * bound): Qwen2.5-0.5B at batch 8 5.9 against 7.3, Qwen3-0.6B 7.1 against 7.6, Llama-3-8B 8.3 against 10.3; at 1024 rows
 * 4 splits win (9.3, 11.8, 14.5 against 13.9, 20.0, 21.4 unsplit).
 */
export const CACHED_MMA_MIN_ROWS = 256;

export const attentionCachedMma = defineFamily<{ headDim: number; group: number; out: Dt; seqPos: boolean; minBlocks: number }>({
  name: 'attention_cached_mma',
  schema: {
    headDim: { kind: 'int', min: 64, max: 128, step: 64 }, group: { kind: 'int', min: 1, max: CACHED_MMA_MAX_GROUP },
    out: DTYPE_DOMAIN, seqPos: { kind: 'bool' }, minBlocks: { kind: 'int', min: 0, max: 8 },
  },
  example: { headDim: 64, group: 7, out: 'bf16', seqPos: false, minBlocks: 0 },
  generate: (p) => `${prelude({ headDim: p.headDim, block: CACHED_MMA_THREADS })}
#define NW (BLOCK / 32)
#define G ${p.group}
#define KS (HD / 16)
#define NA (HD / 8)
#define DPL (HD / 4)
#define SCALE_LOG2 ${f32(Math.LOG2E / Math.sqrt(p.headDim))}
#define LN2 0.6931471805599453f
#define CACHED_COUNTERS ${CACHED_COUNTERS}
#define CACHED_MAX_SPLITS ${CACHED_MAX_SPLITS}
${MMA16}
${CACHED_FINISH}
/* n 16-byte words from p (16-byte aligned) into w[4n]; zeros where !ok */
template <int N> __device__ __forceinline__ void ld16(const bf16* p, bool ok, unsigned* w) {
#pragma unroll
  for (int k = 0; k < N; k++) {
    uint4 u = ok ? ((const uint4*)p)[k] : make_uint4(0u, 0u, 0u, 0u);
    w[4 * k] = u.x; w[4 * k + 1] = u.y; w[4 * k + 2] = u.z; w[4 * k + 3] = u.w;
  }
}
extern "C" __global__ void __launch_bounds__(BLOCK${p.minBlocks > 0 ? `, ${p.minBlocks}` : ''}) attention_cached_mma(${ctype(p.out)}* out, const bf16* q, const bf16* kc, const bf16* vc,
                                            int t, int pos0, int tMax, int nH, int nKv, float* part, int nsplit${p.seqPos ? ', const int* seqPos' : ''}) {
  int i = blockIdx.x / nsplit, s = blockIdx.x - i * nsplit, kvh = blockIdx.y, b = blockIdx.z;
  int L = ${p.seqPos ? 'seqPos[b]' : 'pos0'} + i + 1;
  /* this block's rows: split s of nsplit equal runs of the L */
  int chunk = (L + nsplit - 1) / nsplit, lo = s * chunk, hi = min(L, lo + chunk);
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  __shared__ float wm[NW][G], wl[NW][G];
  __shared__ float wacc[NW][G][HD];
  const long long qrow = ((long long)b * t + i) * nH + (long long)kvh * G; /* the group's first query head */
  /* Q's A fragments: heads g and g + 8 (zero past the group), k-step ks's slots 2t, 2t + 1 | 2t + 8, 2t + 9 the lane's
     dims 4ks, 4ks + 1 | 4ks + 2, 4ks + 3 of its run */
  unsigned qa[KS][4];
  {
    unsigned q0[DPL / 2], q1[DPL / 2];
    ld16<DPL / 8>(q + (qrow + g) * HD + tq * DPL, g < G, q0);
    ld16<DPL / 8>(q + (qrow + g + 8) * HD + tq * DPL, g + 8 < G, q1);
#pragma unroll
    for (int ks = 0; ks < KS; ks++) { qa[ks][0] = q0[2 * ks]; qa[ks][1] = q1[2 * ks]; qa[ks][2] = q0[2 * ks + 1]; qa[ks][3] = q1[2 * ks + 1]; }
  }
  float o[NA][4];
#pragma unroll
  for (int a = 0; a < NA; a++) { o[a][0] = 0.0f; o[a][1] = 0.0f; o[a][2] = 0.0f; o[a][3] = 0.0f; }
  float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f; /* heads g, g + 8: max (log2 domain), this lane's part of the sum */
  const long long kvStride = (long long)nKv * HD;
  const long long kvBase = ((long long)b * tMax * nKv + kvh) * HD;
  for (int j0 = lo + w * 16; j0 < hi; j0 += NW * 16) {
    /* K rows j0 + g and j0 + 8 + g (the lane's dims run), V rows j0 + 2t, + 1, + 8, + 9 (its dims g·NA ..); none past hi */
    unsigned kw[2][DPL / 2], vw[4][NA / 2];
#pragma unroll
    for (int a = 0; a < 2; a++) { int j = j0 + 8 * a + g; ld16<DPL / 8>(kc + kvBase + (long long)j * kvStride + tq * DPL, j < hi, kw[a]); }
#pragma unroll
    for (int r = 0; r < 4; r++) { int j = j0 + 2 * tq + (r & 1) + 8 * (r >> 1); ld16<NA / 8>(vc + kvBase + (long long)j * kvStride + g * NA, j < hi, vw[r]); }
    /* S: heads × keys 2t, 2t + 1 of each 8-key atom; scaled to log2 units, keys past hi masked */
    float sc[2][4];
#pragma unroll
    for (int a = 0; a < 2; a++) {
      sc[a][0] = 0.0f; sc[a][1] = 0.0f; sc[a][2] = 0.0f; sc[a][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KS; ks++) mma16(sc[a], qa[ks], kw[a][2 * ks], kw[a][2 * ks + 1]);
#pragma unroll
      for (int c = 0; c < 4; c++) sc[a][c] = j0 + 8 * a + 2 * tq + (c & 1) < hi ? sc[a][c] * SCALE_LOG2 : NEG_INF;
    }
    float x0 = fmaxf(fmaxf(sc[0][0], sc[0][1]), fmaxf(sc[1][0], sc[1][1])), x1 = fmaxf(fmaxf(sc[0][2], sc[0][3]), fmaxf(sc[1][2], sc[1][3]));
    x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 1)); x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));
    x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 1)); x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));
    /* key j0 < hi is in every tile: the new maxima are finite. A group of up to 8 heads has no row g + 8 (its weights
       are left 0: no exponentials for them) */
    const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1), c0 = exp2f(m0 - n0), c1 = G > 8 ? exp2f(m1 - n1) : 0.0f;
    m0 = n0; m1 = n1;
#pragma unroll
    for (int a = 0; a < 2; a++) {
      sc[a][0] = exp2f(sc[a][0] - n0); sc[a][1] = exp2f(sc[a][1] - n0);
      if (G > 8) { sc[a][2] = exp2f(sc[a][2] - n1); sc[a][3] = exp2f(sc[a][3] - n1); } else { sc[a][2] = 0.0f; sc[a][3] = 0.0f; }
    }
    l0 = l0 * c0 + (sc[0][0] + sc[0][1]) + (sc[1][0] + sc[1][1]);
    l1 = l1 * c1 + (sc[0][2] + sc[0][3]) + (sc[1][2] + sc[1][3]);
    const unsigned pa[4] = { pack2(sc[0][0], sc[0][1]), pack2(sc[0][2], sc[0][3]), pack2(sc[1][0], sc[1][1]), pack2(sc[1][2], sc[1][3]) };
#pragma unroll
    for (int a = 0; a < NA; a++) {
      o[a][0] *= c0; o[a][1] *= c0; o[a][2] *= c1; o[a][3] *= c1;
      /* B: keys 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1) of dim g·NA + a: element a of each V row, paired */
      const unsigned sel = (a & 1) ? 0x7632u : 0x5410u;
      mma16(o[a], pa, __byte_perm(vw[0][a >> 1], vw[1][a >> 1], sel), __byte_perm(vw[2][a >> 1], vw[3][a >> 1], sel));
    }
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1); l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1); l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  /* the warp's partials: maxima in natural units (cached_finish's), dims 2t·NA + a and (2t + 1)·NA + a of heads g, g + 8 */
  if (tq == 0) {
    if (g < G) { wm[w][g] = m0 * LN2; wl[w][g] = l0; }
    if (g + 8 < G) { wm[w][g + 8] = m1 * LN2; wl[w][g + 8] = l1; }
  }
#pragma unroll
  for (int a = 0; a < NA; a++) {
    if (g < G) { wacc[w][g][2 * tq * NA + a] = o[a][0]; wacc[w][g][(2 * tq + 1) * NA + a] = o[a][1]; }
    if (g + 8 < G) { wacc[w][g + 8][2 * tq * NA + a] = o[a][2]; wacc[w][g + 8][(2 * tq + 1) * NA + a] = o[a][3]; }
  }
  __syncthreads();
  cached_finish(out, part, wm, wl, wacc, t, nKv, nsplit, s, i, kvh, b, qrow);
}
`,
});
