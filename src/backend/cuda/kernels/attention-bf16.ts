/**
 * bf16 TENSOR-CORE FLASH ATTENTION (training; used by CudaBackend whenever q, k, v (and dout) are bf16 and the head
 * dim is a multiple of 16 up to 128; FlashAttention-2 style; mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 by
 * inline PTX, fp32 accumulation, header-free). All three kernels: 128 threads = 4 warps, each warp owns 16 rows (query
 * rows, or keys for dK/dV), operands staged in dynamic shared memory as bf16 with rows padded by 8 elements (16 bytes:
 * conflict-free 32-bit fragment loads and ldmatrix rows), all row-major: where a product runs over keys or queries
 * (P·V, dS·K, Pᵀ·dO, dSᵀ·Q) its B fragments come from ldmatrix.x2.trans; no shuffles: an accumulator pair packs straight
 * into the next product's A fragment. Row tiles are read from global memory with 16-byte loads and stored to shared
 * memory with 16-byte stores (the backend checks 16-byte alignment of q, k, v, dout).
 * - attention_fwd_bf16: grid (ceil(T/64), nH, B); Q fragments in registers; key tiles of 64 (K and V: 4·64·(HD+8)
 *   bytes: 18 KiB at hd 64, 34 KiB at hd 128); S = Q·Kᵀ, online softmax in the log2
 *   domain on the fragments (quad shuffles), P → bf16 A fragments, O += P·V; causal: tiles above the diagonal skipped,
 *   only the diagonal tile masked. out f32 or bf16, lse f32 (natural log).
 * - attention_bwd_dq_bf16: grid (ceil(T/64), nH, B); D = rowsum(dout ∘ out) of its 64 rows first (written to the D
 *   scratch for the dK/dV kernel: no separate pre-pass on this path); Q and dout fragments in registers, key tiles of 64 (32 at hd > 64: registers) of K and V; S, dP = dO·Vᵀ, P = exp2(S·scale·log2e − lse·log2e), dS = P∘(dP − D), dQ += dS·K; dq += scale·dQ.
 * - attention_bwd_dkv_bf16: grid (ceil(T/64), nKv·S, B); the block's 64 keys (K, V row-major in shared memory, A
 *   fragments re-read per k-step) walk the query tiles (64 rows, 32 at hd > 64; Q, dout, lse and D) from the diagonal down, for each query head of its GQA split in order: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, dV += Pᵀ·dO,
 *   dK += dSᵀ·Q; S = 1 adds into dk/dv (f32 or bf16), S > 1 writes f32 partials for attention_dkv_reduce (same
 *   split rule and fixed-order sum as the SIMT path: deterministic, atomic-free).
 * ptxas (local nvcc 13.0, sm_90, session 19): forward 128 (bounded to 4 blocks per SM, an 8-byte spill) / 213 registers
 * (hd 64 / 128), dQ 146 / 168 (bounded to 3 blocks, 212 bytes spilled), dK/dV 168 (bounded to 3 blocks, ~100 bytes spilled)
 * / 255 (56 bytes spilled); NVRTC may differ.
 * Documents (Backend DocPositions): every kernel takes `docPos` (each row's position in its document, or null) as a
 * run-time argument (DOC_START, attention.ts): a row's keys start at its document's first row; the forward and both dQ
 * kernels begin at the key tile of their tile's first row's document, the dK/dV kernels end at the first row whose
 * document starts after their keys (rounded to a 64-row dS tile); the forward's body is instantiated with and without
 * documents (fwdBody<DOCS>), so the causal window runs the code it ran before.
 * Shared memory: faSmem(). Tried and measured slower (docs/measurements, session 18): skipping the diagonal tile's fully
 * masked atoms, two m-atoms per warp. Not yet done: 8-warp blocks, wgmma/TMA.
 * - The default backward (CudaBackend's AttentionBackwardImpl 'stored-ds', session 20): attention_bwd_pre (D), then
 *   attention_bwd_dkv_ds_bf16 (the dK/dV kernel above plus a coalesced store of every dSᵀ tile it computes, bf16, to a
 *   causal-triangle scratch: dsScratchElems) and attention_bwd_dq_ds_bf16 (dQ = scale·dS·K from the stored tiles):
 *   S and dP once per (query tile, key tile) pair, five products against the recomputing pair's seven, deterministic.
 *   On an H100 at 8 × 1024 (session 20, docs/measurements): backward 351 against 369 µs (student, hd 64), 532 against
 *   641 (Qwen2.5-1.5B-shaped, hd 128), 585 against 737 (Qwen3, 16/8 heads, hd 128). The recomputing pair
 *   (attention_bwd_dq_bf16, attention_bwd_dkv_bf16) runs with 'recompute' and where one sequence's triangle does not
 *   fit the scratch.
 */
import { DTYPE_DOMAIN, ctype, defineFamily, dtypeHelpers, f32 } from './spec.js';
import { DOC_START } from './attention.js';

/** An operand dtype ('f32' | 'bf16'): baked, so it is in the source and the cache key. */
type Dt = 'f32' | 'bf16';

/** Head dims of the bf16 tensor-core kernels: multiples of 16 (the mma k step) up to 128 (fragments in registers). */
export const BF16_MMA_MAX_HEAD_DIM = 128;
/** Whether the bf16 tensor-core kernels take this head dim (else the SIMT kernels run, in any dtype). */
export function bf16MmaHeadDim(hd: number): boolean { return Number.isInteger(hd) && hd >= 16 && hd <= BF16_MMA_MAX_HEAD_DIM && hd % 16 === 0; }
const faSchema = { headDim: { kind: 'int', min: 16, max: BF16_MMA_MAX_HEAD_DIM, step: 16 } } as const;
/** Threads per block of the bf16 tensor-core kernels: 4 warps, each owning 16 query rows (fwd, dQ) or 16 keys (dK/dV). */
export const FA_THREADS = 128;
/** Query rows per block of attention_fwd_bf16 and attention_bwd_dq_bf16 (the grid's x is ceil(T / this)). */
export const FA_QUERY_TILE = 64;
/** Keys per block of attention_bwd_dkv_bf16 (the grid's x is ceil(T / this)). */
export const FA_KEY_TILE = 64;
/** Keys per staged tile of the forward. */
const FA_FWD_KT = 64;
/** Keys per staged tile of the dQ kernel, and query rows per staged tile of the dK/dV kernel (registers bound them at hd > 64). */
function faInnerTile(hd: number): number { return hd > 64 ? 32 : 64; }

export type FaKind = 'fwd' | 'dq' | 'dkv';
/** Dynamic shared memory of a bf16 tensor-core kernel, bytes (above 48 KiB the backend opts in). */
export function faSmem(kind: FaKind, hd: number): number {
  const str = hd + 8, it = faInnerTile(hd);
  switch (kind) {
    case 'fwd': return 2 * (4 * FA_FWD_KT * str); // K and V, double-buffered
    case 'dq': return 2 * Math.max(4 * it * str, 2 * FA_QUERY_TILE * str); // K and V double-buffered, or the Q/dout staging
    case 'dkv': return 2 * (2 * FA_KEY_TILE * str + 4 * it * str) + 16 * it; // Q, dout, lse and D double-buffered
  }
}

/** mma16(c, a, b0, b1): c += a · b on one m16n8k16 tile (bf16 operands as fragments below, fp32 accumulation), inline PTX. */
export const MMA16 = `/* c += a · b on one m16n8k16 tile, fp32 accumulation */
__device__ __forceinline__ void mma16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
`;

