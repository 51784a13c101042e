/**
 * Generation's attention over a KV cache: kv_cache_write (rows into the cache at positions), attention_cached (a block
 * per query head) and attention_cached_gqa (a block per query row and KV head for its GQA group, a short grid split over
 * blocks and merged by the last: cached_finish, which attention_cached_mma, the group on the tensor cores for bf16
 * operands in attention-cached-mma.ts, shares), with what picks between them and lays the group kernel out: cachedAttentionKernel,
 * cachedAttentionPlan (with cachedAttentionLargeLayouts and cachedAttentionPickLayout for large grids), cachedAttentionSplits
 * (and cachedAttentionPickSplits),
 * cachedAttentionGqaSmem. fp32 math over f32 or bf16 operands, baked per
 * operand as in attention.ts (whose prelude, schema and operand types these families share).
 */
import { BLOCK_DOMAIN, DTYPE_DOMAIN, LD8_HELPERS, ctype, defineFamily, dtypeHelpers } from './spec.js';
import { attentionPrelude as prelude, attentionSchema as schema, type AttnBlockP as BlockP, type AttnDtype as Dt, type AttnP } from './attention.js';

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
 * 68.3 / 237 (more registers, fewer blocks an SM). Grids of few blocks prefer 4: CACHED_SMALL_GRID. A large grid may take
 * fewer rows in flight than this budget gives, by the compiled kernels' occupancy: cachedAttentionPickLayout.
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
 * The layouts a large grid (more than CACHED_SMALL_GRID blocks) may launch for one head shape: cachedAttentionPlan's, then
 * the same block with half the rows in flight, down to 1 (fewer registers, so more blocks an SM). The backend picks among
 * them by the compiled kernels' occupancy (cachedAttentionPickLayout); a trace plans them all.
 */
export function cachedAttentionLargeLayouts(headDim: number, group: number, aligned: boolean): CachedAttnPlan[] {
  const plan = cachedAttentionPlan(headDim, group, aligned);
  const out: CachedAttnPlan[] = [];
  for (let un = plan.un; un >= 1; un /= 2) out.push({ ...plan, un });
  return out;
}

/** The waves a grid of `blocks` runs in on `sms` SMs holding `perSm` blocks each (a layout no SM holds: never). */
export function gridWaves(blocks: number, perSm: number, sms: number): number {
  return perSm > 0 ? Math.ceil(blocks / (perSm * sms)) : Infinity;
}

/**
 * Which of `blocksPerSm` (the blocks an SM holds of each of cachedAttentionLargeLayouts' layouts, compiled: the
 * occupancy the driver reports) a grid of `gridBlocks` blocks on `sms` SMs launches: the one that runs the grid in the
 * fewest waves, then the first of those (more rows in flight). A layout an SM cannot hold (0) is never picked unless
 * none can be (then the first, whose launch names the error). The plan's own register estimate cannot decide this
 * (Qwen3-0.6B's 1 row in flight: estimated 86 registers, compiled 63). H200 (132 SMs), bench/attention-cached.ts --sweep,
 * registers from nvcc 13 for sm_90 (docs/measurements/generation/nvcc-2026-11-30-attention-cached-gqa-registers.txt),
 * us at 256 rows: Qwen3-0.6B's 16/8 heads at batch 64 (512 blocks) 4 rows in flight 2 blocks an SM (two waves) 31.5,
 * 2 rows 3 an SM (two waves) 33.7, 1 row 4 an SM (one wave) 25.4; at 256 blocks every layout fits one wave and 4 rows
 * wins, 11.3 against 15.0 at 1 row; Llama-3-8B's 32/8 at batch 64: 2 rows and 1 row both 2 an SM, 2 rows win 44.0
 * against 53.1.
 */
export function cachedAttentionPickLayout(gridBlocks: number, sms: number, blocksPerSm: readonly number[]): number {
  let best = 0, bestWaves = Infinity;
  blocksPerSm.forEach((n, i) => {
    const w = gridWaves(gridBlocks, n, sms);
    if (w < bestWaves) { best = i; bestWaves = w; }
  });
  return best;
}

