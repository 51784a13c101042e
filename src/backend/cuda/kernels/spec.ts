/**
 * Kernel specs: the typed description of one generated CUDA kernel.
 *
 * A kernel FAMILY (rmsnorm forward, rope backward, the fused loss, ...) declares a schema of BAKED parameters
 * (every value that is compiled into the kernel as a literal: eps, theta, headDim, C, block size, loss kind...)
 * and a generator that turns one parameter record into CUDA C. A SPEC is a family plus one parameter record.
 *
 * Correctness by construction:
 * - `source()` is a pure function of (family, params); the kernel cache keys on a hash of that source (plus
 *   compile options, arch, NVRTC version and build), never on a hand-typed string, so two specs that differ in any
 *   baked parameter cannot share a cache entry.
 * - Every generated source starts with a header comment listing ALL declared parameters, so even a parameter a
 *   generator forgot to use still changes the key (over-keying is safe; under-keying served eps 1e-5 for 1e-6).
 * - The schema is what the mutation test iterates over; `make()` rejects records with undeclared or missing keys.
 */

export type ParamValue = number | string | boolean;
export type ParamRecord = Record<string, ParamValue>;

/** The domain of one baked parameter: used to validate records and, in tests, to derive a mutated value. */
export type ParamDomain =
  | { kind: 'int'; min: number; max?: number; step?: number }
  | { kind: 'pow2'; min: number; max: number }
  | { kind: 'float'; min?: number; max?: number }
  | { kind: 'enum'; values: readonly string[] }
  | { kind: 'bool' };

export type Schema<P extends ParamRecord> = { readonly [K in keyof P]: ParamDomain };

export interface KernelSpec<P extends ParamRecord = ParamRecord> {
  /** Family name, e.g. 'rmsnorm_fwd'. Also the `extern "C"` entry point of the generated module. */
  readonly family: string;
  readonly entry: string;
  readonly params: Readonly<P>;
  /** Canonical identity: family + every declared param in schema order. Used only to memoize spec objects. */
  readonly id: string;
  /** Generated CUDA C (memoized). */
  source(): string;
  /** `rmsnorm_fwd eps=1e-6 C=896 block=256`: how diagnostics name a kernel. */
  describe(): string;
}

export interface KernelFamily<P extends ParamRecord> {
  readonly name: string;
  readonly schema: Schema<P>;
  /** A representative parameter record (compile gate, mutation test). */
  readonly example: P;
  make(p: P): KernelSpec<P>;
}

/** A float literal that round-trips the float32 value exactly (and is valid C: always has '.', 'e' or both). */
export function f32(v: number): string {
  if (!Number.isFinite(v)) throw new Error(`kernel parameter must be finite, got ${v}`);
  const x = Math.fround(v);
  let s = String(x);
  if (!/[.eE]/.test(s)) s += '.0';
  return `${s}f`;
}

/** A double literal (exact JS value). */
export function f64(v: number): string {
  if (!Number.isFinite(v)) throw new Error(`kernel parameter must be finite, got ${v}`);
  let s = String(v);
  if (!/[.eE]/.test(s)) s += '.0';
  return s;
}

function checkValue(family: string, key: string, d: ParamDomain, v: unknown): void {
  const bad = (why: string): never => { throw new Error(`kernel ${family}: parameter ${key}=${String(v)} ${why}`); };
  switch (d.kind) {
    case 'int':
      if (typeof v !== 'number' || !Number.isInteger(v)) bad('must be an integer');
      if ((v as number) < d.min || (d.max !== undefined && (v as number) > d.max)) bad(`must be in [${d.min}, ${d.max ?? '∞'}]`);
      if (d.step !== undefined && (v as number) % d.step !== 0) bad(`must be a multiple of ${d.step}`);
      break;
    case 'pow2':
      if (typeof v !== 'number' || !Number.isInteger(v) || (v & (v - 1)) !== 0) bad('must be a power of two');
      if ((v as number) < d.min || (v as number) > d.max) bad(`must be in [${d.min}, ${d.max}]`);
      break;
    case 'float':
      if (typeof v !== 'number' || !Number.isFinite(v)) bad('must be a finite number');
      if ((d.min !== undefined && (v as number) < d.min) || (d.max !== undefined && (v as number) > d.max)) {
        bad(`must be in [${d.min ?? '-∞'}, ${d.max ?? '∞'}]`);
      }
      break;
    case 'enum':
      if (typeof v !== 'string' || !d.values.includes(v)) bad(`must be one of ${d.values.join(', ')}`);
      break;
    case 'bool':
      if (typeof v !== 'boolean') bad('must be a boolean');
      break;
  }
}

function formatValue(v: ParamValue): string {
  return typeof v === 'number' ? String(v) : typeof v === 'boolean' ? (v ? 'true' : 'false') : v;
}

/**
 * Declares a kernel family. `generate(p)` returns the kernel body (without the parameter header); the entry
 * point must be `extern "C" __global__ void <name>(...)`.
 */