/**
 * Shared device code of the bf16 tensor-core kernels. mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 fragments
 * (PTX ISA; g = lane >> 2, t = lane & 3; a register holds two bf16, the lower column / k index in its low half):
 * A (16×16, row-major) a0 (row g, cols 2t, 2t+1) a1 (row g+8, same) a2 (row g, cols 2t+8, 2t+9) a3 (row g+8, same);
 * B (16×8, k × n) b0 (k 2t, 2t+1; n g) b1 (k 2t+8, 2t+9; n g); C (16×8, f32) c0, c1 (row g, cols 2t, 2t+1), c2, c3
 * (row g+8, same). So the C fragments of two adjacent n-atoms (8 columns each) are, packed pairwise to bf16, exactly
 * the A fragment of one 16-wide k-step: P and dS go from the accumulators to the next product without shuffles.
 * Tiles in shared memory are bf16, row stride (cols + 8): a fragment load (row g, 32-bit word t) hits 32 distinct banks.
 * A B operand B[k][n] is read from an [n][k] tile (k contiguous) with ldmatrix, two n-atoms at a time (fragB2: K for S = Q·Kᵀ, V for
 * dP = dO·Vᵀ, Q and dout for the dK/dV kernel's Sᵀ and dPᵀ), or from a row-major [k][n] tile with ldmatrix .trans
 * (fragBt2: V for O += P·V, K for dQ += dS·K, dout and Q for dV += Pᵀ·dO and dK += dSᵀ·Q), again two n-atoms at a time:
 * .trans hands lane (g, t) the elements [2t][g], [2t+1][g] of each 8×8 matrix, exactly b0 (keys 0..7) and b1 (keys 8..15).
 * Fragment addresses are 32-bit shared addresses (smem32 of a tile, plus the lane's offset and compile-time steps).
 */
function faPrelude(hd: number): string {
  return `#define HD ${hd}
#define NT ${FA_THREADS}
#define KS (HD / 16)
#define NO (HD / 8)
#define STR (HD + 8)
#define SCALE ${f32(1 / Math.sqrt(hd))}
#define SCALE_LOG2 ${f32(Math.LOG2E / Math.sqrt(hd))}
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define NEG_INF __int_as_float(0xff800000)
#define FULL 0xffffffffu
${dtypeHelpers()}${DOC_START}
__device__ __forceinline__ unsigned ld32(const bf16* p) { return *(const unsigned*)p; }
/* the shared-state-space address of a pointer into shared memory: fragment addresses are computed in 32 bits from a
   tile's base (one add per load once the lane's offset is known) rather than through a 64-bit generic pointer */
__device__ __forceinline__ unsigned smem32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
/* two floats to consecutive elements i, i + 1 (i even): one 64-bit store, or one 32-bit store of a bf16 pair */
__device__ __forceinline__ void st2(float* p, long long i, float a, float b) { *(float2*)(p + i) = make_float2(a, b); }
__device__ __forceinline__ void st2(bf16* p, long long i, float a, float b) { *(unsigned*)(p + i) = pack2(a, b); }
${MMA16}/* ldmatrix.x4 (not transposed) of four 8×8 bf16 matrices whose rows lanes 8m .. 8m + 7 address (shared addresses,
   16-byte aligned rows): lane (g, t) receives elements [g][2t] (low half) and [g][2t + 1] of each matrix m in register m */
__device__ __forceinline__ void ldsm4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, unsigned a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}
/* ldmatrix.x4.trans of four 8×8 bf16 matrices whose rows lanes 8m .. 8m + 7 address: lane (g, t) receives elements
   [2t][g] (low half) and [2t + 1][g] of each matrix m in register m */
__device__ __forceinline__ void ldsmT4(unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3, unsigned a) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}
/* the A fragment of rows r..r+15, cols c..c+15 of a row-major bf16 tile (shared address base, row stride str) in one
   ldmatrix.x4: lanes 0-7 address rows r..r+7 at col c (a0), 8-15 rows r+8..r+15 (a1), 16-23 rows r.. at col c+8 (a2),
   24-31 rows r+8.. at col c+8 (a3) */
__device__ __forceinline__ void fragA(unsigned* a, unsigned base, int str, int r, int c) {
  const int l = threadIdx.x & 31;
  ldsm4(a[0], a[1], a[2], a[3], base + 2u * ((r + (l & 15)) * str + c + 8 * (l >> 4)));
}
/* the B fragments B[k][n] = sh[n0 + n][c + k] (k 0..15, n 0..7) of two adjacent n-atoms of an [n][k] bf16 tile of row
   stride str (rows n0 .. n0 + 15, k-step c) in one ldmatrix.x4: b[0] (k 2t, 2t+1; n g), b[1] (k 2t+8, 2t+9) for atom n0,
   b[2], b[3] for atom n0 + 8 */
__device__ __forceinline__ void fragB2(unsigned* b, unsigned base, int str, int n0, int c) {
  const int l = threadIdx.x & 31, m = l >> 3;
  ldsm4(b[0], b[1], b[2], b[3], base + 2u * ((n0 + (l & 7) + 8 * (m >> 1)) * str + c + 8 * (m & 1)));
}
/* the B fragments B[k][n] = sh[k0 + k][n0 + n] (k 0..15) of two adjacent n-atoms (n0, n0 + 8) of a row-major [k][n]
   bf16 tile in one ldmatrix.x4.trans: lanes 0-7 address rows k0..k0+7 at col n0 (b[0]), 8-15 rows k0+8.. (b[1]),
   16-23 rows k0.. at col n0 + 8 (b[2]), 24-31 rows k0+8.. at col n0 + 8 (b[3]) */
__device__ __forceinline__ void fragBt2(unsigned* b, unsigned base, int str, int k0, int n0) {
  const int l = threadIdx.x & 31;
  ldsmT4(b[0], b[1], b[2], b[3], base + 2u * ((k0 + (l & 15)) * str + n0 + 8 * (l >> 4)));
}
/* the A fragment of a k-step from the C fragments of n-atoms lo (cols 0..7) and hi (cols 8..15), rounded to bf16 */
__device__ __forceinline__ void packA(unsigned* a, const float* lo, const float* hi) {
  a[0] = pack2(lo[0], lo[1]); a[1] = pack2(lo[2], lo[3]); a[2] = pack2(hi[0], hi[1]); a[3] = pack2(hi[2], hi[3]);
}
/* c0 += a · B and c1 += a · B' for the two adjacent n-atoms (n0, n0 + 8) of an [n][k] tile at k-step c (fragB2) */
__device__ __forceinline__ void mmaB2(float* c0, float* c1, const unsigned* a, unsigned tile, int n0, int c) {
  unsigned bb[4];
  fragB2(bb, tile, STR, n0, c);
  mma16(c0, a, bb[0], bb[1]);
  mma16(c1, a, bb[2], bb[3]);
}
/* the same for a row-major [k][n] tile, rows k0 .. k0 + 15 (fragBt2) */
__device__ __forceinline__ void mmaBt2(float* c0, float* c1, const unsigned* a, unsigned tile, int k0, int n0) {
  unsigned bb[4];
  fragBt2(bb, tile, STR, k0, n0);
  mma16(c0, a, bb[0], bb[1]);
  mma16(c1, a, bb[2], bb[3]);
}
/* zeroes an array of accumulator tiles */
template <int N> __device__ __forceinline__ void zeroAcc(float (&c)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; n++) { c[n][0] = 0.0f; c[n][1] = 0.0f; c[n][2] = 0.0f; c[n][3] = 0.0f; }
}
/* rows [r0, r0 + nrows) of a bf16 matrix (row r at base + r·stride, HD elements, 16-byte aligned) into the row-major
   tile sh[nrows][STR], 16 bytes per load and store; zeros past T */
__device__ __forceinline__ void stageRows(bf16* sh, const bf16* base, long long stride, int r0, int nrows, int T) {
  for (int x = threadIdx.x; x < nrows * (HD / 8); x += NT) {
    const int r = x / (HD / 8), c = (x - r * (HD / 8)) * 8;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (r0 + r < T) val = *(const uint4*)(base + (long long)(r0 + r) * stride + c);
    *(uint4*)(sh + r * STR + c) = val;
  }
}
/* cp.async (sm_80+): 16 bytes global -> shared without a register round trip, zero-filled when !ok; a group of them
   completes in order of cpCommit, cpWait<N> waits until at most N groups are pending (then __syncthreads shows them) */
__device__ __forceinline__ void cpAsync16(bf16* dst, const bf16* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(smem32(dst)), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
/* 4 bytes (a float), zero-filled when !ok */
__device__ __forceinline__ void cpAsync4(float* dst, const float* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(smem32(dst)), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
/* the same to a shared address */
__device__ __forceinline__ void cpAsync16s(unsigned dst, const bf16* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cpCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cpWait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
/* end cp.async */
/* stageRows with cp.async: issued now, complete after cpWait and a barrier. A thread keeps one 16-byte column of the
   rows (NT is a multiple of the HD / 8 chunks of a row) and steps its source and shared addresses by whole passes */
__device__ __forceinline__ void stageRowsAsync(bf16* sh, const bf16* base, long long stride, int r0, int nrows, int T) {
  constexpr int CPR = HD / 8, RPP = NT / CPR; /* chunks per row, rows per pass */
  const int r = threadIdx.x / CPR, c = (threadIdx.x - r * CPR) * 8;
  const bf16* src = base + (long long)(r0 + r) * stride + c;
  unsigned dst = smem32(sh + r * STR + c);
  for (int rr = r; rr < nrows; rr += RPP, src += RPP * stride, dst += 2u * (RPP * STR)) {
    const bool ok = r0 + rr < T;
    cpAsync16s(dst, ok ? src : base, ok);
  }
}
/* a key loop's double buffer of [TILE][STR] K and V tiles (K then V in each half), over key tiles jt0 .. nTiles − 1 (the
   first staged into half 0 before the loop): issues tile jt + 1 (keys from (jt + 1)·TILE) into half (jt + 1 − jt0) & 1
   with cp.async and waits until tile jt has landed (the barrier after it shows it to every warp); the last tile only waits */
template <int TILE> __device__ __forceinline__ void nextKvTile(bf16* buf, const bf16* kb, const bf16* vb, long long ks,
                                                              int jt, int jt0, int nTiles, int T) {
  if (jt + 1 < nTiles) {
    bf16* nb = buf + ((jt + 1 - jt0) & 1) * 2 * TILE * STR;
    stageRowsAsync(nb, kb, ks, (jt + 1) * TILE, TILE, T);
    stageRowsAsync(nb + TILE * STR, vb, ks, (jt + 1) * TILE, TILE, T);
    cpCommit();
    cpWait<1>();
  } else {
    cpWait<0>();
  }
}`;
}

