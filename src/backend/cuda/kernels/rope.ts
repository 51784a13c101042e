/**
 * Rotary embedding (rotate-half layout) forward and backward, one family pair per RoPE kind (src/backend/rope.ts).
 *
 * - rope_fwd / rope_bwd (plain RoPE). Baked: headDim, theta, block.
 * - rope_linear_*, rope_llama3_*, rope_yarn_* (scaled RoPE). Baked: headDim, the kind's every parameter, block.
 * Every kind bakes its inverse frequencies, computed on the host by ropeInvFreq (the same float64 function the CPU
 * backend uses), into the source as a double table, with yarn's attention factor as ATTN; so the kernel source, and
 * therefore its cache key, changes with every parameter that changes the math. The angle (position · frequency) and
 * its cos and sin are double; only the final rotation is float32. A forward family bakes `bias` ('none', or the dtype
 * of a [heads · HD] bias added to every row before the rotation: the q/k projections' bias, so that no separate pass
 * adds it; in float, one rounding at the store); a backward family bakes `acc` (true: dinp += Rᵀ dout; false: dinp =
 * Rᵀ dout, overwritten, so the caller need not zero it and the old values are never read). Every family also bakes
 * the dtypes ('f32' | 'bf16') of `out` and `inp` (out may alias inp: both must then have one dtype); a bf16 store
 * rounds once (the accumulating backward's += reads, adds in float, rounds).
 *
 * Launch (CudaBackend.rope): one thread per (token row r of the B·T rows, pair i < HALF), a grid-stride loop over
 * rows·HALF: idx ↦ (r = idx / HALF, i = idx % HALF), a bijection of [0, rows·HALF) onto the (r, i) pairs, so any grid
 * covers each pair exactly once. The thread computes the angle's (c, s) once (position pos0 + r % T) and rotates pair
 * i of every head of row r: elements r·stride + h·HD + {i, i + HALF}, h < heads — which are all the elements of the
 * tensor, each touched by exactly one thread (once per pair, once per head). Rows of out and inp start outStride and
 * inStride elements apart (runtime arguments; heads·HD for a packed tensor, more for the q or k columns of a fused
 * q/k/v product's [N, Q + 2·KV] output or gradient). Heads go in groups of HU: the group's
 * inputs (and the backward's old outputs) are read before any of its stores, so that the loads overlap (the compiler
 * may not reorder them across the stores since out may alias inp); reading first is also what makes the forward
 * in place correct, as every element read is written only by the same thread.
 */
import { ropeInvFreq, yarnMscale, type RopeSpec } from '../../rope.js';
import {
  BLOCK_DOMAIN, DTYPE_DOMAIN, OPTIONAL_DTYPE_DOMAIN, ctype, defineFamily, dtypeHelpers, f32, f64, reductionHelpers, type KernelFamily, type KernelSpec, type ParamRecord, type Schema,
} from './spec.js';

type RopeP = { headDim: number; theta: number; out: string; inp: string; seqPos: boolean; bias: string; block: number };
const schema = {
  headDim: { kind: 'int', min: 2, step: 2 }, theta: { kind: 'float', min: 1 }, out: DTYPE_DOMAIN, inp: DTYPE_DOMAIN, seqPos: { kind: 'bool' },
  // `bias` (forward only): 'none', or the dtype of a bias [heads · HD] added to each row before the rotation
  bias: OPTIONAL_DTYPE_DOMAIN, block: BLOCK_DOMAIN,
} as const;
/** A backward family's parameters: the forward's without the bias, with `acc` (accumulate into dinp, or overwrite it). */
type Bwd<P> = Omit<P, 'bias'> & { acc: boolean };
/** A backward family's schema: the forward's without the bias, with `acc`. */
function backwardSchema<S extends { bias: unknown }>(s: S): Omit<S, 'bias'> & { acc: { kind: 'bool' } } {
  const { bias: _bias, ...rest } = s;
  return { ...rest, acc: { kind: 'bool' } };
}
/**
 * The operand dtypes of one rope launch, and whether it reads per-sequence start positions (`seqPos`: an int array of B
 * positions, row r of sequence r / T at seqPos[r / T] + r % T; batched generation of prompts of different lengths).
 */
export interface RopeDtypes { out: string; inp: string; seqPos?: boolean; bias?: string; acc?: boolean }