/**
 * How many of up to `most` splits (cachedAttentionSplits' count, or fewer where the scratch holds fewer) a call of `pairs`
 * (query row, KV head) pairs launches on `sms` SMs, `blocksPerSm(blocks)` being the blocks an SM holds of the layout a grid
 * of that many blocks launches with: the count that runs the grid in the fewest waves, then the most splits. Splitting
 * toward CACHED_COUNTERS blocks can make two waves of a grid that fewer splits run in one. H200,
 * bench/attention-cached.ts --sweep --splits=0,1,2 (docs/measurements/generation/gpu-2026-11-30-h200-s55-attention-cached-split-sweep.txt),
 * us at 1024 / 4096 rows: Qwen2.5-0.5B's 14/2 heads at batch 48 (its layout holds 2 blocks an SM) 3 splits (288 blocks,
 * two waves) 48.1 / 173.8 against 2 (192, one) 37.2 / 133.9; Qwen2.5-1.5B's 12/2 86.5 / 296.7 against 66.4 / 239.9;
 * Llama-3-8B's 32/8 at batch 12 (2 an SM) 3 splits 55.7 / 190.5 against 2 42.7 / 150.8, at batch 24 2 splits (384
 * blocks) 83.2 / 292.3 against unsplit (192) 77.1 / 288.3.
 */
export function cachedAttentionPickSplits(most: number, pairs: number, sms: number, blocksPerSm: (blocks: number) => number): number {
  let best = most, bestWaves = Infinity;
  for (let s = most; s >= 1; s--) {
    const w = gridWaves(pairs * s, blocksPerSm(pairs * s), sms);
    if (w < bestWaves) { best = s; bestWaves = w; }
  }
  return best;
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
 * at most one per `minRows` (CACHED_MIN_ROWS; attention_cached_mma's CACHED_MMA_MIN_ROWS) of the cache's capacity tMax
 * and CACHED_MAX_SPLITS. A function of the call's shape
 * alone: the cache's length is on the device (seqPos) and changes every step of a captured decode loop.
 */
export function cachedAttentionSplits(b: number, t: number, nKv: number, tMax: number, minRows = CACHED_MIN_ROWS): number {
  const blocks = b * t * nKv;
  if (blocks >= CACHED_COUNTERS) return 1;
  return Math.max(1, Math.min(Math.ceil(CACHED_COUNTERS / blocks), Math.ceil(tMax / minRows), CACHED_MAX_SPLITS));
}

/**
 * Which cached attention a call launches: attention_cached_gqa (each cache row read once for the GQA group; a short grid
 * split over blocks) when the call has CACHED_GQA_MIN_BLOCKS (query row, KV head) pairs or more, when a GQA group (2 or
 * more) reads a cache of CACHED_GQA_LONG_ROWS rows or more (tMax, the capacity: the length is on the device and runs from
 * the prompt's up to it), or of CACHED_GQA_SMALL_GROUP_ROWS at a group of 2 to CACHED_GQA_SMALL_GROUP; else
 * attention_cached (a block per query head, each reading its rows), as for groups past CACHED_GQA_MAX_GROUP. With `mma`
 * (the call's group runs on the tensor cores, attention_cached_mma: bf16 operands, 16-byte aligned, a head dim and group
 * it takes) a GQA group takes the group kernel at any size (measured in attention-cached-mma.ts); the thresholds below,
 * measured for attention_cached_gqa, decide the other calls (f32 operands, rows off 16 bytes, other head dims). The
 * sequences and rows of a call change within a run (a last, shorter group of prompts), so a trace plans both kernels,
 * and every layout or variant of the group kernel (attention_cached_gqa's small grid's, cachedAttentionPlan and
 * cachedAttentionLargeLayouts; attention_cached_mma's CACHED_MMA_MIN_BLOCKS), for every call (CudaBackend). Measured on an H200
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
export function cachedAttentionKernel(b: number, t: number, nKv: number, group: number, tMax: number, mma = false): 'head' | 'gqa' {
  if (group > CACHED_GQA_MAX_GROUP) return 'head';
  // on the tensor cores (attention_cached_mma) a GQA group takes the group kernel at any size (measured: attention-cached-mma.ts)
  if (mma && group >= 2) return 'gqa';
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
 * The end of attention_cached_gqa and attention_cached_mma (after #defines of G, HD, NW, BLOCK, CACHED_COUNTERS and
 * CACHED_MAX_SPLITS, and dtypeHelpers): the block's NW warps' partials in shared memory (wm, wl: each warp's max and sum
 * a query head, a sum of 0 for a warp that saw no row; wacc: its weighted values), written before a barrier, merged into
 * out (nsplit 1), or into split s's partial in `part` (after CACHED_COUNTERS ints of counters); the last split of a (query
 * row, KV head) to finish (an atomic counter, reset by it) merges all of them in split order, so the result does not
 * depend on the blocks' order.
 */
export const CACHED_FINISH = `template <typename TO>
__device__ __forceinline__ void cached_finish(TO* out, float* part, const float (*wm)[G], const float (*wl)[G], const float (*wacc)[G][HD],
                                              int t, int nKv, int nsplit, int s, int i, int kvh, int b, long long qrow) {
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
${CACHED_FINISH}
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
  cached_finish(out, part, wm, wl, wacc, t, nKv, nsplit, s, i, kvh, b, qrow);
}
`;
  },
});
