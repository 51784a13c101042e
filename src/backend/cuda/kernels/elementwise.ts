/**
 * Elementwise and reduction kernels: add, accumulate, scale, sum of squares (per-block double partials summed
 * on the host), convert (copy across dtypes), matmul bias add/fill and bias-gradient column reduction, SwiGLU
 * forward/backward, embedding forward/backward (deterministic: no atomics), AdamW (with its optional compute copy).
 * Baked: block size and the dtype ('f32' | 'bf16', DTYPE_DOMAIN) of every float operand that may be either (the
 * generated signature says `float*` or `bf16*`, so the dtype is in the source and the key). Operands read through
 * ldf() and written through stf() (dtypeHelpers): compute is float32, a bf16 store rounds once to nearest even; an
 * accumulating store (+=) reads the old value, adds in float and rounds the sum. Fixed-dtype operands (the column
 * partials, sum-of-squares partials, embedding_bwd's dtable, AdamW's param/grad/m/v) stay `float`; CudaBackend
 * refuses a bf16 buffer there by name.
 * add, accumulate, scale, swiglu_fwd/bwd and convert run 8 elements per step with 128-bit loads and stores when every
 * operand is 16-byte aligned (checked at run time: views may not be), then scalar for the rest.
 * All use grid-stride loops with 64-bit indices.
 */
import { BLOCK_DOMAIN, DTYPE_DOMAIN, OPTIONAL_DTYPE_DOMAIN, ctype, defineFamily, dtypeHelpers, reductionHelpers, type KernelFamily } from './spec.js';

const loop = 'for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < n; i += (long long)gridDim.x * BLOCK)';
const T = (d: string): string => ctype(d);

/** How an elementwise body reads (`L(op)`) and writes (`S(op, value)`) element i of an operand. */
type Access = { L: (op: string) => string; S: (op: string, v: string) => string };
type Op = { name: string; role: 'in' | 'out' | 'inout' };

/**
 * 8-wide loads and stores for the vectorized elementwise path: 8 floats are two float4 (32 bytes), 8 bf16 one uint4
 * (16 bytes; element 2k is the low half of word k, and pack2 puts its first argument there). g indexes groups of 8.
 */
function vecHelpers(): string {
  return `
__device__ __forceinline__ void ld8(const float* p, long long g, float* v) {
  const float4 x = reinterpret_cast<const float4*>(p)[2 * g], y = reinterpret_cast<const float4*>(p)[2 * g + 1];
  v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w; v[4] = y.x; v[5] = y.y; v[6] = y.z; v[7] = y.w;
}
__device__ __forceinline__ void ld8(const bf16* p, long long g, float* v) {
  const uint4 x = reinterpret_cast<const uint4*>(p)[g];
  const unsigned w[4] = { x.x, x.y, x.z, x.w };
  #pragma unroll
  for (int k = 0; k < 4; k++) { v[2 * k] = __uint_as_float(w[k] << 16); v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u); }
}
__device__ __forceinline__ void st8(float* p, long long g, const float* v) {
  reinterpret_cast<float4*>(p)[2 * g] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[2 * g + 1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void st8(bf16* p, long long g, const float* v) {
  reinterpret_cast<uint4*>(p)[g] = make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
}
`;
}

/**
 * An elementwise family over float operands of baked dtypes. `ops` names the operands in signature order with their
 * role ('in': read, 'out': written, 'inout': read and written); `body(access)` reads and writes element i through
 * the access functions; `extra` is appended to the signature (e.g. a scale). When every operand pointer is 16-byte
 * aligned (whole buffers are; views may not be), the grid-stride loop runs over groups of 8 elements with 128-bit
 * loads and stores (ld8/st8, float math per element, one rounding per bf16 store), then a scalar loop does the rest.
 */