/** Heads per group in the kernel's head loop (loads of a group are issued before its stores). */
const HEAD_GROUP = 4;

/**
 * What every RoPE kernel of one kind starts with: BLOCK, HD, HALF, HU, the kind's inverse frequencies as a double
 * table (ropeInvFreq, the CPU backend's own float64 function) and its attention factor ATTN, and the dtype helpers.
 */
function ropePrelude(name: string, rope: RopeSpec, headDim: number, block: number): string {
  const table = Array.from(ropeInvFreq(rope, headDim), (v) => f64(v)).join(', ');
  const attn = rope.type === 'yarn' ? rope.attentionFactor : 1;
  return `#define BLOCK ${block}
#define HD ${headDim}
#define HALF ${headDim / 2}
#define HU ${HEAD_GROUP}
__device__ const double ${name}_inv_freq[HALF] = { ${table} };
#define ATTN ${f64(attn)}
${dtypeHelpers()}
/* the cos and sin of position p's angle for pair i: the angle, its cos and sin in double, each times ATTN rounded once */
__device__ __forceinline__ void rope_cs(long long p, int i, float* c, float* s) {
  double sd, cd;
  sincos((double)p * ${name}_inv_freq[i], &sd, &cd);
  *c = (float)(ATTN * cd); *s = (float)(ATTN * sd);
}
/* pair (x1, x2) rotated by (c, s): (x1 c - x2 s, x2 c + x1 s), each one FMA over the other product rounded, so that every
   kernel stores the same bits (left to the compiler, x1 c - x2 s contracts one way or the other); (c, -s) rotates back */
__device__ __forceinline__ float rope_lo(float x1, float x2, float c, float s) { return fmaf(x1, c, -(x2 * s)); }
__device__ __forceinline__ float rope_hi(float x1, float x2, float c, float s) { return fmaf(x2, c, x1 * s); }`;
}

/**
 * Generation's step from the fused q/k/v product to the cached attention, in one launch (Backend.ropeKvCacheWrite): row
 * r of qkv [rows, Q + 2·KV] (columns q | k | v, Q = nH·HD, KV = nKv·HD) is token r % T of sequence b = r / T, at
 * position p = pos0 (or seqPos[b]) + r % T. Its U = nH + 2·nKv heads (q's, then k's, then v's: head u at columns
 * u·HD) are the units of the launch: one thread per (row, unit, pair i < HALF), idx = (row·U + u)·HALF + i, a bijection
 * onto those triples (grid-stride loop), so that a decode step's few rows still spread over many threads, consecutive
 * threads on consecutive columns. A q head is rotated into q [rows, Q], a k head into kc's row b·tMax + p, a v head's
 * elements i and i + HALF copied into vc's; each with its bias column (in float, one rounding at the store). Every value
 * is computed as ropeForward, copyColumns and kv_cache_write compute it (the same loads, sums and rotation in double
 * angle, float product through rope_lo / rope_hi): bit for bit (before the helpers' explicit FMAs the compiler contracted
 * x1·c − x2·s one way or the other: 3 ulps of a cancelling f32 result seen on an H200, and once in ~15k values a bf16
 * rounding tipped by 1 ulp). `out`: the dtype of q and both caches; `inp`: qkv's;
 * `bias`: 'none' or the dtype of the joined bias [Q + 2·KV].
 */
function ropeKvSource(name: string, rope: RopeSpec, headDim: number, block: number, dt: RopeKvDtypes): string {
  if (dt.norm !== 'none') return ropeKvNormSource(name, rope, headDim, block, dt);
  const { seq, O, I, B, entry } = kvEntry(name, dt);
  return `${ropePrelude(name, rope, headDim, block)}
${entry}) {
  const int Q = nH * HD, KV = nKv * HD, U = nH + 2 * nKv;
  const long long W = (long long)Q + 2 * KV, total = rows * U * HALF;
  for (long long idx = (long long)blockIdx.x * BLOCK + threadIdx.x; idx < total; idx += (long long)gridDim.x * BLOCK) {
    const int i = (int)(idx % HALF);
    const long long ru = idx / HALF, row = ru / U, b = row / T;
    const int u = (int)(ru % U), col = u * HD + i;
    const int p = ${seq ? 'seqPos[b]' : 'pos0'} + (int)(row % T);
    const ${I}* src = qkv + row * W + col;
    const float x1 = ldf(src, 0)${B ? ' + ldf(bias, col)' : ''}, x2 = ldf(src, HALF)${B ? ' + ldf(bias, col + HALF)' : ''};
    const long long cache = (b * tMax + p) * KV;
    if (u >= nH + nKv) {
      const long long d = cache + (col - Q - KV);
      stf(vc, d, x1); stf(vc, d + HALF, x2);
    } else {
      float c, s;
      rope_cs(p, i, &c, &s);
      ${O}* dst = u < nH ? q + row * Q + col : kc + cache + (col - Q);
      stf(dst, 0, rope_lo(x1, x2, c, s)); stf(dst, HALF, rope_hi(x1, x2, c, s));
    }
  }
}
`;
}

