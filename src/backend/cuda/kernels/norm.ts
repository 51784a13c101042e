/**
 * RMSNorm kernels: forward (saves rstd), the residual add fused with the forward, input backward, and the
 * weight-gradient column reduction.
 * Baked: eps (forwards only), C (row width), block size, and the dtype ('f32' | 'bf16') of every float operand that
 * may be either: out, inp, weight (forward); sum, out, a, b, weight (fused add); dinp, dout, inp, weight (backward); dout, inp (weight gradient).
 * rstd and the column partials are always float32. Compute is float32; bf16 stores round once (dinp += reads the
 * old value, adds in float, rounds the sum).
 */
import { BLOCK_DOMAIN, DTYPE_DOMAIN, OPTIONAL_DTYPE_DOMAIN, ctype as T, defineFamily, dtypeHelpers, f32, reductionHelpers } from './spec.js';

type NormP = { eps: number; C: number; out: string; inp: string; weight: string; block: number };

/** Grid: one block per row. out/rstd/inp/weight, n rows. */
export const rmsnormForward = defineFamily<NormP>({
  name: 'rmsnorm_fwd',
  schema: {
    eps: { kind: 'float', min: 0 }, C: { kind: 'int', min: 1 }, out: DTYPE_DOMAIN, inp: DTYPE_DOMAIN, weight: DTYPE_DOMAIN,
    block: BLOCK_DOMAIN,
  },
  example: { eps: 1e-6, C: 896, out: 'bf16', inp: 'f32', weight: 'bf16', block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
#define C ${p.C}
#define EPS ${f32(p.eps)}
${reductionHelpers()}
${dtypeHelpers()}
extern "C" __global__ void rmsnorm_fwd(${T(p.out)}* out, float* rstd, const ${T(p.inp)}* inp, const ${T(p.weight)}* w, int n) {
  int row = blockIdx.x;
  if (row >= n) return;
  const ${T(p.inp)}* x = inp + (long long)row * C;
  ${T(p.out)}* y = out + (long long)row * C;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < C; i += BLOCK) { float v = ldf(x, i); ss += v * v; }
  ss = blockSum(ss);
  float r = 1.0f / sqrtf(ss / (float)C + EPS);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int i = threadIdx.x; i < C; i += BLOCK) stf(y, i, ldf(x, i) * r * ldf(w, i));
}
`,
});

type AddNormP = { eps: number; C: number; sum: string; out: string; a: string; b: string; weight: string; block: number };

/** Elements per thread up to which add_rmsnorm_fwd keeps its row slice in registers (C ≤ 8192 at block 256). */
export const ADD_NORM_MAX_REGS = 32;

/**
 * Grid: one block per row. The residual add fused with the norm that reads it: sum = a + b, then rmsnorm_fwd over
 * the stored sum (a bf16 sum is rounded before the norm reads it). Each thread loads all its elements of the row
 * (i = threadIdx.x + j·BLOCK) into registers, then stores the sums and keeps them there for the norm, so a and b are
 * read once and the sum is never re-read; the per-thread order of the sum of squares and the per-element float ops
 * are rmsnorm_fwd's, so with the same block the results are bit-identical to add followed by rmsnorm_fwd. Rows wider
 * than ADD_NORM_MAX_REGS·BLOCK re-read the sum each thread stored itself. sum may alias a or b, exactly (each element
 * is read, then written, by one thread); the backend refuses partial overlaps.
 */
export const addRmsnormForward = defineFamily<AddNormP>({
  name: 'add_rmsnorm_fwd',
  schema: {
    eps: { kind: 'float', min: 0 }, C: { kind: 'int', min: 1 }, sum: DTYPE_DOMAIN, out: DTYPE_DOMAIN, a: DTYPE_DOMAIN, b: DTYPE_DOMAIN,
    weight: DTYPE_DOMAIN, block: BLOCK_DOMAIN,
  },
  example: { eps: 1e-6, C: 896, sum: 'f32', out: 'bf16', a: 'f32', b: 'f32', weight: 'bf16', block: 256 },
  generate: (p) => {
    const nv = Math.ceil(p.C / p.block);
    // The value the norm reads: what was stored into sum.
    const stored = (v: string): string => (p.sum === 'bf16' ? `bf2f(f2bf(${v}))` : v);
    const head = `#define BLOCK ${p.block}
#define C ${p.C}
#define EPS ${f32(p.eps)}
${reductionHelpers()}
${dtypeHelpers()}
extern "C" __global__ void add_rmsnorm_fwd(${T(p.sum)}* sum, ${T(p.out)}* out, float* rstd, const ${T(p.a)}* a, const ${T(p.b)}* b,
                                           const ${T(p.weight)}* w, int n) {
  int row = blockIdx.x;
  if (row >= n) return;
  const long long base = (long long)row * C;
  float ss = 0.0f;`;
    const norm = `  ss = blockSum(ss);
  float r = 1.0f / sqrtf(ss / (float)C + EPS);
  if (threadIdx.x == 0) rstd[row] = r;`;
    if (nv > ADD_NORM_MAX_REGS) {
      return `${head}
  for (int i = threadIdx.x; i < C; i += BLOCK) {
    stf(sum, base + i, ldf(a, base + i) + ldf(b, base + i));
    float v = ldf(sum, base + i); ss += v * v;
  }
${norm}
  for (int i = threadIdx.x; i < C; i += BLOCK) stf(out, base + i, ldf(sum, base + i) * r * ldf(w, i));
}
`;
    }
    const guard = p.C % p.block === 0 ? '' : 'if (i < C) ';
    return `${head}
  float v[${nv}];
  // every load before the first store: sum may alias a or b, which would otherwise serialize each load behind a store
#pragma unroll
  for (int j = 0; j < ${nv}; j++) {
    int i = threadIdx.x + j * BLOCK;
    ${guard}v[j] = ldf(a, base + i) + ldf(b, base + i);
  }
#pragma unroll
  for (int j = 0; j < ${nv}; j++) {
    int i = threadIdx.x + j * BLOCK;
    ${guard}{ stf(sum, base + i, v[j]); v[j] = ${stored('v[j]')}; ss += v[j] * v[j]; }
  }
${norm}
#pragma unroll
  for (int j = 0; j < ${nv}; j++) {
    int i = threadIdx.x + j * BLOCK;
    ${guard}stf(out, base + i, v[j] * r * ldf(w, i));
  }
}
`;
  },
});

/**
 * The body of both norm backwards' row loop (one row `row`; a thread's NV columns i = `col` over j): loads dout, inp
 * and the old dinp once, all before any store (so the loads overlap, one memory round trip per row, instead of one per
 * column behind each store: 1.25x faster at 8192 rows of 1536 on an H100), accumulates dw += dout ⊙ inp · rstd in
 * registers, reduces dot = Σ dout·w·inp with `sum` (blockSum: a block per row; warpSum: a warp per row) and stores
 * dinp + the row's input gradient into dinp (and, with `copy`, the value dinp now holds into dcopy, rounded to its
 * dtype; registers wv and dw set up before). Generated text, so both kernels' sources read as written out.
 */
function normBackwardRow(col: string, sum: 'blockSum' | 'warpSum', copy: string, dinpDt: string): string {
  // what dinp holds after the store (its dtype's rounding of v): the copy receives that
  const held = dinpDt === 'bf16' ? 'bf2f(f2bf(v))' : 'v';
  return `    const long long base = (long long)row * C;
    const float r = rstd[row];
    float g[NV], x[NV], o[NV];
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; j++) {
      const int i = ${col};
      g[j] = i < C ? ldf(dout, base + i) : 0.0f;
      x[j] = i < C ? ldf(inp, base + i) : 0.0f;
      o[j] = i < C ? ldf(dinp, base + i) : 0.0f;
      dot += g[j] * wv[j] * x[j];
      dw[j] += g[j] * x[j] * r;
    }
    dot = ${sum}(dot);
    const float k = dot * r * r * r / (float)C;