function typed<P extends Record<string, string | number>>(name: string, ops: readonly Op[], extra: string, example: P,
  body: (a: Access) => string): KernelFamily<P> {
  const schema: Record<string, typeof DTYPE_DOMAIN> = {};
  for (const o of ops) schema[o.name] = DTYPE_DOMAIN;
  const scalar = body({ L: (o) => `ldf(${o}, i)`, S: (o, v) => `stf(${o}, i, ${v});` });
  const vector = body({ L: (o) => `${o}_v[j]`, S: (o, v) => `${o}_v[j] = ${v};` });
  return defineFamily<P>({
    name, schema: { ...schema, block: BLOCK_DOMAIN } as never, example,
    generate: (p) => {
      const sig = ops.map((o) => `${o.role === 'in' ? 'const ' : ''}${T(p[o.name] as string)}* ${o.name}`).join(', ');
      const aligned = ops.map((o) => `reinterpret_cast<unsigned long long>(${o.name})`).join(' | ');
      return `#define BLOCK ${p.block}
${dtypeHelpers()}
${vecHelpers()}
extern "C" __global__ void ${name}(${sig}${extra}, long long n) {
  const long long start = (long long)blockIdx.x * BLOCK + threadIdx.x, stride = (long long)gridDim.x * BLOCK;
  const long long nv = ((${aligned}) & 15ull) == 0 ? n / 8 : 0;
  for (long long grp = start; grp < nv; grp += stride) {
    float ${ops.map((o) => `${o.name}_v[8]`).join(', ')};
    ${ops.filter((o) => o.role !== 'out').map((o) => `ld8(${o.name}, grp, ${o.name}_v);`).join(' ')}
    #pragma unroll
    for (int j = 0; j < 8; j++) {
      ${vector}
    }
    ${ops.filter((o) => o.role !== 'in').map((o) => `st8(${o.name}, grp, ${o.name}_v);`).join(' ')}
  }
  for (long long i = nv * 8 + start; i < n; i += stride) {
    ${scalar}
  }
}
`;
    },
  });
}

const IN = (name: string): Op => ({ name, role: 'in' });
const OUT = (name: string): Op => ({ name, role: 'out' });
const INOUT = (name: string): Op => ({ name, role: 'inout' });

type SwiRowsFP = { out: string; gu: string; block: number };
/**
 * The fused gate/up product's rows (gu [rows, 2·cols]: row r = gate_r then up_r) through SwiGLU: one index per group of 8
 * columns of one row when cols is a multiple of 8 and the pointers 16-byte aligned (ld8/st8), else one per element; the
 * row is the index divided by the groups (elements) per row. The element math is swiglu_fwd's / swiglu_bwd_set's,
 * so the fused layer stores the same values as the separate products' would.
 */
function swigluRows(name: string, ptrs: string[], sig: string, vecBody: string, scalarBody: string, block: number): string {
  const aligned = ptrs.map((q) => `reinterpret_cast<unsigned long long>(${q})`).join(' | ');
  return `#define BLOCK ${block}
${dtypeHelpers()}
${vecHelpers()}
extern "C" __global__ void ${name}(${sig}, long long rows, int cols) {
  const long long start = (long long)blockIdx.x * BLOCK + threadIdx.x, stride = (long long)gridDim.x * BLOCK;
  if ((cols & 7) == 0 && ((${aligned}) & 15ull) == 0) {
    const int per = cols / 8;
    for (long long grp = start; grp < rows * per; grp += stride) {
      const long long r = grp / per, c8 = grp - r * per;
      ${vecBody}
    }
  } else {
    for (long long i = start; i < rows * cols; i += stride) {
      const long long r = i / cols, c = i - r * cols;
      ${scalarBody}
    }
  }
}
`;
}

/** out[r, c] = silu(gu[r, c]) · gu[r, cols + c] (out rows of cols). */
export const swigluForwardRows = defineFamily<SwiRowsFP>({
  name: 'swiglu_fwd_rows', schema: { out: DTYPE_DOMAIN, gu: DTYPE_DOMAIN, block: BLOCK_DOMAIN }, example: { out: 'bf16', gu: 'bf16', block: 256 },
  generate: (p) => swigluRows('swiglu_fwd_rows', ['out', 'gu'], `${T(p.out)}* out, const ${T(p.gu)}* gu`,
    `const ${T(p.gu)}* g = gu + r * 2 * cols; float gv[8], uv[8], ov[8];
      ld8(g, c8, gv); ld8(g + cols, c8, uv);
      #pragma unroll
      for (int j = 0; j < 8; j++) { float x = gv[j]; ov[j] = x / (1.0f + expf(-x)) * uv[j]; }
      st8(out + r * cols, c8, ov);`,
    `const ${T(p.gu)}* g = gu + r * 2 * cols; float x = ldf(g, c); stf(out, i, x / (1.0f + expf(-x)) * ldf(g + cols, c));`, p.block),
});