/** The kv families' dtypes: RopeDtypes, and `norm` ('none', or the dtype of Qwen3's q/k norm weights) with its eps. */
export interface RopeKvDtypes extends RopeDtypes { norm: string; eps: number }

/**
 * The kv kernels' shared entry: the C types of q and the caches (O), of qkv (I) and of the bias (B, null without one),
 * whether positions are per sequence, and the signature up to its optional trailing arguments (the norms' weights).
 */
function kvEntry(name: string, dt: RopeKvDtypes): { seq: boolean; O: string; I: string; B: string | null; entry: string } {
  const seq = dt.seqPos === true, bias = dt.bias ?? 'none', O = ctype(dt.out), I = ctype(dt.inp), B = bias === 'none' ? null : ctype(bias);
  const entry = `extern "C" __global__ void ${name}(${O}* q, ${O}* kc, ${O}* vc, const ${I}* qkv, long long rows, int T, int nH, int nKv, int pos0,
                                   int tMax${seq ? ', const int* seqPos' : ''}${B ? `, const ${B}* bias` : ''}`;
  return { seq, O, I, B, entry };
}

/**
 * ropeKvSource with Qwen3's per-head q/k RMSNorm before the rotation (`norm` the weights' dtype, `eps` baked): one warp
 * per (row, unit) over the grid's warps (idx = row·U + u), lanes over the head's elements e = lane + 32·j as
 * rmsnorm_rows_fwd reads a row (the same sum of squares in the same order, warpSum, 1 / sqrt(ss / HD + eps); for head
 * dims up to ROWS_NORM_MAX_C, where rmsnormForward runs that kernel: above, it sums a row in a block's order, so the
 * two agree to float rounding, no Qwen3 has such heads), so a q or k head is normed into what it stores
 * (x · r · w, rounded to q's dtype: the normed activation), then staged in shared memory and rotated from there, a
 * lane per pair; each element read is first rounded to q's dtype, with its bias added where there is one (what the
 * split copy stores and the norm reads). v heads are copied (with their bias) as ropeKvSource copies them.
 * Arguments: ropeKvSource's, then qw and kw (the q and k norm weights [HD]).
 */