/**
 * The block order of the kernels with a grid (query tiles, heads, batches): `tile`, `h`, `b` and `kvh` from the linear
 * block index, the last query tile (the most key tiles under the causal mask) of every (head, batch) pair first.
 */
/**
 * One k-step kk of a product whose B operand is a row-major [rows][STR] tile in shared memory (P·V in the forward, dS·K
 * in both dQ kernels): acc[n] += A · B for every 8-column atom n of the HD-wide result, B's fragments of the tile's
 * rows 16kk .. 16kk + 15 by ldmatrix.trans (fragBt2), two atoms a load. `a` is the step's A fragment, `tile` the
 * tile's shared-memory address.
 */
function mmaRowBt(acc: string, a: string, tile: string): string {
  return `#pragma unroll
      for (int n = 0; n < NO; n += 2) mmaBt2(${acc}[n], ${acc}[n + 1], ${a}, ${tile}, 16 * kk, 8 * n);`;
}

/**
 * acc += P·B over a key tile of `keys` keys: per 16-key k-step kk, the A fragment packed from the fp32 accumulators
 * `scores`[2kk], [2kk + 1] (packA: P in the forward, dS in the dQ kernel), then mmaRowBt against `tile`.
 */
function productOverKeys(acc: string, scores: string, tile: string, keys: string): string {
  return `#pragma unroll
    for (int kk = 0; kk < ${keys} / 16; kk++) {
      unsigned pa[4];
      packA(pa, ${scores}[2 * kk], ${scores}[2 * kk + 1]);
${mmaRowBt(acc, 'pa', tile)}
    }`;
}

/** A query-tile kernel's block: its query tile (heaviest first), head, batch and kv head. */
const QUERY_TILE_HEAVIEST_FIRST = `  const int hb = gridDim.y * gridDim.z;
  const int lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int tile = gridDim.x - 1 - lin / hb, h = (lin % hb) % gridDim.y, b = (lin % hb) / gridDim.y, kvh = h / (nH / nKv);`;

/**
 * The forward's and the recomputing dQ kernel's block (QUERY_TILE_HEAVIEST_FIRST, then): the tile's rows [i0, iEnd), the
 * lane's fragment coordinates, the row strides, and the (batch, kv head)'s K and V.
 */
const QUERY_TILE_ROWS_KV = `${QUERY_TILE_HEAVIEST_FIRST}
  const int i0 = tile * BQ, iEnd = min(T, i0 + BQ);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const long long qs = (long long)nH * HD, ks = (long long)nKv * HD;
  const bf16* kb = k + ((long long)b * T * nKv + kvh) * HD;
  const bf16* vb = v + ((long long)b * T * nKv + kvh) * HD;`;

/**
 * The dQ kernels' store: dq = scale·acc (with `accumulate`, dq += scale·acc) for this lane's rows iA and iB below T,
 * from the accumulators acc[NO][4] (C fragments: elements 0, 1 of row iA, 2, 3 of row iB).
 */
function dqStore(accumulate: boolean): string {
  const add = (x: string): string => (accumulate ? `ldf(dq, ${x}) + ` : '');
  return [['iA', 'oa', 0], ['iB', 'ob', 2]].map(([row, o, e]) => `  if (${row} < T) {
    const long long ${o} = ((long long)b * T + ${row}) * qs + (long long)h * HD;
#pragma unroll
    for (int n = 0; n < NO; n++) {
      const long long x = ${o} + 8 * n + 2 * t;
      stf(dq, x, ${add('x')}acc[n][${e}] * SCALE); stf(dq, x + 1, ${add('x + 1')}acc[n][${Number(e) + 1}] * SCALE);
    }
  }`).join('\n');
}

/**
 * bf16 tensor-core training forward (q, k, v bf16; out f32 or bf16; lse f32, natural log). Grid (ceil(T / 64), nH, B),
 * block 128, dynamic shared memory faSmem('fwd'). A warp owns 16 query rows: Q as A fragments in registers, O as
 * HD/8 accumulator tiles. Per key tile of 64 (K and V row-major in shared memory): S = Q·Kᵀ (8 n-atoms ×
 * HD/16 k-steps), online softmax in the log2 domain on the accumulators (a row's scores live in one quad: max and sum
 * by two xor-shuffles), P packed to bf16 A fragments in registers, O += P·V. Tiles above the diagonal are never
 * visited; only the diagonal tile is masked.
 */