type SwiRowsBP = { dgu: string; dout: string; gu: string; block: number };
/** dgu[r, c] = dy·up·σ(g)(1 + g(1 − σ(g))), dgu[r, cols + c] = dy·silu(g), with g, up from gu's row r and dy = dout[r, c] (overwritten). */
export const swigluBackwardRows = defineFamily<SwiRowsBP>({
  name: 'swiglu_bwd_rows', schema: { dgu: DTYPE_DOMAIN, dout: DTYPE_DOMAIN, gu: DTYPE_DOMAIN, block: BLOCK_DOMAIN },
  example: { dgu: 'bf16', dout: 'bf16', gu: 'bf16', block: 256 },
  generate: (p) => swigluRows('swiglu_bwd_rows', ['dgu', 'dout', 'gu'], `${T(p.dgu)}* dgu, const ${T(p.dout)}* dout, const ${T(p.gu)}* gu`,
    `const ${T(p.gu)}* g = gu + r * 2 * cols; ${T(p.dgu)}* d = dgu + r * 2 * cols; float gv[8], uv[8], yv[8], dg[8], du[8];
      ld8(g, c8, gv); ld8(g + cols, c8, uv); ld8(dout + r * cols, c8, yv);
      #pragma unroll
      for (int j = 0; j < 8; j++) {
        float x = gv[j]; float sg = 1.0f / (1.0f + expf(-x)); float silu = x * sg; float dy = yv[j];
        dg[j] = dy * uv[j] * sg * (1.0f + x * (1.0f - sg)); du[j] = dy * silu;
      }
      st8(d, c8, dg); st8(d + cols, c8, du);`,
    `const ${T(p.gu)}* g = gu + r * 2 * cols; ${T(p.dgu)}* d = dgu + r * 2 * cols;
      float x = ldf(g, c); float sg = 1.0f / (1.0f + expf(-x)); float silu = x * sg; float dy = ldf(dout, i);
      stf(d, c, dy * ldf(g + cols, c) * sg * (1.0f + x * (1.0f - sg))); stf(d + cols, c, dy * silu);`, p.block),
});

type AddP = { out: string; a: string; b: string; block: number };
/** out = a + b (out may alias a or b). */
export const addKernel = typed<AddP>('add', [OUT('out'), IN('a'), IN('b')], '', { out: 'f32', a: 'bf16', b: 'f32', block: 256 },
  ({ L, S }) => S('out', `${L('a')} + ${L('b')}`));
type AccP = { dst: string; src: string; block: number };
export const accumulateKernel = typed<AccP>('accumulate', [INOUT('dst'), IN('src')], '', { dst: 'f32', src: 'bf16', block: 256 },
  ({ L, S }) => S('dst', `${L('dst')} + ${L('src')}`));
type ScaleP = { buf: string; block: number };
export const scaleKernel = typed<ScaleP>('scale', [INOUT('buf')], ', float s', { buf: 'bf16', block: 256 },
  ({ L, S }) => S('buf', `${L('buf')} * s`));
type SwiFP = { out: string; gate: string; up: string; block: number };
export const swigluForward = typed<SwiFP>('swiglu_fwd', [OUT('out'), IN('gate'), IN('up')], '',
  { out: 'bf16', gate: 'bf16', up: 'bf16', block: 256 },
  ({ L, S }) => `float g = ${L('gate')}; ${S('out', `g / (1.0f + expf(-g)) * ${L('up')}`)}`);
type SwiBP = { dgate: string; dup: string; dout: string; gate: string; up: string; block: number };
export const swigluBackward = typed<SwiBP>('swiglu_bwd', [INOUT('dgate'), INOUT('dup'), IN('dout'), IN('gate'), IN('up')], '',
  { dgate: 'bf16', dup: 'bf16', dout: 'f32', gate: 'bf16', up: 'bf16', block: 256 },
  ({ L, S }) => `float g = ${L('gate')}; float sg = 1.0f / (1.0f + expf(-g)); float silu = g * sg;
      float dy = ${L('dout')};
      ${S('dgate', `${L('dgate')} + dy * ${L('up')} * sg * (1.0f + g * (1.0f - sg))`)}
      ${S('dup', `${L('dup')} + dy * silu`)}`);

/** swiglu_bwd that overwrites: dgate = dy·up·σ(g)(1 + g(1 − σ(g))), dup = dy·silu(g) (no zeroing pass, no read of dgate/dup). */
export const swigluBackwardSet = typed<SwiBP>('swiglu_bwd_set', [OUT('dgate'), OUT('dup'), IN('dout'), IN('gate'), IN('up')], '',
  { dgate: 'bf16', dup: 'bf16', dout: 'f32', gate: 'bf16', up: 'bf16', block: 256 },
  ({ L, S }) => `float g = ${L('gate')}; float sg = 1.0f / (1.0f + expf(-g)); float silu = g * sg;
      float dy = ${L('dout')};
      ${S('dgate', `dy * ${L('up')} * sg * (1.0f + g * (1.0f - sg))`)}
      ${S('dup', `dy * silu`)}`);