function ropeKvNormSource(name: string, rope: RopeSpec, headDim: number, block: number, dt: RopeKvDtypes): string {
  const { seq, O, I, B, entry } = kvEntry(name, dt);
  const rnd = dt.out === 'bf16' ? (x: string): string => `bf2f(f2bf(${x}))` : (x: string): string => x;
  return `${ropePrelude(name, rope, headDim, block)}${reductionHelpers()}
#define WARPS (BLOCK / 32)
#define NV ((HD + 31) / 32)
#define EPS ${f32(dt.eps)}
${entry}, const ${ctype(dt.norm)}* qw, const ${ctype(dt.norm)}* kw) {
  __shared__ float hs[WARPS][HD];
  const int Q = nH * HD, KV = nKv * HD, U = nH + 2 * nKv, lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
  const long long W = (long long)Q + 2 * KV, units = rows * U;
  float* h = hs[wi];
  /* warp-uniform loop: every lane of a warp takes the same units */
  for (long long wu = (long long)blockIdx.x * WARPS + wi; wu < units; wu += (long long)gridDim.x * WARPS) {
    const long long row = wu / U, b = row / T;
    const int u = (int)(wu % U), c0 = u * HD;
    const int p = ${seq ? 'seqPos[b]' : 'pos0'} + (int)(row % T);
    const ${I}* src = qkv + row * W + c0;
    const long long cache = (b * tMax + p) * KV;
    if (u >= nH + nKv) {
      ${O}* dst = vc + cache + (c0 - Q - KV);
      for (int e = lane; e < HD; e += 32) stf(dst, e, ldf(src, e)${B ? ' + ldf(bias, c0 + e)' : ''});
      continue;
    }
    const ${ctype(dt.norm)}* w = u < nH ? qw : kw;
    float v[NV];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; j++) {
      const int e = lane + 32 * j;
      v[j] = e < HD ? ${rnd(B ? 'ldf(src, e) + ldf(bias, c0 + e)' : 'ldf(src, e)')} : 0.0f;
      ss += v[j] * v[j];
    }
    ss = warpSum(ss);
    const float r = 1.0f / sqrtf(ss / (float)HD + EPS);
#pragma unroll
    for (int j = 0; j < NV; j++) {
      const int e = lane + 32 * j;
      if (e < HD) h[e] = ${rnd('v[j] * r * ldf(w, e)')};
    }
    __syncwarp();
    ${O}* dst = u < nH ? q + row * Q + c0 : kc + cache + (c0 - Q);
    for (int i = lane; i < HALF; i += 32) {
      float c, s;
      rope_cs(p, i, &c, &s);
      stf(dst, i, rope_lo(h[i], h[i + HALF], c, s)); stf(dst, i + HALF, rope_hi(h[i], h[i + HALF], c, s));
    }
    __syncwarp();  /* the next unit's norm overwrites h */
  }
}
`;
}

/**
 * The kernel of every kind, with `rope`'s inverse-frequency table and attention factor baked. Arguments:
 * (out, inp, rows = B·T, T, heads, pos0, outStride, inStride, rowPos (null, or a position per row)[, seqPos][, bias]); launch rows·HD/2 threads or fewer
 * (grid-stride loop).
 */
function ropeSource(name: string, backward: boolean, rope: RopeSpec, headDim: number, block: number, dt: RopeDtypes): string {
  const seq = dt.seqPos === true, bias = dt.bias ?? 'none', acc = backward && dt.acc !== false;
  const load = acc
    ? `y1[u] = ldf(inp, ei); y2[u] = ldf(inp, ei + HALF); o1[u] = ldf(out, eo); o2[u] = ldf(out, eo + HALF);`
    : `y1[u] = ldf(inp, ei); y2[u] = ldf(inp, ei + HALF);${bias === 'none' ? '' : ' y1[u] += ldf(bias, (h0 + u) * HD + i); y2[u] += ldf(bias, (h0 + u) * HD + i + HALF);'}`;
  // the backward rotates by (c, -s): Rᵀ dout = (y1 c + y2 s, y2 c - y1 s)
  const sn = backward ? '-s' : 's';
  const lo = `rope_lo(y1[u], y2[u], c, ${sn})`, hi = `rope_hi(y1[u], y2[u], c, ${sn})`;
  const store = acc
    ? `stf(out, eo, o1[u] + ${lo}); stf(out, eo + HALF, o2[u] + ${hi});`
    : `stf(out, eo, ${lo}); stf(out, eo + HALF, ${hi});`;
  return `${ropePrelude(name, rope, headDim, block)}
/* rows = B*T token rows of heads*HD elements, row r of out at r*outStride and of inp at r*inStride; row r has position ${seq ? 'seqPos[r / T]' : 'pos0'} + r % T,
   or rowPos[r] where rowPos is given (documents packed in a window: each row's position in its document). One thread per (row, pair i), all heads.
   out may alias inp (with equal strides).${bias === 'none' ? '' : ' bias[heads*HD] is added to every row before the rotation (in float, one rounding at the store).'} */
extern "C" __global__ void ${name}(${ctype(dt.out)}* out, const ${ctype(dt.inp)}* inp, long long rows, int T, int heads, int pos0, long long outStride,
                                   long long inStride, const int* __restrict__ rowPos${seq ? ', const int* seqPos' : ''}${bias === 'none' ? '' : `, const ${ctype(bias)}* bias`}) {
  long long total = rows * HALF;
  for (long long idx = (long long)blockIdx.x * BLOCK + threadIdx.x; idx < total; idx += (long long)gridDim.x * BLOCK) {
    int i = (int)(idx % HALF);
    long long row = idx / HALF;
    int t = (int)(row % T);
    float c, s;
    rope_cs(rowPos != nullptr ? rowPos[row] : ${seq ? 'seqPos[row / T]' : 'pos0'} + t, i, &c, &s);
    const long long bo = row * outStride + i, bi = row * inStride + i;
    for (int h0 = 0; h0 < heads; h0 += HU) {
      float y1[HU], y2[HU]${acc ? ', o1[HU], o2[HU]' : ''};
#pragma unroll
      for (int u = 0; u < HU; u++) {
        if (h0 + u < heads) { const long long ei = bi + (long long)(h0 + u) * HD${acc ? ', eo = bo + (long long)(h0 + u) * HD' : ''}; ${load} }
      }
#pragma unroll
      for (int u = 0; u < HU; u++) {
        if (h0 + u < heads) { const long long eo = bo + (long long)(h0 + u) * HD; ${store} }
      }
    }
  }
}
`;
}