/**
 * Blocks per SM the forward is compiled for (__launch_bounds__), or 0 to leave registers to ptxas: 4 at hd 64, where
 * ptxas (CUDA 13, sm_90) fits it in 128 registers with an 8-byte spill (134 unbounded: 3 blocks per SM).
 */
function fwdMinBlocks(hd: number): number { return hd === 64 ? 4 : 0; }

export const attentionForwardBf16 = defineFamily<{ headDim: number; out: Dt }>({
  name: 'attention_fwd_bf16', schema: { ...faSchema, out: DTYPE_DOMAIN }, example: { headDim: 64, out: 'bf16' },
  generate: (p) => `${faPrelude(p.headDim)}
#define BQ ${FA_QUERY_TILE}
#define BK ${FA_FWD_KT}
/* the kernel's body, once without documents (DOCS false: every document test folds away, the causal window's code)
   and once with them: the kernel picks one by docPos, uniformly over the grid */
template <bool DOCS>
__device__ __forceinline__ void fwdBody(${ctype(p.out)}* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int T, int nH, int nKv,
                                        const int* docPos, unsigned char* smraw) {
  /* two buffers of a K tile and a V tile ([BK][STR] each): tile j + 1 loads (cp.async) while tile j is used; the Q
     tile [BQ][STR] is staged in buffer 1 first */
  bf16* buf = (bf16*)smraw;
  /* heaviest first: the grid (query tiles, heads, batches) is walked so that all (head, batch) pairs of the last query
     tile (the most keys under the causal mask) start first and the first tiles come last, so no long block is the tail */
${QUERY_TILE_ROWS_KV}
  /* key tiles from the one holding the tile's first row's first key (its document's start: the smallest of the tile) */
  const int jt0 = DOCS ? docStart(docPos, b, T, i0) / BK : 0;
  stageRows(buf + 2 * BK * STR, q + ((long long)b * T * nH + h) * HD, qs, i0, BQ, T);
  stageRowsAsync(buf, kb, ks, jt0 * BK, BK, T);
  stageRowsAsync(buf + BK * STR, vb, ks, jt0 * BK, BK, T);
  cpCommit();
  __syncthreads();
  const int rw = warp * 16; /* the warp's first row in the tile */
  const unsigned sbuf = smem32(buf);
  unsigned qa[KS][4];
#pragma unroll
  for (int s = 0; s < KS; s++) fragA(qa[s], sbuf + 2u * (2 * BK * STR), STR, rw, 16 * s);
  __syncthreads(); /* Q is in registers: buffer 1 is free for tile 1 */
  const int nTiles = (iEnd + BK - 1) / BK;
  const int iA = i0 + rw + g, iB = iA + 8; /* the rows of this lane's accumulator elements 0, 1 and 2, 3 */
  /* the first keys of rows iA and iB, and the largest first key of the warp's rows (its last row's, or T − 1's) */
  const int stA = DOCS ? docStart(docPos, b, T, iA) : 0, stB = DOCS ? docStart(docPos, b, T, iB) : 0;
  const int stW = DOCS ? docStart(docPos, b, T, min(i0 + rw + 15, T - 1)) : 0;
  float o[NO][4];
  zeroAcc(o);
  float mA = NEG_INF, mB = NEG_INF, lA = 0.0f, lB = 0.0f; /* running max (log2 units) and sum per row */
  for (int jt = jt0; jt < nTiles; jt++) {
    const int j0 = jt * BK;
    nextKvTile<BK>(buf, kb, vb, ks, jt, jt0, nTiles, T);
    __syncthreads(); /* tile jt is in shared memory for every warp */
    const unsigned kS = sbuf + 2u * (((jt - jt0) & 1) * 2 * BK * STR), vS = kS + 2u * (BK * STR);
    float sc[BK / 8][4];
    zeroAcc(sc);
#pragma unroll
    for (int n = 0; n < BK / 8; n += 2) {
#pragma unroll
      for (int s = 0; s < KS; s++) mmaB2(sc[n], sc[n + 1], qa[s], kS, 8 * n, 16 * s);
    }
    /* element e of atom n: row e < 2 ? iA : iB, key j0 + 8n + 2t + (e & 1); mask only where a key can pass a row or
       fall before its document. Scores stay raw (unscaled) here: the maxima scale once, and each probability is one
       FFMA and one exp2 */
    const bool diag = j0 + BK - 1 > i0 + rw || (DOCS && j0 < stW);
    float mxA = NEG_INF, mxB = NEG_INF;
#pragma unroll
    for (int n = 0; n < BK / 8; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        float x = sc[n][e];
        const int j = j0 + 8 * n + 2 * t + (e & 1);
        if (diag && (j > (e < 2 ? iA : iB) || (DOCS && j < (e < 2 ? stA : stB)))) x = NEG_INF;
        sc[n][e] = x;
        if (e < 2) mxA = fmaxf(mxA, x); else mxB = fmaxf(mxB, x);
      }
    }
    mxA = fmaxf(mxA, __shfl_xor_sync(FULL, mxA, 1)); mxA = fmaxf(mxA, __shfl_xor_sync(FULL, mxA, 2));
    mxB = fmaxf(mxB, __shfl_xor_sync(FULL, mxB, 1)); mxB = fmaxf(mxB, __shfl_xor_sync(FULL, mxB, 2));
    /* the new maxima (log2 units); -inf while a row has met none of its keys (a tile before its document: documents),
       where 0 stands in for them below so that exp2 gives 0, not NaN */
    const float nA = fmaxf(mA, mxA * SCALE_LOG2), nB = fmaxf(mB, mxB * SCALE_LOG2);
    const float zA = DOCS && nA == NEG_INF ? 0.0f : nA, zB = DOCS && nB == NEG_INF ? 0.0f : nB;
    const float aA = exp2f(mA - zA), aB = exp2f(mB - zB); /* 0 on a row's first tile with a key */
    float sA = 0.0f, sB = 0.0f;
#pragma unroll
    for (int n = 0; n < BK / 8; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float pe = exp2f(fmaf(sc[n][e], SCALE_LOG2, -(e < 2 ? zA : zB))); /* 0 for masked keys */
        sc[n][e] = pe;
        if (e < 2) sA += pe; else sB += pe;
      }
    }
    sA += __shfl_xor_sync(FULL, sA, 1); sA += __shfl_xor_sync(FULL, sA, 2);
    sB += __shfl_xor_sync(FULL, sB, 1); sB += __shfl_xor_sync(FULL, sB, 2);
    lA = lA * aA + sA; lB = lB * aB + sB; mA = nA; mB = nB;
#pragma unroll
    for (int n = 0; n < NO; n++) { o[n][0] *= aA; o[n][1] *= aA; o[n][2] *= aB; o[n][3] *= aB; }
    /* O += P·V: k-step kk covers keys j0 + 16kk .. + 15 (atoms 2kk, 2kk + 1) */
    ${productOverKeys('o', 'sc', 'vS', 'BK')}
    __syncthreads(); /* every warp is done with buffer jt & 1 before tile jt + 2 is loaded into it */
  }
  if (iA < T) {
    const float inv = 1.0f / lA;
    const long long oa = ((long long)b * T + iA) * qs + (long long)h * HD;
#pragma unroll
    for (int n = 0; n < NO; n++) st2(out, oa + 8 * n + 2 * t, o[n][0] * inv, o[n][1] * inv);
    if (t == 0) lse[((long long)b * nH + h) * T + iA] = (mA + log2f(lA)) * LN2;
  }
  if (iB < T) {
    const float inv = 1.0f / lB;
    const long long ob = ((long long)b * T + iB) * qs + (long long)h * HD;
#pragma unroll
    for (int n = 0; n < NO; n++) st2(out, ob + 8 * n + 2 * t, o[n][2] * inv, o[n][3] * inv);
    if (t == 0) lse[((long long)b * nH + h) * T + iB] = (mB + log2f(lB)) * LN2;
  }
}
extern "C" __global__ void ${fwdMinBlocks(p.headDim) ? `__launch_bounds__(NT, ${fwdMinBlocks(p.headDim)}) ` : ''}attention_fwd_bf16(${ctype(p.out)}* out, float* lse, const bf16* q, const bf16* k,
                                                                   const bf16* v, int T, int nH, int nKv, const int* docPos) {
  extern __shared__ __align__(16) unsigned char smraw[];
  if (docPos == nullptr) fwdBody<false>(out, lse, q, k, v, T, nH, nKv, docPos, smraw);
  else fwdBody<true>(out, lse, q, k, v, T, nH, nKv, docPos, smraw);
}
`,
});