type ConvertP = { out: string; inp: string; block: number };
/** out[i] = inp[i] converted between dtypes (into bf16: round to nearest even). Backend.copy across dtypes. */
export const convertKernel = typed<ConvertP>('convert', [OUT('out'), IN('inp')], '', { out: 'bf16', inp: 'f32', block: 256 },
  ({ L, S }) => S('out', L('inp')));

type ColsP = { dst: string; src: string; bias: string; block: number };
/**
 * Backend.copyColumns: dst[r, dstCol + c] = src[r, srcCol + c] (+ bias[c], in float; a bf16 dst rounds once) for r < rows,
 * c < width, rows dstCols / srcCols wide. Grid-stride over rows · width elements, or, when `vec` (the host checked that
 * every pointer, row width and column offset is a multiple of 8 elements / 16 bytes), over groups of 8 with 128-bit
 * loads and stores. bias 'none' adds nothing (a copy stays bit-exact, -0 included).
 */
export const copyColumnsKernel = defineFamily<ColsP>({
  name: 'copy_cols', schema: { dst: DTYPE_DOMAIN, src: DTYPE_DOMAIN, bias: OPTIONAL_DTYPE_DOMAIN, block: BLOCK_DOMAIN },
  example: { dst: 'bf16', src: 'bf16', bias: 'bf16', block: 256 },
  generate: (p) => {
    const withBias = p.bias !== 'none';
    return `#define BLOCK ${p.block}
${dtypeHelpers()}${vecHelpers()}
extern "C" __global__ void copy_cols(${T(p.dst)}* dst, const ${T(p.src)}* src, const ${withBias ? T(p.bias) : 'float'}* bias, long long rows,
    int width, int dstCols, int dstCol, int srcCols, int srcCol, int vec) {
  const long long step = (long long)gridDim.x * BLOCK;
  if (vec) {
    const int gpr = width >> 3;
    const long long n = rows * gpr;
    for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < n; i += step) {
      const long long r = i / gpr; const int g = (int)(i - r * gpr);
      float v[8];
      ld8(src + r * srcCols + srcCol, g, v);
${withBias ? `      float b[8];
      ld8(bias, g, b);
      #pragma unroll
      for (int k = 0; k < 8; k++) v[k] += b[k];
` : ''}      st8(dst + r * dstCols + dstCol, g, v);
    }
    return;
  }
  const long long n = rows * width;
  for (long long i = (long long)blockIdx.x * BLOCK + threadIdx.x; i < n; i += step) {
    const long long r = i / width; const int c = (int)(i - r * width);
    stf(dst, r * dstCols + dstCol + c, ldf(src, r * srcCols + srcCol + c)${withBias ? ' + ldf(bias, c)' : ''});
  }
}
`;
  },
});

type BiasP = { out: string; bias: string; block: number };
/**
 * After the cuBLAS GEMM that wrote out[rows, m]: out[r, c] += bias[c] (in float; a bf16 out rounds the sum). Grid
 * (ceil(m / block), Y): thread column c reads bias[c] once and walks rows y, y + Y, ... (no per-element modulo).
 */