const plainSource = (name: string, backward: boolean, p: Readonly<RopeP>): string =>
  ropeSource(name, backward, { type: 'default', theta: p.theta }, p.headDim, p.block, p);

export const ropeForward = defineFamily<RopeP>({
  name: 'rope_fwd', schema, example: { headDim: 64, theta: 1000000, out: 'bf16', inp: 'bf16', seqPos: false, bias: 'bf16', block: 256 },
  generate: (p) => plainSource('rope_fwd', false, p),
});

/** A kv family's parameters: the forward's, with the q/k norms' weight dtype ('none': no norms) and eps. */
type Kv<P> = P & { norm: string; eps: number };
/** A kv family's schema: the forward's, with `norm` and `eps`. */
function kvSchema<S>(s: S): S & { norm: typeof OPTIONAL_DTYPE_DOMAIN; eps: { kind: 'float'; min: 0 } } {
  return { ...s, norm: OPTIONAL_DTYPE_DOMAIN, eps: { kind: 'float', min: 0 } };
}

/**
 * Generation's rotation and KV-cache write from the fused q/k/v product (ropeKvSource; with q/k norms,
 * ropeKvNormSource): out = q's and the caches' dtype, inp = qkv's.
 */
export const ropeKvForward = defineFamily<Kv<RopeP>>({
  name: 'rope_kv_fwd', schema: kvSchema(schema),
  example: { headDim: 128, theta: 1000000, out: 'bf16', inp: 'bf16', seqPos: true, bias: 'none', norm: 'bf16', eps: 1e-6, block: 256 },
  generate: (p) => ropeKvSource('rope_kv_fwd', { type: 'default', theta: p.theta }, p.headDim, p.block, p),
});

/** dinp += Rᵀ dout, or with acc false dinp = Rᵀ dout (out = dinp, inp = dout in the generated signature). */
export const ropeBackward = defineFamily<Bwd<RopeP>>({
  name: 'rope_bwd', schema: backwardSchema(schema), example: { headDim: 64, theta: 1000000, out: 'f32', inp: 'bf16', seqPos: false, block: 256, acc: true },
  generate: (p) => plainSource('rope_bwd', true, { ...p, bias: 'none' }),
});

// ---- scaled kinds -------------------------------------------------------------------------------------------

type LinearP = { headDim: number; theta: number; factor: number; out: string; inp: string; seqPos: boolean; bias: string; block: number };
const linearSchema = { ...schema, factor: { kind: 'float', min: 1e-6 } } as const;
const linearRope = (p: Readonly<LinearP>): RopeSpec => ({ type: 'linear', theta: p.theta, factor: p.factor });