/**
 * bf16 tensor-core dQ (q, k, v, dout bf16; dq f32 or bf16, accumulated: read, add, store). Grid (ceil(T / 64), nH, B),
 * block 128, dynamic shared memory faSmem('dq'); it computes D = rowsum(dout ∘ out) of its rows itself (out f32 or
 * bf16) and writes it to dsum for attention_bwd_dkv_bf16, which runs after it (no attention_bwd_pre pass). A warp owns 16
 * query rows (Q and dout as A fragments in registers, dQ as accumulators); per key tile (64 keys, 32 at hd > 64: K
 * and V row-major): S = Q·Kᵀ, dP = dO·Vᵀ, P = exp(S·scale − lse), dS = P ∘ (dP − D) packed to
 * bf16 A fragments, dQ += dS·K; dq += scale·dQ at the end (baked `accumulate` false: dq = scale·dQ, the old value never
 * read). Blocks run heaviest first (the last query tiles, which see the most keys), as the forward's.
 */
/**
 * Blocks per SM the dQ kernel is compiled for (__launch_bounds__), or 0 to leave registers to ptxas: 3 at hd 128, where
 * ptxas (CUDA 13, sm_90) fits it in 168 registers without spilling (236 unbounded: 2 blocks per SM); at hd 96 and 112
 * the bound would spill, and at hd <= 64 the kernel fits 3 blocks unbounded (a bound spills at hd 64).
 */
function dqMinBlocks(hd: number): number { return hd === 128 ? 3 : 0; }

export const attentionBackwardDqBf16 = defineFamily<{ headDim: number; dq: Dt; out: Dt; accumulate: boolean }>({
  name: 'attention_bwd_dq_bf16', schema: { ...faSchema, dq: DTYPE_DOMAIN, out: DTYPE_DOMAIN, accumulate: { kind: 'bool' } },
  example: { headDim: 64, dq: 'bf16', out: 'bf16', accumulate: true },
  generate: (p) => `${faPrelude(p.headDim)}
#define BQ ${FA_QUERY_TILE}
#define KT ${faInnerTile(p.headDim)}
extern "C" __global__ void ${dqMinBlocks(p.headDim) ? `__launch_bounds__(NT, ${dqMinBlocks(p.headDim)}) ` : ''}attention_bwd_dq_bf16(${ctype(p.dq)}* dq, float* dsum, const float* lse,
    const bf16* dout, const ${ctype(p.out)}* out, const bf16* q, const bf16* k, const bf16* v, int T, int nH, int nKv, const int* docPos) {
  __shared__ float Dsh[BQ]; /* D of the tile's rows */
  extern __shared__ __align__(16) unsigned char smraw[];
  bf16* buf = (bf16*)smraw;  /* two buffers of a K and a V tile ([KT][STR] each), loaded with cp.async one tile ahead */
  bf16* Qst = (bf16*)smraw;  /* staging before the key loop: Q [BQ][STR], then dout [BQ][STR] */
  bf16* Dst = Qst + BQ * STR;
  /* heaviest first, as the forward: the last query tile (the most key tiles under the causal mask) of every (head,
     batch) pair starts first and the first tiles come last, so no long block is the tail */
${QUERY_TILE_ROWS_KV}
  stageRows(Qst, q + ((long long)b * T * nH + h) * HD, qs, i0, BQ, T);
  stageRows(Dst, dout + ((long long)b * T * nH + h) * HD, qs, i0, BQ, T);
  __syncthreads();
  {
    /* D = rowsum(dout ∘ out) of the tile's rows (the backward's first stage, here instead of a separate pass): a thread
       pair per row, each summing half its head dims in order (dout from the staged tile, out from global memory, 16
       bytes a load), then the pair's two halves; written to dsum for the dK/dV kernel, which runs after this one */
    const int r = threadIdx.x >> 1, c0 = (threadIdx.x & 1) * (HD / 2);
    float sd = 0.0f;
    if (i0 + r < T) {
      const ${ctype(p.out)}* orow = out + ((long long)b * T + i0 + r) * qs + (long long)h * HD + c0;
      const bf16* drow = Dst + r * STR + c0;
#pragma unroll
      for (int c = 0; c < HD / 2; c += 8) {
        const uint4 d8 = *(const uint4*)(drow + c);
        const bf16* dh = (const bf16*)&d8;
        ${p.out === 'bf16' ? `const uint4 o8 = *(const uint4*)(orow + c);
        const bf16* oh = (const bf16*)&o8;` : `const float4 oa = *(const float4*)(orow + c), ob = *(const float4*)(orow + c + 4);
        const float oh[8] = { oa.x, oa.y, oa.z, oa.w, ob.x, ob.y, ob.z, ob.w };`}
#pragma unroll
        for (int e = 0; e < 8; e++) sd = fmaf(ldf(dh, e), ${p.out === 'bf16' ? 'ldf(oh, e)' : 'oh[e]'}, sd);
      }
    }
    sd += __shfl_xor_sync(FULL, sd, 1);
    if ((threadIdx.x & 1) == 0) {
      Dsh[r] = sd;
      if (i0 + r < T) dsum[((long long)b * nH + h) * T + i0 + r] = sd;
    }
  }
  const int rw = warp * 16;
  const unsigned sbuf = smem32(buf);
  unsigned qa[KS][4], da[KS][4];
#pragma unroll
  for (int s = 0; s < KS; s++) { fragA(qa[s], smem32(Qst), STR, rw, 16 * s); fragA(da[s], smem32(Dst), STR, rw, 16 * s); }
  __syncthreads(); /* Q and dout are in registers: the staging area takes the K and V tiles */
  /* key tiles from the one holding the tile's first row's first key (as the forward) */
  const int jt0 = docStart(docPos, b, T, i0) / KT;
  stageRowsAsync(buf, kb, ks, jt0 * KT, KT, T);
  stageRowsAsync(buf + KT * STR, vb, ks, jt0 * KT, KT, T);
  cpCommit();
  const int nTiles = (iEnd + KT - 1) / KT;
  const int iA = i0 + rw + g, iB = iA + 8;
  const int stA = docStart(docPos, b, T, iA), stB = docStart(docPos, b, T, iB), stW = docStart(docPos, b, T, min(i0 + rw + 15, T - 1));
  const float* lb = lse + ((long long)b * nH + h) * T;
  const float lA = iA < T ? lb[iA] * LOG2E : 0.0f, lB = iB < T ? lb[iB] * LOG2E : 0.0f;
  const float dA = Dsh[rw + g], dB = Dsh[rw + g + 8]; /* 0 past T */
  float acc[NO][4];
  zeroAcc(acc);
  for (int jt = jt0; jt < nTiles; jt++) {
    const int j0 = jt * KT;
    nextKvTile<KT>(buf, kb, vb, ks, jt, jt0, nTiles, T);
    __syncthreads(); /* tile jt is in shared memory for every warp */
    const unsigned kS = sbuf + 2u * (((jt - jt0) & 1) * 2 * KT * STR), vS = kS + 2u * (KT * STR);
    float sc[KT / 8][4], dp[KT / 8][4];
    zeroAcc(sc);
    zeroAcc(dp);
#pragma unroll
    for (int n = 0; n < KT / 8; n += 2) {
#pragma unroll
      for (int s = 0; s < KS; s++) {
        mmaB2(sc[n], sc[n + 1], qa[s], kS, 8 * n, 16 * s);
        mmaB2(dp[n], dp[n + 1], da[s], vS, 8 * n, 16 * s);
      }
    }
    /* element e of atom n: row e < 2 ? iA : iB, key j0 + 8n + 2t + (e & 1); rows past T, keys past the row and keys
       before its document are 0 */
    const bool full = j0 + KT - 1 <= i0 + rw && i0 + rw + 15 < T && j0 >= stW;
#pragma unroll
    for (int n = 0; n < KT / 8; n++) {
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const int i = e < 2 ? iA : iB, j = j0 + 8 * n + 2 * t + (e & 1);
        float pe = exp2f(sc[n][e] * SCALE_LOG2 - (e < 2 ? lA : lB));
        if (!full && (j > i || i >= T || j < (e < 2 ? stA : stB))) pe = 0.0f;
        sc[n][e] = pe * (dp[n][e] - (e < 2 ? dA : dB));
      }
    }
    /* dQ += dS·K: k-step kk covers keys j0 + 16kk .. + 15 */
    ${productOverKeys('acc', 'sc', 'kS', 'KT')}
    __syncthreads(); /* every warp is done with buffer jt & 1 before tile jt + 2 is loaded into it */
  }
${dqStore(p.accumulate)}
}
`,
});