export const biasAdd = defineFamily<BiasP>({
  name: 'bias_add', schema: { out: DTYPE_DOMAIN, bias: DTYPE_DOMAIN, block: BLOCK_DOMAIN },
  example: { out: 'bf16', bias: 'bf16', block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
${dtypeHelpers()}
extern "C" __global__ void bias_add(${T(p.out)}* out, const ${T(p.bias)}* bias, int rows, int m) {
  const int c = blockIdx.x * BLOCK + threadIdx.x;
  if (c >= m) return;
  const float b = ldf(bias, c);
  for (int r = blockIdx.y; r < rows; r += gridDim.y) { const long long i = (long long)r * m + c; stf(out, i, ldf(out, i) + b); }
}
`,
});

/**
 * The body bias_grad and col_reduce share: 32 columns per block (lane l: column c = 32·blockIdx.x + l, valid below m);
 * after `setup`, each warp's lanes run `loop` (a strided share of the rows, summed into acc), and warp 0 adds the
 * warps' sums s in warp order (deterministic) and runs `store`. Generated text: both kernels' sources as written out.
 */
function columnShares(setup: string, loop: string, store: string): string {
  return `  __shared__ float sh[WARPS][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = blockIdx.x * 32 + lane;
${setup}  float acc = 0.0f;
  if (c < m) ${loop}
  sh[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && c < m) {
    float s = 0.0f;
    for (int w = 0; w < WARPS; w++) s += sh[w][lane];
    ${store}
  }`;
}

type BiasGradP = { dout: string; block: number };
/**
 * Stage 1 of the bias gradient. Grid (ceil(m / 32), R), BLOCK threads = BLOCK / 32 warps: block (x, y) takes columns
 * [32x, 32x + 32) (a lane each: one warp load is 32 adjacent columns) of rows [y·rowsPer, (y+1)·rowsPer), warp w the
 * rows w, w + WARPS, ... of them; the warps' sums are added in warp order into part[y·m + c] (float32 partials), and
 * col_reduce adds the R partials (in order) into dbias. Deterministic. Every block has all its warps busy, where a
 * thread per column left a narrow projection's bias (m = 128) to 64 blocks of 4 working warps, each loading its
 * column's rows one after another.
 */
export const biasGrad = defineFamily<BiasGradP>({
  name: 'bias_grad', schema: { dout: DTYPE_DOMAIN, block: BLOCK_DOMAIN }, example: { dout: 'bf16', block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
#define WARPS (BLOCK / 32)
${dtypeHelpers()}
extern "C" __global__ void bias_grad(float* part, const ${T(p.dout)}* dout, int rows, int m, int rowsPer) {
${columnShares('  const int r0 = blockIdx.y * rowsPer, r1 = min(rows, r0 + rowsPer);\n',
    'for (int r = r0 + warp; r < r1; r += WARPS) acc += ldf(dout, (long long)r * m + c);', 'part[(long long)blockIdx.y * m + c] = s;')}
}
`,
});

type ColP = { dst: string; block: number };
/**
 * Stage 2 of the column reductions: dst[c] += Σ_{y < R} part[y·m + c]. Grid ceil(m / 32), BLOCK threads: lane l of
 * warp w sums the partials y = w, w + WARPS, ... of column 32·blockIdx.x + l, and warp 0 adds the warps' sums in warp
 * order (deterministic). A thread per column summing all R partials in a row took one load latency per partial.
 */
export const colReduce = defineFamily<ColP>({
  name: 'col_reduce', schema: { dst: DTYPE_DOMAIN, block: BLOCK_DOMAIN }, example: { dst: 'f32', block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
#define WARPS (BLOCK / 32)
${dtypeHelpers()}
extern "C" __global__ void col_reduce(${T(p.dst)}* dst, const float* part, int R, int m, int accumulate) {
${columnShares('', 'for (int y = warp; y < R; y += WARPS) acc += part[(long long)y * m + c];', 'stf(dst, c, accumulate ? ldf(dst, c) + s : s);')}
}
`,
});

type SumSqP = { x: string; block: number };
/** partials[blockIdx.x] = Σ x² over the block's grid-stride share, in double; the host sums the partials. */
export const sumSquares = defineFamily<SumSqP>({
  name: 'sum_squares', schema: { x: DTYPE_DOMAIN, block: BLOCK_DOMAIN }, example: { x: 'f32', block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
${reductionHelpers()}
${dtypeHelpers()}
extern "C" __global__ void sum_squares(double* partials, const ${T(p.x)}* x, long long n) {
  double acc = 0.0;
  ${loop} { double v = (double)ldf(x, i); acc += v * v; }
  acc = blockSumD(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}
`,
});

type EmbFP = { out: string; table: string; block: number };
/** out[i, j] = table[ids[i], j]; n·c elements. */
export const embeddingForward = defineFamily<EmbFP>({
  name: 'embedding_fwd', schema: { out: DTYPE_DOMAIN, table: DTYPE_DOMAIN, block: BLOCK_DOMAIN },
  example: { out: 'f32', table: 'bf16', block: 256 },
  generate: (p) => `#define BLOCK ${p.block}
${dtypeHelpers()}
extern "C" __global__ void embedding_fwd(${T(p.out)}* out, const int* ids, const ${T(p.table)}* table, long long n, int c) {
  ${loop} {
    long long row = i / c;
    int j = (int)(i % c);
    stf(out, i, ldf(table, (long long)ids[row] * c + j));
  }
}
`,
});

type EmbBP = { dout: string; per: number; block: number };
/** Rows of one id whose loads embedding_bwd keeps in flight together: 32 floats of registers per thread, 1 to 8 rows. */
export function embBwdUnroll(per: number): number { return Math.max(1, Math.min(8, Math.floor(32 / per))); }
/** Columns of a row each thread of embedding_bwd keeps in registers: ceil(c / block) (baked: it sizes the array). */
export const EMB_BWD_MAX_PER = 64;
/**
 * dtable[v, :] += Σ dout[i, :] over the rows i with ids[i] = v, deterministically and in the CPU backend's order: one
 * block per row i; the block whose row is the first occurrence of its id (no earlier row has it) loads dtable[v, :],
 * adds its own row and then every later row with the same id in ascending order (a block-wide scan of the ids, one
 * ballot per warp), and stores the sum; the other blocks return. Each row is read once, by its id's first block, and
 * the result is bit-for-bit the sequential float32 loop (float atomics would add in whatever order they land). The
 * scans read the int ids (n² / 2 compares over all blocks, from L2). The matching rows of each window of NT ids are
 * listed in shared memory and read UNR at a time (embBwdUnroll), their loads in flight together, then added in order.
 */
export const embeddingBackward = defineFamily<EmbBP>({
  name: 'embedding_bwd', schema: { dout: DTYPE_DOMAIN, per: { kind: 'int', min: 1, max: EMB_BWD_MAX_PER }, block: BLOCK_DOMAIN },
  example: { dout: 'bf16', per: 4, block: 256 },
  generate: (p) => `#define NT ${p.block}
#define PER ${p.per}
#define NW (NT / 32)
#define UNR ${embBwdUnroll(p.per)}
${dtypeHelpers()}
extern "C" __global__ void embedding_bwd(float* dtable, const ${T(p.dout)}* dout, const int* ids, int n, int c) {
  __shared__ int seen;
  __shared__ unsigned masks[NW];
  __shared__ int list[NT];
  const int i = blockIdx.x, tid = threadIdx.x, v = ids[i];
  if (tid == 0) seen = 0;
  __syncthreads();
  int earlier = 0;
  for (int k = tid; k < i && !earlier; k += NT) earlier = ids[k] == v;
  if (earlier) seen = 1;
  __syncthreads();
  if (seen) return;
  float acc[PER];
  const long long base = (long long)v * c;
#pragma unroll
  for (int q = 0; q < PER; q++) {
    const int j = tid + q * NT;
    if (j < c) acc[q] = dtable[base + j] + ldf(dout, (long long)i * c + j);
  }
  for (int t0 = i + 1; t0 < n; t0 += NT) {
    const int k = t0 + tid;
    const bool hit = k < n && ids[k] == v;
    const unsigned m = __ballot_sync(0xffffffffu, hit);
    if ((tid & 31) == 0) masks[tid >> 5] = m;
    __syncthreads();
    /* the window's rows of this id, ascending: a warp's after the earlier warps' */
    int before = 0, total = 0;
    for (int w = 0; w < NW; w++) { const int pc = __popc(masks[w]); if (w < (tid >> 5)) before += pc; total += pc; }
    if (hit) list[before + __popc(m & ((1u << (tid & 31)) - 1u))] = k;
    __syncthreads();
    /* UNR rows' loads in flight at once, then their adds in ascending order: the sequential sum, without one memory
       round trip per row (an id filling half of 8192 rows took 1.9 ms one row at a time on the H100) */
    for (int r0 = 0; r0 < total; r0 += UNR) {
      float x[UNR][PER];
#pragma unroll
      for (int r = 0; r < UNR; r++) {
#pragma unroll
        for (int q = 0; q < PER; q++) {
          const int j = tid + q * NT;
          x[r][q] = r0 + r < total && j < c ? ldf(dout, (long long)list[r0 + r] * c + j) : 0.0f;
        }
      }
#pragma unroll
      for (int r = 0; r < UNR; r++) {
#pragma unroll
        for (int q = 0; q < PER; q++) {
          const int j = tid + q * NT;
          if (r0 + r < total && j < c) acc[q] += x[r][q];
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int q = 0; q < PER; q++) {
    const int j = tid + q * NT;
    if (j < c) dtable[base + j] = acc[q];
  }
}
`,
});

type AdamP = { copy: string; block: number };

/** One element of AdamW (both AdamW kernels): the same arithmetic as the CPU backend's adamw. */
const ADAMW_ONE = `struct AdamConst { float beta1, beta2, eps, lr, wd, gradScale, bc1, bc2; };
__device__ __forceinline__ void adamwOne(float& p, float gr, float& m, float& v, const AdamConst& k) {
  float g = gr * k.gradScale;
  float mi = k.beta1 * m + (1.0f - k.beta1) * g;
  float vi = k.beta2 * v + (1.0f - k.beta2) * g * g;
  m = mi;
  v = vi;
  p = p * (1.0f - k.lr * k.wd) - k.lr * (mi / k.bc1) / (sqrtf(vi / k.bc2) + k.eps);
}`;

/**
 * AdamW over float32 param/grad/m/v. Baked: the block size and the compute copy's dtype (`copy`: 'none', 'f32' or
 * 'bf16'; with one, the same launch stores the updated parameter into copy[i], rounded once into bf16). Runtime
 * arguments (a schedule or a resumed run may change any of them without a compile): beta1, beta2, eps, lr,
 * weightDecay, gradScale and the bias corrections bc1 = 1 - beta1^step, bc2 = 1 - beta2^step (computed on the host).
 * param = param · (1 - lr · weightDecay) - lr · m̂ / (sqrt(v̂) + eps)   (as the CPU backend)
 */
/**
 * An AdamW family (both share the schema, the element update and the compute copy's store): `body(p, copyParam, st)`
 * writes the kernel after the common prelude; copyParam is the copy's parameter declaration, st(idx, v) its store.
 */
function adamwFamily(name: string, body: (p: AdamP, copyParam: string, st: (idx: string, v: string) => string) => string) {
  return defineFamily<AdamP>({
    name,
    schema: { copy: OPTIONAL_DTYPE_DOMAIN, block: BLOCK_DOMAIN },
    example: { copy: 'bf16', block: 256 },
    generate: (p) => {
      const cp = p.copy !== 'none';
      const st = (idx: string, v: string): string => (cp ? `stf(copy, ${idx}, ${v});` : '');
      return `#define BLOCK ${p.block}
${dtypeHelpers()}
${ADAMW_ONE}
${body(p, cp ? `${ctype(p.copy)}* copy` : 'void* nocopy', st)}`;
    },
  });
}

export const adamwKernel = adamwFamily('adamw', (_p, copyParam, st) => `/* float4 over the first n/4·4 elements when param/grad/m/v are 16-byte aligned (views may not be), then scalar.
   The copy (if any) is stored per element (its own alignment does not matter). */
extern "C" __global__ void adamw(float* param, const float* grad, float* m, float* v, ${copyParam}, long long n,
                                 float beta1, float beta2, float eps, float lr, float wd, float gradScale, float bc1, float bc2) {
  const AdamConst k = { beta1, beta2, eps, lr, wd, gradScale, bc1, bc2 };
  const long long start = (long long)blockIdx.x * BLOCK + threadIdx.x, stride = (long long)gridDim.x * BLOCK;
  const bool vec = ((reinterpret_cast<unsigned long long>(param) | reinterpret_cast<unsigned long long>(grad) |
                     reinterpret_cast<unsigned long long>(m) | reinterpret_cast<unsigned long long>(v)) & 15ull) == 0;
  const long long nv = vec ? n / 4 : 0;
  for (long long i = start; i < nv; i += stride) {
    float4 p4 = reinterpret_cast<float4*>(param)[i], m4 = reinterpret_cast<float4*>(m)[i], v4 = reinterpret_cast<float4*>(v)[i];
    const float4 g4 = reinterpret_cast<const float4*>(grad)[i];
    adamwOne(p4.x, g4.x, m4.x, v4.x, k);
    adamwOne(p4.y, g4.y, m4.y, v4.y, k);
    adamwOne(p4.z, g4.z, m4.z, v4.z, k);
    adamwOne(p4.w, g4.w, m4.w, v4.w, k);
    reinterpret_cast<float4*>(param)[i] = p4;
    reinterpret_cast<float4*>(m)[i] = m4;
    reinterpret_cast<float4*>(v)[i] = v4;
    ${st('4 * i', 'p4.x')} ${st('4 * i + 1', 'p4.y')} ${st('4 * i + 2', 'p4.z')} ${st('4 * i + 3', 'p4.w')}
  }
  for (long long i = nv * 4 + start; i < n; i += stride) { adamwOne(param[i], grad[i], m[i], v[i], k); ${st('i', 'param[i]')} }
}
`);

/** Elements one block of adamw_multi updates (one chunk of the table; a tensor is cut into chunks of at most this many). */
export const ADAMW_CHUNK = 16384;
/** Int32 words per chunk-table entry: start (low, high), length, decay flag. */
export const ADAMW_CHUNK_WORDS = 4;
/** Floats of the per-step values adamw_multi reads from device memory: lr, gradient scale, bias corrections 1 and 2. */
export const ADAMW_SCALARS = 4;

/**
 * AdamW over a whole flat parameter buffer in one launch (the multi-tensor update): block b updates chunk b of a table
 * [start_lo, start_hi, length, decay] the backend builds once from the tensors' offsets, sizes and weight-decay flags.
 * The per-step values (lr, gradient scale, bias corrections) are read from a device buffer, so a captured graph
 * replays with each step's values; beta1, beta2, eps and the weight decay are arguments (constant over a run). The
 * update of each element is adamwOne, the same arithmetic as the per-tensor kernel.
 */
export const adamwMultiKernel = adamwFamily('adamw_multi', (_p, copyParam, st) => `extern "C" __global__ void adamw_multi(float* param, const float* grad, float* m, float* v, ${copyParam},
                                       const int* chunks, const float* scal, float beta1, float beta2, float eps, float wd) {
  const int* c = chunks + ${4} * blockIdx.x;
  const long long s0 = (long long)(unsigned int)c[0] | ((long long)c[1] << 32);
  const int len = c[2];
  const AdamConst k = { beta1, beta2, eps, scal[0], c[3] ? wd : 0.0f, scal[1], scal[2], scal[3] };
  float* P = param + s0; const float* G = grad + s0; float* M = m + s0; float* V = v + s0;
  const bool vec = ((reinterpret_cast<unsigned long long>(P) | reinterpret_cast<unsigned long long>(G) |
                     reinterpret_cast<unsigned long long>(M) | reinterpret_cast<unsigned long long>(V)) & 15ull) == 0;
  const int nv = vec ? len / 4 : 0;
  for (int i = threadIdx.x; i < nv; i += BLOCK) {
    float4 p4 = reinterpret_cast<float4*>(P)[i], m4 = reinterpret_cast<float4*>(M)[i], v4 = reinterpret_cast<float4*>(V)[i];
    const float4 g4 = reinterpret_cast<const float4*>(G)[i];
    adamwOne(p4.x, g4.x, m4.x, v4.x, k);
    adamwOne(p4.y, g4.y, m4.y, v4.y, k);
    adamwOne(p4.z, g4.z, m4.z, v4.z, k);
    adamwOne(p4.w, g4.w, m4.w, v4.w, k);
    reinterpret_cast<float4*>(P)[i] = p4;
    reinterpret_cast<float4*>(M)[i] = m4;
    reinterpret_cast<float4*>(V)[i] = v4;
    ${st('s0 + 4 * i', 'p4.x')} ${st('s0 + 4 * i + 1', 'p4.y')} ${st('s0 + 4 * i + 2', 'p4.z')} ${st('s0 + 4 * i + 3', 'p4.w')}
  }
  for (int i = nv * 4 + threadIdx.x; i < len; i += BLOCK) { adamwOne(P[i], G[i], M[i], V[i], k); ${st('s0 + i', 'P[i]')} }
}
`);

/**
 * The chunk table of adamw_multi for tensors (offset, size, decay) of a flat buffer: each tensor cut into chunks of at
 * most ADAMW_CHUNK elements, ADAMW_CHUNK_WORDS int32 words each. Empty tensors take no chunk.
 */
export function adamwChunkTable(tensors: ReadonlyArray<{ offset: number; size: number; decay: boolean }>): Int32Array {
  let n = 0;
  for (const t of tensors) n += Math.ceil(t.size / ADAMW_CHUNK);
  const out = new Int32Array(n * ADAMW_CHUNK_WORDS);
  let i = 0;
  for (const t of tensors) {
    for (let o = 0; o < t.size; o += ADAMW_CHUNK) {
      const start = t.offset + o;
      out[i++] = start % 2 ** 32 | 0;
      out[i++] = Math.floor(start / 2 ** 32);
      out[i++] = Math.min(ADAMW_CHUNK, t.size - o);
      out[i++] = t.decay ? 1 : 0;
    }
  }
  return out;
}