type Llama3P = {
  headDim: number; theta: number; factor: number; lowFreqFactor: number; highFreqFactor: number;
  originalMaxPositionEmbeddings: number; out: string; inp: string; seqPos: boolean; bias: string; block: number;
};
const llama3Schema = {
  ...schema, factor: { kind: 'float', min: 1e-6 }, lowFreqFactor: { kind: 'float', min: 1e-6 },
  highFreqFactor: { kind: 'float', min: 1e-6 }, originalMaxPositionEmbeddings: { kind: 'int', min: 1 },
} as const;
const llama3Rope = (p: Readonly<Llama3P>): RopeSpec => ({
  type: 'llama3', theta: p.theta, factor: p.factor, lowFreqFactor: p.lowFreqFactor, highFreqFactor: p.highFreqFactor,
  originalMaxPositionEmbeddings: p.originalMaxPositionEmbeddings,
});
// Llama 3.2 1B/3B: theta 500000, factor 32, low 1, high 4, original context 8192.
const llama3Example: Llama3P = {
  headDim: 64, theta: 500000, factor: 32, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192, out: 'bf16', inp: 'bf16', seqPos: false, bias: 'none', block: 256,
};

type YarnP = {
  headDim: number; theta: number; factor: number; originalMaxPositionEmbeddings: number; betaFast: number; betaSlow: number;
  attentionFactor: number; truncate: boolean; out: string; inp: string; seqPos: boolean; bias: string; block: number;
};
const yarnSchema = {
  ...schema, factor: { kind: 'float', min: 1e-6 }, originalMaxPositionEmbeddings: { kind: 'int', min: 1 },
  betaFast: { kind: 'float', min: 1e-6 }, betaSlow: { kind: 'float', min: 1e-6 }, attentionFactor: { kind: 'float', min: 1e-6 },
  truncate: { kind: 'bool' },
} as const;
const yarnRope = (p: Readonly<YarnP>): RopeSpec => ({
  type: 'yarn', theta: p.theta, factor: p.factor, originalMaxPositionEmbeddings: p.originalMaxPositionEmbeddings,
  betaFast: p.betaFast, betaSlow: p.betaSlow, attentionFactor: p.attentionFactor, truncate: p.truncate,
});
// Qwen2.5 long context (factor 4 over 32768). truncate false in the example so that every parameter moves the table
// (with truncation a small change of beta_slow can land on the same integer bound: same math, same kernel).
const yarnExample: YarnP = {
  headDim: 64, theta: 1000000, factor: 4, originalMaxPositionEmbeddings: 32768, betaFast: 32, betaSlow: 1,
  attentionFactor: yarnMscale(4), truncate: false, out: 'bf16', inp: 'bf16', seqPos: false, bias: 'f32', block: 256,
};

/** A scaled kind's three families: the forward, the backward and generation's rotation with the KV-cache write. */
function scaledFamilies<P extends ParamRecord & { headDim: number; out: string; inp: string; seqPos: boolean; bias: string; block: number }>(
  kind: string, s: Schema<P>, example: P,
  toRope: (p: Readonly<P>) => RopeSpec,
): [KernelFamily<P>, KernelFamily<Bwd<P>>, KernelFamily<Kv<P>>] {
  const fwd = defineFamily<P>({
    name: `rope_${kind}_fwd`, schema: s, example,
    generate: (p) => ropeSource(`rope_${kind}_fwd`, false, toRope(p), p.headDim, p.block, p),
  });
  const { bias: _bias, ...bwdExample } = example;
  const bwd = defineFamily<Bwd<P>>({
    name: `rope_${kind}_bwd`, schema: backwardSchema(s as Schema<P> & { bias: unknown }) as unknown as Schema<Bwd<P>>,
    example: { ...bwdExample, acc: true } as unknown as Bwd<P>,
    generate: (p) => ropeSource(`rope_${kind}_bwd`, true, toRope({ ...p, bias: 'none' } as unknown as P), p.headDim as number, p.block as number,
      { out: p.out as string, inp: p.inp as string, seqPos: p.seqPos as boolean, acc: p.acc as boolean }),
  });
  const kv = defineFamily<Kv<P>>({
    name: `rope_${kind}_kv_fwd`, schema: kvSchema(s) as unknown as Schema<Kv<P>>, example: { ...example, seqPos: true, norm: 'bf16', eps: 1e-6 },
    generate: (p) => ropeKvSource(`rope_${kind}_kv_fwd`, toRope(p), p.headDim, p.block, p),
  });
  return [fwd, bwd, kv];
}

export const [ropeLinearForward, ropeLinearBackward, ropeLinearKvForward] = scaledFamilies<LinearP>(
  'linear', linearSchema, { headDim: 64, theta: 10000, factor: 4, out: 'bf16', inp: 'bf16', seqPos: false, bias: 'none', block: 256 }, linearRope);