export function defineFamily<P extends ParamRecord>(def: {
  name: string;
  schema: Schema<P>;
  example: P;
  generate: (p: Readonly<P>) => string;
}): KernelFamily<P> {
  const keys = Object.keys(def.schema) as Array<keyof P & string>;
  const memo = new Map<string, KernelSpec<P>>();
  const make = (p: P): KernelSpec<P> => {
    for (const k of Object.keys(p)) {
      if (!(k in def.schema)) throw new Error(`kernel ${def.name}: undeclared parameter ${k}`);
    }
    const parts: string[] = [];
    for (const k of keys) {
      if (!(k in p)) throw new Error(`kernel ${def.name}: missing parameter ${k}`);
      checkValue(def.name, k, def.schema[k], p[k]);
      parts.push(`${k}=${formatValue(p[k])}`);
    }
    const id = `${def.name} ${parts.join(' ')}`;
    const hit = memo.get(id);
    if (hit) return hit;
    const params = Object.freeze({ ...p });
    let src: string | undefined;
    const spec: KernelSpec<P> = {
      family: def.name,
      entry: def.name,
      params,
      id,
      source() {
        if (src === undefined) {
          src = `// distillery kernel ${def.name}\n// params: ${parts.join(' ')}\n${def.generate(params)}`;
        }
        return src;
      },
      describe: () => id,
    };
    memo.set(id, spec);
    return spec;
  };
  return { name: def.name, schema: def.schema, example: def.example, make };
}

/** Device helpers shared by the generated kernels; BLOCK must be #defined (a multiple of 32) before use. */
export function reductionHelpers(): string {
  return `
#define NEG_INF __int_as_float(0xff800000)
__device__ __forceinline__ float warpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warpSumD(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/* Every thread of the block gets the sum. Safe to call repeatedly (leading barrier protects the scratch). */
__device__ float blockSum(float v) {
  __shared__ float sh[BLOCK / 32];
  v = warpSum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = 0.0f;
  for (int i = 0; i < BLOCK / 32; i++) r += sh[i];
  return r;
}
__device__ double blockSumD(double v) {
  __shared__ double shd[BLOCK / 32];
  v = warpSumD(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) shd[threadIdx.x >> 5] = v;
  __syncthreads();
  double r = 0.0;
  for (int i = 0; i < BLOCK / 32; i++) r += shd[i];
  return r;
}
__device__ float blockMax(float v) {
  __shared__ float shm[BLOCK / 32];
  v = warpMax(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) shm[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = shm[0];
  for (int i = 1; i < BLOCK / 32; i++) r = fmaxf(r, shm[i]);
  return r;
}
/* Block argmax; ties go to the lowest index (matches a left-to-right scan with strict >). */
__device__ int blockArgMax(float v, int idx) {
  __shared__ float sv[BLOCK / 32];
  __shared__ int si[BLOCK / 32];
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) { sv[threadIdx.x >> 5] = v; si[threadIdx.x >> 5] = idx; }
  __syncthreads();
  float bv = sv[0];
  int bi = si[0];
  for (int i = 1; i < BLOCK / 32; i++) {
    if (sv[i] > bv || (sv[i] == bv && si[i] < bi)) { bv = sv[i]; bi = si[i]; }
  }
  return bi;
}
`;
}

/** Number of blocks for a grid-stride loop over n elements (capped; the loop covers the rest). */
export function blocksFor(n: number, block: number, cap = 65535 * 8): number {
  return Math.max(1, Math.min(cap, Math.ceil(n / block)));
}

export const BLOCK_DOMAIN: ParamDomain = { kind: 'pow2', min: 32, max: 1024 };

/** The domain of a baked operand dtype: a kernel is generated (and keyed) per dtype of each float operand. */
export const DTYPE_DOMAIN: ParamDomain = { kind: 'enum', values: ['f32', 'bf16'] };
/** The domain of an optional operand's baked dtype: 'none' (the kernel has no such operand) or its dtype. */
export const OPTIONAL_DTYPE_DOMAIN = { kind: 'enum', values: ['none', 'f32', 'bf16'] } as const;

/** The C element type of a float operand of `dtype` ('bf16' is the storage type dtypeHelpers() declares). */
export function ctype(dtype: string): string {
  if (dtype === 'f32') return 'float';
  if (dtype === 'bf16') return 'bf16';
  throw new Error(`unknown operand dtype ${dtype}`);
}

/**
 * Device helpers for mixed-precision operands, with no header (NVRTC has none by default): `bf16` is the storage
 * type (the top 16 bits of a float32), `ldf(p, i)` reads element i of a float or bf16 array as float, `stf(p, i, v)`
 * stores v, rounding to nearest even into bf16 (PTX cvt.rn.bf16.f32, sm_80+), and `pack2(lo, hi)` packs two floats
 * into a bf16x2 register (lo in the low half) for mma operands. Kernels pick operand types with typedefs from
 * ctype(), so the dtype is in the source and therefore in the cache key.
 */
export function dtypeHelpers(): string {
  return `
typedef unsigned short bf16;
__device__ __forceinline__ float bf2f(bf16 h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ bf16 f2bf(float f) { unsigned short r; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f)); return r; }
__device__ __forceinline__ float ldf(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float ldf(const bf16* p, long long i) { return bf2f(p[i]); }
__device__ __forceinline__ void stf(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void stf(bf16* p, long long i, float v) { p[i] = f2bf(v); }
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  unsigned r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}
`;
}

/**
 * ld8(p, j8, o): the 8 consecutive elements [8·j8, 8·j8 + 8) of a float or bf16 array as floats, with 16-byte loads (p
 * 16-byte aligned). For row kernels that read whole rows a vector at a time (the loss kernels' ROW_HELPERS,
 * attention_bwd_pre); after dtypeHelpers().
 */
export const LD8_HELPERS = `__device__ __forceinline__ void ld8(const float* p, int j8, float* o) {
  const float4 a = ((const float4*)p)[2 * j8], b = ((const float4*)p)[2 * j8 + 1];
  o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w; o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
}
__device__ __forceinline__ void ld8(const bf16* p, int j8, float* o) {
  const uint4 u = ((const uint4*)p)[j8];
  const unsigned w[4] = { u.x, u.y, u.z, u.w };
#pragma unroll
  for (int e = 0; e < 4; e++) { o[2 * e] = __uint_as_float(w[e] << 16); o[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u); }
}
`;