/**
 * bf16 tensor-core dK/dV (q, k, v, dout bf16; dk, dv f32 or bf16, accumulated). Grid (ceil(T / 64), nKv·S, B), block
 * 128, dynamic shared memory faSmem('dkv'). The block's 64 keys of one kv head (K and V row-major in shared memory; a
 * warp owns 16 keys, dK and dV as accumulators) walk the query tiles (64 rows, 32 at hd > 64) from the diagonal down,
 * for each query head of the block's split of the GQA group in order: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, Pᵀ = exp(Sᵀ·scale − lse),
 * dSᵀ = Pᵀ ∘ (dPᵀ − D), dV += Pᵀ·dO, dK += dSᵀ·Q (Q and dout staged row-major). S = 1 adds (baked `accumulate` false: stores) scale·dK and
 * dV into dk/dv; S > 1 writes per-split f32 partials that attention_dkv_reduce sums in split order (as attention_bwd_dkv).
 */
/**
 * Blocks per SM the dK/dV kernel is compiled for (__launch_bounds__), or 0 to leave registers to ptxas: 3 at hd 64
 * (168 registers against 211 unbounded, which fits 2 blocks; local ptxas spills ~100 bytes, in L1): on an H100 the
 * student's dK/dV (14/2 heads, 8 x 1024) takes 190 us against 212 (session 19, docs/measurements; query tiles
 * of 32 instead, 162 registers and no spill, took 200). At hd 128 a bound of 3 spills more and cost 30% (session 18).
 */
function dkvMinBlocks(hd: number): number { return hd === 64 ? 3 : 0; }

type DkvP = { headDim: number; dk: Dt; dv: Dt; accumulate: boolean };

/**
 * The dK/dV kernel's source; with `storeDs` (attention_bwd_dkv_ds_bf16) it also writes every tile of
 * dSᵀ it computes, as bf16, to `ds` (dsScratchElems) for attention_bwd_dq_ds_bf16; without it the source is exactly
 * attention_bwd_dkv_bf16's.
 */