export const [ropeLlama3Forward, ropeLlama3Backward, ropeLlama3KvForward] = scaledFamilies<Llama3P>('llama3', llama3Schema, llama3Example, llama3Rope);
export const [ropeYarnForward, ropeYarnBackward, ropeYarnKvForward] = scaledFamilies<YarnP>('yarn', yarnSchema, yarnExample, yarnRope);

/** Which of a kind's families: the forward, the backward, or generation's rotation with the KV-cache write. */
type RopeMode = 'fwd' | 'bwd' | 'kv';

/** The spec of `mode`'s family of `rope`'s kind, with the kind's parameters and `common` (dtypes, seqPos, bias or acc, block). */
function kindSpec(mode: RopeMode, rope: RopeSpec, headDim: number, common: Record<string, string | number | boolean>): KernelSpec {
  const pick = <A, B, K>(fams: [KernelFamily<A & ParamRecord>, KernelFamily<B & ParamRecord>, KernelFamily<K & ParamRecord>], p: Record<string, unknown>): KernelSpec =>
    mode === 'bwd' ? fams[1].make(p as B & ParamRecord) : mode === 'fwd' ? fams[0].make(p as A & ParamRecord) : fams[2].make(p as K & ParamRecord);
  const base = { headDim, theta: rope.theta, ...common };
  switch (rope.type) {
    case 'default':
      return pick([ropeForward, ropeBackward, ropeKvForward], base);
    case 'linear':
      return pick([ropeLinearForward, ropeLinearBackward, ropeLinearKvForward], { ...base, factor: rope.factor });
    case 'llama3':
      return pick([ropeLlama3Forward, ropeLlama3Backward, ropeLlama3KvForward], {
        ...base, factor: rope.factor, lowFreqFactor: rope.lowFreqFactor, highFreqFactor: rope.highFreqFactor,
        originalMaxPositionEmbeddings: rope.originalMaxPositionEmbeddings,
      });
    case 'yarn':
      return pick([ropeYarnForward, ropeYarnBackward, ropeYarnKvForward], {
        ...base, factor: rope.factor, originalMaxPositionEmbeddings: rope.originalMaxPositionEmbeddings,
        betaFast: rope.betaFast, betaSlow: rope.betaSlow, attentionFactor: rope.attentionFactor, truncate: rope.truncate,
      });
  }
}

/**
 * The kernel spec that rotates (forward) or back-propagates (backward) with this RoPE. `dt`: the dtypes of out and inp
 * (default both f32); a backward accumulates into out unless `dt.acc` is false.
 */
export function ropeKernel(backward: boolean, rope: RopeSpec, headDim: number, block: number,
  dt: RopeDtypes = { out: 'f32', inp: 'f32' }): KernelSpec {
  const { out, inp } = dt, seqPos = dt.seqPos === true, bias = dt.bias ?? 'none', acc = dt.acc !== false;
  if (backward && bias !== 'none') throw new Error('rope: a bias is added in the forward only');
  if (!backward && dt.acc !== undefined) throw new Error('rope: the forward overwrites its output (acc is a backward parameter)');
  return backward ? kindSpec('bwd', rope, headDim, { out, inp, seqPos, block, acc }) : kindSpec('fwd', rope, headDim, { out, inp, seqPos, bias, block });
}

/**
 * The kernel spec of generation's rotation and KV-cache write (ropeKvSource) with this RoPE: `dt.out` the dtype of q and
 * the caches, `dt.inp` the fused product's, `dt.bias` the joined q/k/v bias's (or 'none'), `dt.seqPos` per-sequence
 * positions, `dt.norm` the q/k norm weights' (or 'none') with `dt.eps`.
 */
export function ropeKvKernel(rope: RopeSpec, headDim: number, block: number, dt: RopeKvDtypes): KernelSpec {
  if (dt.acc !== undefined) throw new Error('rope: the forward overwrites its output (acc is a backward parameter)');
  // eps only where there are norms (no two keys for one kernel)
  return kindSpec('kv', rope, headDim, { out: dt.out, inp: dt.inp, seqPos: dt.seqPos === true, bias: dt.bias ?? 'none', norm: dt.norm, eps: dt.norm === 'none' ? 0 : dt.eps, block });
}