#pragma unroll
    for (int j = 0; j < NV; j++) {
      const int i = ${col};
      if (i < C) {
        const float v = o[j] + (r * wv[j] * g[j] - x[j] * k);
        stf(dinp, base + i, v);${copy === 'none' ? '' : `
        stf(dcopy, base + i, ${held});`}
      }
    }`;
}

/** `copy`: 'none', or the dtype of a second output that receives dinp's new values too (the next products' operand). */
type NormBwdP = { C: number; dinp: string; dout: string; inp: string; weight: string; block: number; copy: string };

/**
 * Grid: R blocks (R fixed by the host from n and C, so the result is deterministic); block b takes rows b, b + R, ...
 * Per row (a block per row, NV = ceil(C / BLOCK) columns per thread, kept in registers): dinp += d(out)/d(inp)ᵀ dout;
 * and, over its rows, each thread sums dout ⊙ inp · rstd for its columns, written to part[b·C + col] (float32) where
 * part is not null; col_reduce then adds Σ_b part[b, col] (in b order) into dweight. One pass over dout and inp
 * serves both gradients (a separate weight-gradient kernel read them again). With `copy`, dcopy receives each new dinp
 * value as well, rounded to its dtype (a bf16 model's residual gradient as the next products' operand: no conversion pass).
 */
export const rmsnormBackward = defineFamily<NormBwdP>({
  name: 'rmsnorm_bwd',
  schema: { C: { kind: 'int', min: 1 }, dinp: DTYPE_DOMAIN, dout: DTYPE_DOMAIN, inp: DTYPE_DOMAIN, weight: DTYPE_DOMAIN, block: BLOCK_DOMAIN, copy: OPTIONAL_DTYPE_DOMAIN },
  example: { C: 896, dinp: 'f32', dout: 'f32', inp: 'f32', weight: 'bf16', block: 256, copy: 'bf16' },
  generate: (p) => `#define BLOCK ${p.block}