function dkvSource(p: Readonly<DkvP>, storeDs: boolean): string {
  const name = storeDs ? 'attention_bwd_dkv_ds_bf16' : 'attention_bwd_dkv_bf16';
  return `${faPrelude(p.headDim)}
#define BKV ${FA_KEY_TILE}
#define QT ${faInnerTile(p.headDim)}
extern "C" __global__ void ${dkvMinBlocks(p.headDim) ? `__launch_bounds__(NT, ${dkvMinBlocks(p.headDim)}) ` : ''}${name}(${ctype(p.dk)}* dk, ${ctype(p.dv)}* dv, float* part,
    ${storeDs ? 'bf16* ds, ' : ''}const float* dsum, const float* lse, const bf16* dout, const bf16* q, const bf16* k, const bf16* v, int T, int nH, int nKv,
    const int* docPos) {
  extern __shared__ __align__(16) unsigned char smraw[];
  bf16* Ks = (bf16*)smraw;      /* [BKV][STR] */
  bf16* Vs = Ks + BKV * STR;    /* [BKV][STR] */
  /* two buffers of a query tile: Q [QT][STR], dout [QT][STR]; then two of lse [QT] and D [QT] (cp.async one tile ahead) */
  bf16* qbuf = Vs + BKV * STR;
  float* lbuf = (float*)(qbuf + 4 * QT * STR);
  /* heaviest first: the grid (key tiles, kv heads·S, batches) is walked so that the first key tile of every (kv head
     split, batch) pair, which sees every query tile under the causal mask, starts first and the last key tiles (one
     query tile each) come last, so no long block is the tail (as the forward and dQ kernels) */
  const int yz = gridDim.y * gridDim.z;
  const int lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int bx = lin / yz, by = (lin % yz) % gridDim.y, b = (lin % yz) / gridDim.y;
  /* by = kvh·S + s: split s of S walks query heads [g0, g1) of the kv head's group */
  const int G = nH / nKv, S = gridDim.y / nKv, kvh = by / S, s = by - kvh * S;
  const int g0 = s * G / S, g1 = (s + 1) * G / S;
  const int j0 = bx * BKV;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const long long qs = (long long)nH * HD, ks = (long long)nKv * HD;
  stageRows(Ks, k + ((long long)b * T * nKv + kvh) * HD, ks, j0, BKV, T);
  stageRows(Vs, v + ((long long)b * T * nKv + kvh) * HD, ks, j0, BKV, T);
  const int rw = warp * 16;
  const int jA = j0 + rw + g, jB = jA + 8; /* the keys of this lane's accumulator elements 0, 1 and 2, 3 */
  float adk[NO][4], adv[NO][4];
  zeroAcc(adk);
  zeroAcc(adv);
  /* the block's work: for each query head of its split, the query tiles from the key tile's diagonal down (only rows
     i >= j0 see any of its keys), one sequence so the next tile loads while this one is used, across head boundaries.
     With documents, only rows below iLim see them: iLim is the first row whose document starts after the block's last
     key (starts never decrease: a binary search), rounded up to a 64-row tile of the dS triangle, so that every tile
     the stored-dS dQ kernel reads (those whose first row's document starts at or before a key of the block) is
     written whole */
  int iLim = T;
  if (docPos != nullptr && j0 < T) {
    int lo = j0, hi = T; /* the first i in [j0, T) with docStart(i) > j0 + BKV - 1, or T */
    while (lo < hi) { const int mid = (lo + hi) >> 1; if (docStart(docPos, b, T, mid) > j0 + BKV - 1) hi = mid; else lo = mid + 1; }
    iLim = min(T, (lo + 63) / 64 * 64);
  }
  const int perHead = j0 < T ? (iLim - j0 + QT - 1) / QT : 0, nTiles = (g1 - g0) * perHead;
  /* issues the loads of tile it into buffer it & 1 */
  auto issue = [&](int it) {
    const int h = kvh * G + g0 + it / perHead, i0 = j0 + (it % perHead) * QT;
    bf16* qd = qbuf + (it & 1) * 2 * QT * STR;
    float* ld = lbuf + (it & 1) * 2 * QT;
    stageRowsAsync(qd, q + ((long long)b * T * nH + h) * HD, qs, i0, QT, T);
    stageRowsAsync(qd + QT * STR, dout + ((long long)b * T * nH + h) * HD, qs, i0, QT, T);
    for (int x = threadIdx.x; x < QT; x += NT) {
      const bool ok = i0 + x < T;
      cpAsync4(ld + x, lse + ((long long)b * nH + h) * T + (ok ? i0 + x : 0), ok);
      cpAsync4(ld + QT + x, dsum + ((long long)b * nH + h) * T + (ok ? i0 + x : 0), ok);
    }
    cpCommit();
  };
  if (nTiles > 0) issue(0);
  for (int it = 0; it < nTiles; it++) {
    const int i0 = j0 + (it % perHead) * QT;
    if (it + 1 < nTiles) { issue(it + 1); cpWait<1>(); } else cpWait<0>();
    __syncthreads(); /* tile it (and, the first time, K and V) is in shared memory for every warp */
    {
      const unsigned qS = smem32(qbuf + (it & 1) * 2 * QT * STR), oS = qS + 2u * (QT * STR);
      const float* Ls = lbuf + (it & 1) * 2 * QT; /* lse (natural log) */
      const float* Dm = Ls + QT;                  /* D */
      float sc[QT / 8][4], dp[QT / 8][4];
      zeroAcc(sc);
      zeroAcc(dp);
#pragma unroll
      for (int ss = 0; ss < KS; ss++) {
        unsigned ka[4], va[4];
        fragA(ka, smem32(Ks), STR, rw, 16 * ss);
        fragA(va, smem32(Vs), STR, rw, 16 * ss);
#pragma unroll
        for (int n = 0; n < QT / 8; n += 2) {
          mmaB2(sc[n], sc[n + 1], ka, qS, 8 * n, 16 * ss);
          mmaB2(dp[n], dp[n + 1], va, oS, 8 * n, 16 * ss);
        }
      }
      /* element e of atom n: key e < 2 ? jA : jB, query i0 + 8n + 2t + (e & 1); queries past T, before the key, or whose
         document starts after it are 0 (the tile's last row has its largest start) */
      const bool full = j0 + rw + 15 <= i0 && i0 + QT <= T && docStart(docPos, b, T, i0 + QT - 1) <= j0 + rw;
#pragma unroll
      for (int n = 0; n < QT / 8; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int ci = 8 * n + 2 * t + (e & 1), i = i0 + ci, j = e < 2 ? jA : jB;
          float pe = exp2f(sc[n][e] * SCALE_LOG2 - Ls[ci] * LOG2E);
          if (!full && (j > i || i >= T || j < docStart(docPos, b, T, i))) pe = 0.0f;
          sc[n][e] = pe;
          dp[n][e] = pe * (dp[n][e] - Dm[ci]);
        }
      }${storeDs ? `
      {
        /* dSᵀ of this tile, rounded to bf16 as the dK product rounds it, into its 64 × 64 tile of ds (the (query tile,
           key tile) pair's slot of the causal triangle) in 8 × 8 blocks [key block][query block][key][query]
           (dsScratchElems): the 32 lanes' words of one accumulator half of one atom are one block, 128 contiguous
           bytes, so each store instruction is one coalesced line */
        const int h = kvh * G + g0 + it / perHead, iq = i0 / 64, nT = (T + 63) / 64;
        bf16* dt = ds + ((((long long)b * nH + h) * (nT * (nT + 1) / 2) + iq * (iq + 1) / 2 + j0 / 64) << 12) + 8 * g + 2 * t;
        const int qb = (i0 & 63) >> 3;
#pragma unroll
        for (int n = 0; n < QT / 8; n++) {
          *(unsigned*)(dt + ((2 * warp) * 8 + qb + n) * 64) = pack2(dp[n][0], dp[n][1]);
          *(unsigned*)(dt + ((2 * warp + 1) * 8 + qb + n) * 64) = pack2(dp[n][2], dp[n][3]);
        }
      }` : ''}
      /* dV += Pᵀ·dO, dK += dSᵀ·Q: k-step kk covers queries i0 + 16kk .. + 15 */
#pragma unroll
      for (int kk = 0; kk < QT / 16; kk++) {
        unsigned pa[4], sa[4];
        packA(pa, sc[2 * kk], sc[2 * kk + 1]);
        packA(sa, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
        for (int n = 0; n < NO; n += 2) {
          mmaBt2(adv[n], adv[n + 1], pa, oS, 16 * kk, 8 * n);
          mmaBt2(adk[n], adk[n + 1], sa, qS, 16 * kk, 8 * n);
        }
      }
    }
    __syncthreads(); /* every warp is done with buffer it & 1 before tile it + 2 is loaded into it */
  }
  const long long half = (long long)gridDim.z * gridDim.y * T * HD;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int j = r == 0 ? jA : jB;
    if (j < T) {
      const long long off = ((long long)b * T + j) * ks + (long long)kvh * HD;
      /* partials [b][kvh][s][j][HD] (dk), then the same again for dv; attention_dkv_reduce sums s in order */
      const long long po = ((((long long)b * nKv + kvh) * S + s) * T + j) * HD;
#pragma unroll
      for (int n = 0; n < NO; n++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int d = 8 * n + 2 * t + e;
          const float vk = adk[n][2 * r + e] * SCALE, vv = adv[n][2 * r + e];
          if (S == 1) {
            stf(dk, off + d, ${p.accumulate ? 'ldf(dk, off + d) + ' : ''}vk);
            stf(dv, off + d, ${p.accumulate ? 'ldf(dv, off + d) + ' : ''}vv);
          } else {
            part[po + d] = vk;
            part[half + po + d] = vv;
          }
        }
      }
    }
  }
}
`;
}

export const attentionBackwardDkvBf16 = defineFamily<DkvP>({
  name: 'attention_bwd_dkv_bf16', schema: { ...faSchema, dk: DTYPE_DOMAIN, dv: DTYPE_DOMAIN, accumulate: { kind: 'bool' } },
  example: { headDim: 64, dk: 'bf16', dv: 'bf16', accumulate: true },
  generate: (p) => dkvSource(p, false),
});

/**
 * The stored-dS backward's dK/dV kernel (the default backward, see the header): S and dP are computed once per (query
 * tile, key tile) pair, as FlashAttention-2's are, but deterministically: this dK/dV kernel (attention_bwd_dkv_bf16
 * plus one store) writes each tile of dSᵀ it computes to a bf16 scratch, and attention_bwd_dq_ds_bf16 then forms
 * dQ = scale·dS·K from it with one product per pair and no exponentials (five products per pair against seven, for 2
 * bytes per causal score written and read). D must exist first (attention_bwd_pre). Scratch: dsScratchElems.
 */
export const attentionBackwardDkvDsBf16 = defineFamily<DkvP>({
  name: 'attention_bwd_dkv_ds_bf16', schema: { ...faSchema, dk: DTYPE_DOMAIN, dv: DTYPE_DOMAIN, accumulate: { kind: 'bool' } },
  example: { headDim: 64, dk: 'bf16', dv: 'bf16', accumulate: true },
  generate: (p) => dkvSource(p, true),
});

/**
 * The dS scratch of the stored-dS backward, in bf16 elements: for each (batch, query head), the causal triangle of
 * 64 × 64 tiles, tile (query tile iq, key tile jk ≤ iq) at slot iq(iq + 1)/2 + jk, each of 8 × 8 blocks
 * [key / 8][query / 8][key % 8][query % 8] (128 contiguous bytes a block: one coalesced store per warp in the dK/dV
 * kernel, one ldmatrix matrix in the dQ kernel), zero where the key is past the query. Query rows past T: zero in the
 * 32-row half the dK/dV kernel visits; at head dims above 64 (32-row query tiles) a last tile's half that starts at or
 * past T is never written and keeps stale (finite) values, which reach only dQ rows past T, which are not stored.
 */
export function dsScratchElems(b: number, nH: number, t: number): number {
  const nT = Math.ceil(t / FA_KEY_TILE);
  return b * nH * (nT * (nT + 1) / 2) * FA_KEY_TILE * FA_KEY_TILE;
}
/** Dynamic shared memory of attention_bwd_dq_ds_bf16: two buffers of a dS tile (64 × 64, as stored) and a K tile [64][HD + 8]. */
export function dqDsSmem(hd: number): number { return 2 * 2 * (FA_KEY_TILE * FA_QUERY_TILE + FA_KEY_TILE * (hd + 8)); }

/**
 * With attention_bwd_dkv_ds_bf16 (which must run first): dq (+)= scale · Σ_j dS_ij k_j from the stored dS
 * tiles. Grid (ceil(T / 64), nH, B), block 128, dynamic shared memory dqDsSmem(hd); heaviest first as the dQ kernel. A
 * warp owns 16 query rows; per key tile j ≤ the query tile (the dSᵀ tile and the K tile staged with cp.async, one
 * ahead): the A fragments of dS come from the [key][query] tile by ldmatrix.trans, the B fragments of K as in the dQ
 * kernel. The diagonal tile needs no mask: its dS is zero above the diagonal.
 */
export const attentionBackwardDqDsBf16 = defineFamily<{ headDim: number; dq: Dt; accumulate: boolean }>({
  name: 'attention_bwd_dq_ds_bf16', schema: { ...faSchema, dq: DTYPE_DOMAIN, accumulate: { kind: 'bool' } },
  example: { headDim: 64, dq: 'bf16', accumulate: true },
  generate: (p) => `${faPrelude(p.headDim)}
#define BQ ${FA_QUERY_TILE}
#define BK ${FA_KEY_TILE}
#define DSTILE (BK * BQ)
/* the A fragment (rows = queries r..r+15, k = keys c..c+15) of dS from a tile of 8 × 8 [key][query] blocks
   (dsScratchElems) in one ldmatrix.x4.trans, one block a matrix: lanes 0-7 address the rows (keys) of block (c, r) (a0:
   queries g, keys 2t..), 8-15 of (c, r+8) (a1), 16-23 of (c+8, r) (a2), 24-31 of (c+8, r+8) (a3); a block's 8 rows
   are 128 contiguous bytes (conflict-free) */
__device__ __forceinline__ void fragAt(unsigned* a, unsigned base, int r, int c) {
  const int l = threadIdx.x & 31;
  const int blk = ((c >> 3) + (l >> 4)) * (BQ / 8) + (r >> 3) + ((l >> 3) & 1);
  ldsmT4(a[0], a[1], a[2], a[3], base + 2u * (blk * 64 + (l & 7) * 8));
}
/* one 64 × 64 bf16 dS tile (8 KiB, contiguous) into shared memory as it is stored, with cp.async, 16 bytes a copy */
__device__ __forceinline__ void stageDsAsync(bf16* sh, const bf16* src) {
  for (int x = threadIdx.x; x < DSTILE / 8; x += NT) cpAsync16(sh + 8 * x, src + 8 * x, true);
}
extern "C" __global__ void attention_bwd_dq_ds_bf16(${ctype(p.dq)}* dq, const bf16* ds, const bf16* k, int T, int nH, int nKv,
                                                    const int* docPos) {
  extern __shared__ __align__(16) unsigned char smraw[];
  bf16* buf = (bf16*)smraw; /* two buffers of [dS tile (DSTILE, as stored), K tile [BK][STR]] */
${QUERY_TILE_HEAVIEST_FIRST}
  const int i0 = tile * BQ, nT = (T + BK - 1) / BK;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const long long qs = (long long)nH * HD, ks = (long long)nKv * HD;
  const bf16* kb = k + ((long long)b * T * nKv + kvh) * HD;
  /* this query tile's row of the triangle: tiles (tile, 0 .. tile) are consecutive */
  const bf16* dsRow = ds + ((((long long)b * nH + h) * (nT * (nT + 1) / 2) + tile * (tile + 1) / 2) << 12);
  const int nTiles = tile + 1;
  /* key tiles from the one holding the tile's first row's first key: the dK/dV kernel wrote exactly these (documents) */
  const int jt0 = docStart(docPos, b, T, i0) / BK;
  const int bufElems = DSTILE + BK * STR;
  stageDsAsync(buf, dsRow + ((long long)jt0 << 12));
  stageRowsAsync(buf + DSTILE, kb, ks, jt0 * BK, BK, T);
  cpCommit();
  const int rw = warp * 16;
  const unsigned sbuf = smem32(buf);
  float acc[NO][4];
  zeroAcc(acc);
  for (int jt = jt0; jt < nTiles; jt++) {
    if (jt + 1 < nTiles) {
      bf16* nb = buf + ((jt + 1 - jt0) & 1) * bufElems;
      stageDsAsync(nb, dsRow + ((long long)(jt + 1) << 12));
      stageRowsAsync(nb + DSTILE, kb, ks, (jt + 1) * BK, BK, T);
      cpCommit();
      cpWait<1>();
    } else {
      cpWait<0>();
    }
    __syncthreads(); /* tile jt is in shared memory for every warp */
    const unsigned dS = sbuf + 2u * (((jt - jt0) & 1) * bufElems), kS = dS + 2u * DSTILE;
    /* dQ += dS·K: k-step kk covers keys jt·64 + 16kk .. + 15 */
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
      unsigned sa[4];
      fragAt(sa, dS, rw, 16 * kk);
${mmaRowBt('acc', 'sa', 'kS')}
    }
    __syncthreads(); /* every warp is done with buffer jt & 1 before tile jt + 2 is loaded into it */
  }
  const int iA = i0 + rw + g, iB = iA + 8;
${dqStore(p.accumulate)}
}
`,
});