#define C ${p.C}
#define NV ${Math.ceil(p.C / p.block)}
${reductionHelpers()}
${dtypeHelpers()}
extern "C" __global__ void rmsnorm_bwd(${T(p.dinp)}* dinp, float* part, const ${T(p.dout)}* dout, const ${T(p.inp)}* inp,
                                       const ${T(p.weight)}* w, const float* rstd, int n${p.copy === 'none' ? '' : `, ${T(p.copy)}* dcopy`}) {
  float wv[NV], dw[NV];
#pragma unroll
  for (int j = 0; j < NV; j++) { const int i = threadIdx.x + j * BLOCK; wv[j] = i < C ? ldf(w, i) : 0.0f; dw[j] = 0.0f; }
  /* the loop is block-uniform: every thread takes the same rows, so blockSum's barriers are reached by all */
  for (int row = blockIdx.x; row < n; row += gridDim.x) {
${normBackwardRow('threadIdx.x + j * BLOCK', 'blockSum', p.copy, p.dinp)}
  }
  if (part) {
#pragma unroll
    for (int j = 0; j < NV; j++) { const int i = threadIdx.x + j * BLOCK; if (i < C) part[(long long)blockIdx.x * C + i] = dw[j]; }
  }
}
`,
});

/**
 * Widest row the warp-per-row norms take (Qwen3's per-head q/k norms: head_dim 128); wider rows use one block per row.
 * (A warp-per-row backward up to 1024 columns measured no faster than the block-per-row one at 896 and slower at 1024
 * on an H100, session 17: not kept.)
 */
export const ROWS_NORM_MAX_C = 256;
/** Rows (warps) per block of the warp-per-row norms. */
export const ROWS_NORM_WARPS = 8;

type RowsNormP = { eps: number; C: number; out: string; inp: string; weight: string };

/**
 * Grid: ceil(n / ROWS_NORM_WARPS) blocks of 32·ROWS_NORM_WARPS threads; one warp per row (C ≤ ROWS_NORM_MAX_C, each lane
 * keeps its ≤ 8 elements in registers). rmsnorm_fwd for many short rows (Qwen3's q/k norms: b·t·heads rows of
 * head_dim), where a block per row would leave most of its threads idle.
 */
export const rmsnormRowsForward = defineFamily<RowsNormP>({
  name: 'rmsnorm_rows_fwd',
  schema: { eps: { kind: 'float', min: 0 }, C: { kind: 'int', min: 1, max: ROWS_NORM_MAX_C }, out: DTYPE_DOMAIN, inp: DTYPE_DOMAIN, weight: DTYPE_DOMAIN },
  example: { eps: 1e-6, C: 128, out: 'bf16', inp: 'bf16', weight: 'bf16' },
  generate: (p) => `#define C ${p.C}
#define NV ${Math.ceil(p.C / 32)}
#define WARPS ${ROWS_NORM_WARPS}
#define EPS ${f32(p.eps)}
#define BLOCK (32 * WARPS)
${reductionHelpers()}
${dtypeHelpers()}
extern "C" __global__ void rmsnorm_rows_fwd(${T(p.out)}* out, float* rstd, const ${T(p.inp)}* inp, const ${T(p.weight)}* w, int n) {
  const int row = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= n) return;  // the whole warp leaves together
  const long long base = (long long)row * C;
  float v[NV];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; j++) {
    const int i = lane + 32 * j;
    v[j] = i < C ? ldf(inp, base + i) : 0.0f;
    ss += v[j] * v[j];
  }
  ss = warpSum(ss);
  const float r = 1.0f / sqrtf(ss / (float)C + EPS);
  if (lane == 0) rstd[row] = r;
#pragma unroll
  for (int j = 0; j < NV; j++) {
    const int i = lane + 32 * j;
    if (i < C) stf(out, base + i, v[j] * r * ldf(w, i));
  }
}
`,
});

type RowsNormBwdP = { C: number; dinp: string; dout: string; inp: string; weight: string };

/**
 * Grid: R blocks of 32·ROWS_NORM_WARPS threads (R fixed by the host from n and C, so the result is deterministic); warp w
 * of block b takes rows b·WARPS + w, then every R·WARPS-th row after it. Per row: dinp += d(out)/d(inp)ᵀ dout (as
 * rmsnorm_bwd); over its rows each lane sums dout ⊙ inp · rstd for its columns, the block adds its warps' sums in
 * warp order into part[b·C + col], and col_reduce adds Σ_b part[b, col] into dweight.
 */
export const rmsnormRowsBackward = defineFamily<RowsNormBwdP>({
  name: 'rmsnorm_rows_bwd',
  schema: { C: { kind: 'int', min: 1, max: ROWS_NORM_MAX_C }, dinp: DTYPE_DOMAIN, dout: DTYPE_DOMAIN, inp: DTYPE_DOMAIN, weight: DTYPE_DOMAIN },
  example: { C: 128, dinp: 'bf16', dout: 'bf16', inp: 'bf16', weight: 'bf16' },
  generate: (p) => `#define C ${p.C}
#define NV ${Math.ceil(p.C / 32)}
#define WARPS ${ROWS_NORM_WARPS}
#define BLOCK (32 * WARPS)
${reductionHelpers()}
${dtypeHelpers()}
extern "C" __global__ void rmsnorm_rows_bwd(${T(p.dinp)}* dinp, float* part, const ${T(p.dout)}* dout, const ${T(p.inp)}* inp,
                                            const ${T(p.weight)}* w, const float* rstd, int n) {
  __shared__ float sh[WARPS][C];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float wv[NV], dw[NV];
#pragma unroll
  for (int j = 0; j < NV; j++) { const int i = lane + 32 * j; wv[j] = i < C ? ldf(w, i) : 0.0f; dw[j] = 0.0f; }
  for (int row = blockIdx.x * WARPS + warp; row < n; row += gridDim.x * WARPS) {
${normBackwardRow('lane + 32 * j', 'warpSum', 'none', p.dinp)}
  }
#pragma unroll
  for (int j = 0; j < NV; j++) { const int i = lane + 32 * j; if (i < C) sh[warp][i] = dw[j]; }
  __syncthreads();
  for (int i = threadIdx.x; i < C; i += BLOCK) {
    float s = 0.0f;
    for (int k = 0; k < WARPS; k++) s += sh[k][i];
    part[(long long)blockIdx.x * C + i] = s;
  }
}
`,
});
